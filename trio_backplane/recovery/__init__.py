"""Recovery after a crash: fence the old incarnation, classify what may have happened.

``recover(record, *, incarnation)`` is pure: it reads a stored run and says,
for every outstanding execution intent (effect), whether it is safe to
*withdraw* (cancel without reconciliation) and whether it is safe to
*resume* (run it again).  The two are never confused:

* withdraw is safe for any effect whose ``dispatch_state`` is
  ``"not_dispatched"``;
* resume is safe only for a ``"read_only"`` or ``"idempotent"`` effect that is
  ``"not_dispatched"``;
* a ``"dispatched"`` or ``"unknown"`` mutation (or an effect of unknown
  class) is never safe and is listed in ``uncertain_effects``;
* an effect a cleanup settled as ``"uncertain"`` reads ``"unknown"``,
  whatever its intent recorded when it was published (a ``dispatch_state``
  is what the executor knew then: nothing updates it once the effect is
  dispatched), so it is never safe either.

Outstanding work that is not an effect (unsettled children, dependencies
and the wait on them) is reported as ``unsettled``
(``kernel.cleanup_requirements``): a host must settle it too.

Which intents are reported: only outstanding ones, that is intents whose
status is ``"started"`` (published, never settled) or ``"uncertain"``
(settled as uncertain by a cleanup).  ``"consumed"`` and ``"cancelled"``
intents are settled; they are history, not work, and are not reported.

An interrupted provider attempt (a ``"provider"`` intent still outstanding)
is read-only: nothing in the world depends on it, so the host may discard it
after a confirmed cleanup (``EffectReport.discardable``); it is still never
safe to *resume* unless it is known not to have been dispatched.

:func:`settle_run` acts on the classification: it fences the stored
incarnation and commits the run's outcome (``cancelled`` when nothing in
flight may have changed the world, else ``unknown_outcome`` with evidence),
and :func:`replacement_for` says what a continuation of a run settled with
nothing in flight carries.  Nothing is ever replayed.

``trio_backplane.testing.RecoveryHarness`` simulates such a crash against
a real store, for tests.
"""

from .._public import fixup_module_metadata
from ._report import DISPATCH_STATES, EFFECT_CLASSES, EffectReport, RecoveryReport, recover
from ._takeover import Replacement, Settled, replacement_for, settle_run

__all__ = [
    "DISPATCH_STATES",
    "EFFECT_CLASSES",
    "EffectReport",
    "RecoveryReport",
    "Replacement",
    "Settled",
    "recover",
    "replacement_for",
    "settle_run",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

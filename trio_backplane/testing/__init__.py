"""Helpers shipped for hosts' own test suites.

``StoreConformance`` is the durable store conformance suite: subclass it as
``class TestMyStore(StoreConformance)`` and provide its factory hooks.
``RecoveryHarness`` crashes an executor against a store and recovers.
"""

from .._public import fixup_module_metadata
from ._conformance import STO_11_CHECKS, StoreConformance
from ._faults import FaultyStore
from ._recovery import CRASH_WINDOWS, CrashReport, RecoveryHarness
from ._scripted import Hang, Raise, ScriptedProvider, Sleep

__all__ = [
    "CRASH_WINDOWS",
    "STO_11_CHECKS",
    "CrashReport",
    "FaultyStore",
    "Hang",
    "Raise",
    "RecoveryHarness",
    "ScriptedProvider",
    "Sleep",
    "StoreConformance",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

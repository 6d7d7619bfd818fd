"""A web console over a store: runs, transcripts, live events, and the
pending approvals answered in the browser.

``Console(store, answer=...)`` is an ASGI application; :func:`serve` runs
it on Hypercorn's Trio worker, on loopback unless told otherwise; the
command line's ``backplane console --db STORE_URL`` does both.  Needs the
``console`` extra; the guide is ``docs/guides/console.rst``.
"""

try:  # first: a missing extra is reported by name
    import hypercorn as _hypercorn
    import jinja2 as _jinja2
    import starlette as _starlette
except ModuleNotFoundError as _missing:  # pragma: no cover - depends on the install
    raise ModuleNotFoundError(
        f"trio_backplane.console needs the 'console' extra"
        f" (pip install -e '.[console]' in a checkout): {_missing}",
        name=_missing.name,
    ) from _missing
# isort: split

from .._public import fixup_module_metadata
from ._answers import Answerer, FleetAnswers, LocalAnswers
from ._app import Console
from ._serve import serve

__all__ = ["Answerer", "Console", "FleetAnswers", "LocalAnswers", "serve"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata, _hypercorn, _jinja2, _starlette

"""A provider for Anthropic's Messages API, streaming, on ``httpx``.

``AnthropicProvider(model)`` implements the provider protocol:
``stream(request, context)`` posts ``/v1/messages`` with ``stream: true``
and turns the server-sent events into provider events, ending in one
``ResponseCompleted`` or ``ResponseFailed`` whose error is classed.  Needs
the ``anthropic`` extra; the guide is ``docs/guides/anthropic.rst``.
"""

try:  # first: a missing extra is reported by name, whichever module needs it
    import httpx as _httpx
except ModuleNotFoundError as _missing:  # pragma: no cover - depends on the install
    from .. import _missing_extra

    raise _missing_extra("anthropic", _missing) from _missing
# isort: split

from ..._public import fixup_module_metadata
from ._provider import ANTHROPIC_VERSION, AnthropicProvider

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata, _httpx

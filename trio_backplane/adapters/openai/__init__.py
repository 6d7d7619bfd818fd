"""An OpenAI-compatible chat-completions provider, streaming, on ``httpx``.

``OpenAIProvider(base_url, model)`` implements the provider protocol:
``stream(request, context)`` posts ``/chat/completions`` with ``stream: true``
and turns the server-sent chunks into provider events, ending in one
``ResponseCompleted`` or ``ResponseFailed`` whose error is classed.  Needs the
``openai`` extra; the guide is ``docs/guides/openai.rst``.
"""

try:  # first: a missing extra is reported by name, whichever module needs it
    import httpx as _httpx
except ModuleNotFoundError as _missing:  # pragma: no cover - depends on the install
    from .. import _missing_extra

    raise _missing_extra("openai", _missing) from _missing
# isort: split

from ..._public import fixup_module_metadata
from .._http._aliases import OPENAI_NAME, ToolAliases
from ._provider import OpenAIProvider
from ._transcript import transcript_messages

__all__ = ["OPENAI_NAME", "OpenAIProvider", "ToolAliases", "transcript_messages"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata, _httpx

"""Real adapters at the edge: MCP servers as tool sources, OpenAI-compatible providers.

The adapters import everything below them; nothing imports them.  Each
lives in its own module and needs its optional extra: ``trio_backplane.adapters.mcp``
(``pip install trio_backplane[mcp]``) and ``trio_backplane.adapters.openai``
(``pip install trio_backplane[openai]``).  This package imports neither, so
importing one adapter never requires the other's dependencies.
"""

__all__: list[str] = []

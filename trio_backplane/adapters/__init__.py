"""Real adapters at the edge: MCP servers as tool sources, OpenAI-compatible
and Anthropic Messages providers.

The adapters import everything below them; nothing imports them.  Each
lives in its own package and needs its optional extra: ``trio_backplane.adapters.mcp``
(``pip install trio_backplane[mcp]``), ``trio_backplane.adapters.openai``
(``[openai]``) and ``trio_backplane.adapters.anthropic`` (``[anthropic]``).
This package imports none, so importing one adapter never requires another's
dependencies; the two providers share the private ``_http``.
"""

__all__: list[str] = []


def _missing_extra(adapter: str, missing: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error an adapter whose extra is not installed raises on import:
    it names the extra to install, not only the module that is missing."""
    return ModuleNotFoundError(
        f"trio_backplane.adapters.{adapter} needs the {adapter!r} extra"
        f" (pip install -e '.[{adapter}]' in a checkout): {missing}",
        name=missing.name,
    )

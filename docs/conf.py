"""Sphinx configuration: the trio_backplane documentation (autodoc, reST).

Build it with ``python3 -m nox -s docs`` (HTML in ``docs/_build/html``).
Warnings are errors there; there is no intersphinx (the build is offline).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

# The checkout's package, whether or not it is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trio_backplane import __version__
from trio_backplane._public import NoPublicConstructor

project = "trio_backplane"
author = "the trio_backplane developers"
copyright = "the trio_backplane developers"
version = release = __version__

extensions = ["sphinx.ext.autodoc"]
exclude_patterns = ["_build", "notes"]
root_doc = "index"
pygments_style = "default"
html_theme = "alabaster"
html_title = f"trio_backplane {release}"

autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"


#: Classes only the library constructs, whose constructor is no public API.
_LIBRARY_MADE = frozenset({"trio_backplane.ToolContext", "trio_backplane.schema.CompiledSchema"})


def _no_constructor_signature(  # noqa: PLR0917 - Sphinx's event signature
    app: Any,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str, str | None] | None:
    """A class only the library constructs (``Conversation``,
    ``ToolContext``) or a protocol shows no constructor signature."""
    if what == "class" and (
        isinstance(obj, NoPublicConstructor)  # calling the class raises TypeError
        or name in _LIBRARY_MADE
        or getattr(obj, "_is_protocol", False)
    ):
        return "", None
    return None


def _no_type_docstring(  # noqa: PLR0917 - Sphinx's event signature
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """A constant without a docstring of its own (``frozenset()``, an ``int``)
    shows none, not its type's."""
    if what not in ("data", "attribute"):
        return
    inherited = inspect.getdoc(type(obj))
    if inherited and " ".join(" ".join(lines).split()) == " ".join(inherited.split()):
        lines[:] = []


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _no_constructor_signature)
    app.connect("autodoc-process-docstring", _no_type_docstring)

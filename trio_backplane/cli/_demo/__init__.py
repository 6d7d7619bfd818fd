"""``backplane demo``: one whole conversation with three real tools (one
behind an approval) and a scripted model, on SQLite."""

from ._command import add_parser, new_run_id
from ._model import NOTE_TITLE, PROMPT, DemoProvider
from ._tools import GLOSSARY, ReadPackageFile, SearchGlossary, WriteNote, registry

__all__ = [
    "GLOSSARY",
    "NOTE_TITLE",
    "PROMPT",
    "DemoProvider",
    "ReadPackageFile",
    "SearchGlossary",
    "WriteNote",
    "add_parser",
    "new_run_id",
    "registry",
]

"""Check that every behaviour of a BEHAVIOURS.md has a test citing its ID.

    python scripts/spec_coverage.py PATH/TO/BEHAVIOURS.md

The spec is not part of the repository, so its path is always named: nothing
here looks for it.  A citation counts only in a test's name or docstring (a
``test_*`` function or method, or a ``Test*`` class, under ``tests/`` or
``conformance/``): ``SCH-07`` in a docstring, or ``sch_07`` in a name.  A
comment or a helper naming an ID does not count.  Withdrawn items are exempt;
so are the groups whose heading names the later issue that builds them
(``(the child agents issue)``): they are listed as pending, not failed.

Exit status 0 when every required ID is cited, 1 otherwise (the missing IDs
on stdout), 2 for a bad invocation.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ITEM = re.compile(r"^- \*\*([A-Z]+-\d+)\*\*(.*)$")


def behaviours(text: str) -> tuple[list[str], list[str]]:
    """``(required, pending)`` IDs of a BEHAVIOURS.md, in document order."""
    required: list[str] = []
    pending: list[str] = []
    later = False
    for line in text.splitlines():
        if line.startswith("## "):
            later = bool(re.search(r"\bissue\)", line)) or "deferred" in line
            continue
        match = ITEM.match(line)
        if match and "*withdrawn*" not in match.group(2)[:20]:
            (pending if later else required).append(match.group(1))
    return required, pending


def citations(folders: list[Path]) -> Iterator[str]:
    """The name and docstring of every test function, method and class."""
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    is_test = node.name.startswith("test")
                elif isinstance(node, ast.ClassDef):
                    is_test = node.name.startswith("Test")
                else:
                    continue
                if is_test:
                    yield node.name
                    yield ast.get_docstring(node) or ""


def cited(identifier: str, corpus: str) -> bool:
    snake = identifier.lower().replace("-", "_")
    return bool(re.search(rf"(?<![A-Z]){re.escape(identifier)}(?!\d)", corpus)) or bool(
        re.search(rf"(?<![a-z]){re.escape(snake)}(?!\d)", corpus)
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        print("error: name the spec's BEHAVIOURS.md (a file that exists)", file=sys.stderr)
        return 2
    required, pending = behaviours(Path(argv[0]).read_text(encoding="utf-8"))
    corpus = "\n".join(citations([REPO / "tests", REPO / "conformance"]))
    missing = [i for i in required if not cited(i, corpus)]
    print(f"{len(required) - len(missing)} of {len(required)} behaviours cited by a test")
    if pending:
        done = sum(cited(i, corpus) for i in pending)
        print(f"pending (a later issue builds them): {done} of {len(pending)} cited")
    if missing:
        print("not cited by any test's name or docstring: " + ", ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Every code example in ``docs/`` runs, and prints what the docs show.

Conventions of the ``.rst`` sources (``docs/**/*.rst``):

* A ``.. code-block:: python`` block is a script.  It runs on its own with
  ``sys.executable``, in a fresh empty directory, with the repository root on
  ``PYTHONPATH``, within ``TIMEOUT`` seconds, and must exit with status 0.
  A ``DeprecationWarning`` from ``trio_backplane`` is an error there: the
  examples import nothing through a deprecated path.
* Its expected standard output is the ``.. code-block:: text`` block that
  immediately follows it (only blank lines between): the script must print
  exactly that.  A python block that no text block follows must print
  nothing at all, so a block whose output the docs do not show fails.
* A python block with a ``:caption:`` naming a ``.py`` file (``:caption:
  server.py``) is a module, not a script: it is written under that name
  into the directory of every later python block of the same page (an MCP
  server the next example starts, say) and is not run by itself.
* A block whose source names ``TRIO_BACKPLANE_PG_DSN`` needs PostgreSQL: it
  runs with that environment variable (a DSN) as set for the test session.
  Without it the block is skipped, or fails when ``CI`` is set (``nox -s
  tests`` sets both).
* A ``.. code-block:: console`` block with ``:class: checked`` is a shell
  session that runs, in a fresh empty directory: ``$ cat NAME`` writes the
  lines that follow it (up to the next ``$``) to ``NAME``, and ``$ backplane
  ARGS`` runs the command line (``python -m trio_backplane.cli ARGS``), which
  must exit with status 0 and print exactly the lines that follow it.
  Other commands are refused: a checked block says only what runs.
* Other ``console`` blocks, and other blocks, are not run.

The API reference itself is checked against the public surface in
``tests/test_public_api.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.store.postgres_fixture import DSN_VARIABLE, unavailable

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TIMEOUT = 120.0
PG_DSN = DSN_VARIABLE

_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. code-block::[ \t]*(?P<language>\S*)[ \t]*$")
_OPTION = re.compile(r"^:(?P<name>[\w-]+):[ \t]*(?P<value>.*)$")


@dataclass
class Block:
    """One ``code-block`` of a page: its language, options, text and line."""

    page: Path
    line: int
    language: str
    options: dict[str, str]
    text: str
    end: int  # index of the first line after the block


@dataclass
class Example:
    """A python script block and what it must print (``None``: nothing)."""

    block: Block
    expected: str | None
    modules: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.block.page.relative_to(DOCS)}:{self.block.line}"


def parse_blocks(page: Path) -> list[Block]:
    """Every ``.. code-block::`` of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        match = _DIRECTIVE.match(lines[index])
        if match is None:
            index += 1
            continue
        indent = len(match["indent"])
        start = index
        index += 1
        options: dict[str, str] = {}
        while index < len(lines):
            option = _OPTION.match(lines[index].strip())
            if option is None or not lines[index].strip():
                break
            options[option["name"]] = option["value"].strip()
            index += 1
        body: list[str] = []
        while index < len(lines):
            line = lines[index]
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            body.append(line)
            index += 1
        while body and not body[-1].strip():
            body.pop()
            index -= 1
        text = textwrap.dedent("\n".join(body)).strip("\n")
        blocks.append(Block(page, start + 1, match["language"], options, text, index))
    return blocks


def _follows(page_lines: list[str], block: Block, following: Block) -> bool:
    """Whether ``following`` starts right after ``block`` (blank lines only)."""
    between = page_lines[block.end : following.line - 1]
    return all(not line.strip() for line in between)


def collect_examples() -> tuple[list[Example], list[str]]:
    """The python script blocks of every page, with their expected output,
    and the module blocks no later script of their page uses."""
    examples: list[Example] = []
    unused: list[str] = []
    for page in sorted(DOCS.rglob("*.rst")):
        if "_build" in page.parts:
            continue
        page_lines = page.read_text(encoding="utf-8").splitlines()
        blocks = parse_blocks(page)
        modules: dict[str, str] = {}
        waiting: list[str] = []
        for position, block in enumerate(blocks):
            if block.language != "python":
                continue
            caption = block.options.get("caption", "")
            if caption.endswith(".py"):
                modules[caption] = block.text + "\n"
                waiting.append(f"{page.relative_to(DOCS)}:{block.line}")
                continue
            waiting.clear()
            expected: str | None = None
            if position + 1 < len(blocks):
                following = blocks[position + 1]
                if following.language == "text" and _follows(page_lines, block, following):
                    expected = following.text
            examples.append(Example(block, expected, dict(modules)))
        unused.extend(waiting)
    return examples, unused


EXAMPLES, UNUSED_MODULES = collect_examples()


def collect_sessions() -> list[Block]:
    """Every ``console`` block marked ``:class: checked``."""
    return [
        block
        for page in sorted(DOCS.rglob("*.rst"))
        if "_build" not in page.parts
        for block in parse_blocks(page)
        if block.language == "console" and block.options.get("class") == "checked"
    ]


SESSIONS = collect_sessions()


def session_steps(text: str) -> list[tuple[list[str], list[str]]]:
    """A session's commands (split as a shell would) and the lines after each."""
    steps: list[tuple[list[str], list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((shlex.split(line[2:]), []))
        else:
            assert steps, f"a line before the session's first command: {line!r}"
            steps[-1][1].append(line.rstrip())
    return steps


def test_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 10
    assert UNUSED_MODULES == [], "module blocks that no later example of their page runs"


def _run(argv: list[str], where: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``where`` with ``env``, no input, its output captured."""
    return subprocess.run(
        argv,
        cwd=where,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_docs_have_checked_sessions() -> None:
    """The command line guide's examples that print the same on every
    machine run as written."""
    assert {block.page.name for block in SESSIONS} >= {"cli.rst"}


@pytest.mark.parametrize(
    "block", SESSIONS, ids=[f"{block.page.relative_to(DOCS)}:{block.line}" for block in SESSIONS]
)
def test_console_session(block: Block, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "200"}
    for argv, lines in session_steps(block.text):
        if argv[:1] == ["cat"] and len(argv) == 2:
            (tmp_path / argv[1]).write_text("\n".join(lines) + "\n", encoding="utf-8")
            continue
        assert argv[:1] == ["backplane"], f"a checked session runs cat and backplane only: {argv}"
        result = _run([sys.executable, "-m", "trio_backplane.cli", *argv[1:]], tmp_path, env)
        assert result.returncode == 0, f"exit status {result.returncode}\n{result.stderr}"
        printed = [line.rstrip() for line in result.stdout.rstrip("\n").splitlines()]
        assert printed == lines, result.stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.id for example in EXAMPLES])
def test_example(example: Example, tmp_path: Path) -> None:
    env = dict(os.environ)
    if PG_DSN in example.block.text and not env.get(PG_DSN):
        unavailable(f"{PG_DSN} is not set: this example needs PostgreSQL")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env["PYTHONWARNINGS"] = "error:trio_backplane.:DeprecationWarning"
    env.pop("PYTHONSTARTUP", None)
    for name, text in example.modules.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    script = tmp_path / "example.py"
    script.write_text(example.block.text + "\n", encoding="utf-8")
    result = _run([sys.executable, str(script)], tmp_path, env)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stderr}"
    if example.expected is None:
        assert result.stdout == "", (
            "this example prints, but no `.. code-block:: text` follows it to show what\n"
            + result.stdout
        )
    else:
        assert result.stdout.rstrip("\n").splitlines() == example.expected.splitlines(), (
            result.stderr
        )

"""The public surface: API.md's names, importable where it says and from
``trio_backplane`` itself ("Everything public is importable from
``trio_backplane``")."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import trio_backplane

from .conftest import SHARED

API = SHARED / "API.md"
SUBPACKAGES = ("errors", "schema", "tools", "kernel", "store", "recovery", "runtime", "testing")


def _api_names() -> list[tuple[str, str]]:
    """``(module, name)`` for each name a code block of API.md declares at
    the start of a line (a class, function or constant), in the module its
    section names (``trio_backplane`` when it names none).  Lines that call
    a method on a value (``attrs.evolve(...)``, ``operation.context...``)
    declare nothing, nor does a host's example subclass."""
    text = API.read_text()
    found: list[tuple[str, str]] = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        heading = section.splitlines()[0]
        named = re.search(r"\(`(trio_backplane[\w.]*)`\)", heading)
        module = named.group(1) if named else "trio_backplane"
        for block in re.findall(r"```python\n(.*?)```", section, re.S):
            for raw in block.splitlines():
                if re.match(r"class \w+\(trio_backplane\.", raw):
                    continue  # a host's subclass, shown as an example
                line = re.sub(r"^(class |async with |async def |def |await )", "", raw)
                match = re.match(r"([A-Za-z_]\w*)(\(| *=| *:|$)", line)
                if match and not line.startswith(("from ", "import ")):
                    found.append((module, match.group(1)))
    return found


def test_api_md_declares_names() -> None:
    """The parser finds API.md's declarations (a guard against a silent no-op)."""
    names = {name for _, name in _api_names()}
    assert {"open_conversation", "RunRecord", "SQLiteStore", "Error", "compile"} <= names
    assert len(names) > 40


@pytest.mark.parametrize(("module", "name"), sorted(set(_api_names())))
def test_api_md_name_is_importable_from_its_module_and_the_package(module: str, name: str) -> None:
    """Each name of API.md imports from the module its section names and from
    ``trio_backplane``, as the same object."""
    owner = importlib.import_module(module)
    assert hasattr(owner, name), f"{module}.{name} is missing"
    assert getattr(trio_backplane, name, None) is getattr(owner, name), (
        f"trio_backplane.{name} is missing or differs from {module}.{name}"
    )


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_every_public_name_is_importable_from_the_package(subpackage: str) -> None:
    """Every name in a subpackage's ``__all__`` is ``trio_backplane``'s too,
    the same object, and listed in ``trio_backplane.__all__``."""
    module = importlib.import_module(f"trio_backplane.{subpackage}")
    for name in module.__all__:
        assert getattr(trio_backplane, name, None) is getattr(module, name), name
        assert name in trio_backplane.__all__, name


def test_package_all_names_only_what_it_has() -> None:
    for name in trio_backplane.__all__:
        assert hasattr(trio_backplane, name), name


def test_py_typed_ships() -> None:
    assert (Path(trio_backplane.__file__).parent / "py.typed").is_file()


def _api_signatures() -> list[tuple[str, list[str]]]:
    """``(name, parameter names)`` of every ``Name(...)`` API.md shows for a
    public callable, on one line or several (``open_conversation(...)``)."""
    text = API.read_text()
    found: list[tuple[str, list[str]]] = []
    nested = r"(?:[^()]|\((?:[^()]|\([^()]*\))*\))*"  # parentheses two levels deep
    call = re.compile(rf"^(?:async with |await )?([A-Za-z_]\w*)\(({nested})\)", re.M)
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        for match in call.finditer(block):
            name, params = match.group(1), match.group(2)
            if not callable(getattr(trio_backplane, name, None)):
                continue
            names = []
            for param in re.split(r",(?![^\[(]*[\])])", re.sub(r"#[^\n]*", "", params)):
                head = param.split("=")[0].split(":")[0].strip().lstrip("*")
                if re.fullmatch(r"[A-Za-z_]\w*", head):
                    names.append(head)
            found.append((name, names))
    return found


def test_api_md_shows_signatures() -> None:
    shown = dict(_api_signatures())
    assert "open_conversation" in shown
    assert {"run_id", "store", "provider", "cleanup_timeout"} <= set(shown["open_conversation"])


@pytest.mark.parametrize(("name", "params"), _api_signatures())
def test_api_md_signature_parameters_exist(name: str, params: list[str]) -> None:
    """Every parameter API.md shows for a public callable is one of its
    parameters (hosts pass them by name)."""
    signature = inspect.signature(getattr(trio_backplane, name))
    missing = [p for p in params if p not in signature.parameters]
    assert not missing, f"{name}{signature} lacks {missing}"


def test_error_classes_are_api_md_s() -> None:
    """``ErrorClass`` has exactly API.md's members, with its values."""
    text = API.read_text()
    block = text[text.index("class ErrorClass") : text.index("class Error(Exception)")]
    shown = dict(re.findall(r'^\s+([A-Z_]+) = "([a-z_]+)"', block, re.M))
    assert len(shown) > 10
    assert {member.name: member.value for member in trio_backplane.ErrorClass} == shown


@pytest.mark.parametrize("store_class", ["MemoryStore", "SQLiteStore", "PostgresStore"])
def test_stores_have_api_md_s_protocol(store_class: str) -> None:
    """Each store has the ``Store`` protocol's coroutine methods with the
    parameters API.md shows, in its order (hosts pass them by name)."""
    text = API.read_text()
    protocol = text[text.index("class Store(Protocol):") : text.index("MemoryStore()")]
    methods = re.findall(r"async def (\w+)\(self(?:, )?([^()]*)\)", protocol)
    assert [name for name, _ in methods] == [
        "create", "load", "commit", "fence", "list_runs", "events"
    ]  # fmt: skip
    cls = getattr(trio_backplane, store_class)
    for name, params in methods:
        shown = [p.split("=")[0].strip() for p in params.split(",") if p.strip() not in ("", "*")]
        method = getattr(cls, name)
        assert inspect.iscoroutinefunction(method), f"{store_class}.{name} is not async"
        assert [p for p in inspect.signature(method).parameters if p != "self"] == shown


def test_effect_identities_carry_api_md_s_fields() -> None:
    """A tool operation (TOOL-05) and a provider request (PRV-01) carry the
    fields API.md lists; an operation's context and a conversation have its
    methods."""
    import attrs

    operation = {
        "run_id", "incarnation", "step_id", "attempt_id", "invocation_id", "tool_call_id",
        "turn_id", "tool_name", "tool_revision", "catalog_revision", "arguments", "caller",
        "effective_authority", "backend_context", "context",
    }  # fmt: skip
    request = {
        "run_id", "incarnation", "step_id", "attempt_id", "turn_id", "messages",
        "catalog_revision", "tools",
    }  # fmt: skip
    assert operation <= set(attrs.fields_dict(trio_backplane.ToolOperation))
    assert request <= set(attrs.fields_dict(trio_backplane.ProviderRequest))
    for name in ("emit", "interact", "stage_catalog", "nested_dispatch"):
        assert callable(getattr(trio_backplane.ToolContext, name, None)), name
    for name in (
        "prompt", "steer", "follow_up", "cancel", "resolve", "stage_catalog", "status",
        "subscribe", "wait_settled",
    ):  # fmt: skip
        assert callable(getattr(trio_backplane.Conversation, name, None)), name

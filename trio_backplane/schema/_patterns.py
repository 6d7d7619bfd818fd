"""Patterns: checked as ECMA-262, given to the engine spelled out where it
would match otherwise, and named in errors as the schema writes them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import jsonschema_rs

from ._ecma import scan_pattern
from ._errors import invalid, limit_error, unsupported
from ._graph import Path
from ._instance import json_pointer

__all__ = ["AsWritten", "Patterns"]

MAX_MESSAGE: Final = 500
#: (path of the node, its patternProperties key or None for ``pattern``, the engine's text)
Edit = tuple[Path, str | None, str]


class Patterns:
    """The patterns of the walked documents, and those the engine is to be
    given spelled out (``_ecma.engine_pattern``), by document number."""

    __slots__ = ("_bounds_only", "_docs", "_engine_docs", "_max_bytes", "edits")

    def __init__(self, docs: list[Any], max_bytes: int, *, bounds_only: bool = False) -> None:
        self._docs = docs
        self._max_bytes = max_bytes
        self._bounds_only = bounds_only
        self.edits: dict[int, list[Edit]] = {}
        self._engine_docs: dict[int, Any] | None = None  # id(doc) -> engine_document(doc)

    def check(self, number: int, path: Path, key: str | None, pattern: str, hidden: bool) -> None:
        """Refuse a pattern too long or not ECMA-262 (``bounds_only``: too
        long only), at ``path``'s ``pattern`` or ``patternProperties`` key
        ``key``; note it when the engine must be given it spelled out."""
        maximum = self._max_bytes
        if len(pattern) * 4 > maximum and len(pattern.encode("utf-8", "surrogatepass")) > maximum:
            where = _where(path, key)
            raise limit_error("pattern_too_long", "max_pattern_bytes", maximum, path=where)
        if self._bounds_only:
            return
        syntax, unmatched, text = scan_pattern(pattern)
        if syntax is not None:
            raise invalid(
                "pattern is not an ECMA-262 regular expression",
                reason="invalid_pattern",
                pattern=pattern,
                detail=syntax,
                path=_where(path, key),
            )
        if unmatched is not None:
            raise unsupported(
                "pattern uses ECMA-262 syntax the regex engine does not match as ECMA-262",
                reason="unsupported_pattern",
                pattern=pattern,
                detail=unmatched,
                path=_where(path, key),
            )
        if text is None:
            return
        if hidden:
            # The same object is data too (a ``const`` value, say): a copy
            # with the pattern spelled out would change it.
            raise unsupported(
                "a pattern the engine must be given spelled out is in a schema"
                " reached only by a reference into a non-schema location",
                reason="unsupported_pattern",
                pattern=pattern,
                path=json_pointer(path),
            )
        self.edits.setdefault(number, []).append((path, key, text))

    def engine_document(self, doc: Any) -> Any:
        """``doc`` (a walked document) as the engine is to be given it: a copy
        with its patterns spelled out where they must be, else ``doc`` itself."""
        if not self.edits:
            return doc
        if self._engine_docs is None:
            self._engine_docs = {
                id(self._docs[number]): _with_patterns(self._docs[number], edits)
                for number, edits in self.edits.items()
            }
        return self._engine_docs.get(id(doc), doc)

    def spelled_out(self) -> Iterator[tuple[int, Path, str | None, str, str]]:
        """Every pattern the engine is given spelled out: ``(document number,
        path of its node, its patternProperties key or None, the engine's
        text, the pattern as written)``; two patterns may give one text."""
        for number, edits in self.edits.items():
            for path, key, text in edits:
                written = _at(self._docs[number], path)["pattern"] if key is None else key
                yield number, path, key, text, written


def _where(path: Path, key: str | None) -> str:
    return json_pointer((*path, "pattern") if key is None else (*path, "patternProperties", key))


def _at(doc: Any, path: Path) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _with_patterns(doc: Any, edits: list[Edit]) -> Any:
    """A copy of ``doc`` with each edit's pattern replaced by the engine's
    text; only the containers on the edits' paths are copied."""
    tree: dict[Any, Any] = {}  # path step -> subtree; None -> the node's edits
    for path, key, text in edits:
        branch = tree
        for step in path:
            branch = branch.setdefault(step, {})
        branch.setdefault(None, []).append((key, text))
    return _copy(doc, tree)


def _copy(node: Any, branch: dict[Any, Any]) -> Any:
    changed: dict[Any, Any] = {}
    for step, sub in branch.items():
        if step is not None:
            changed[step] = _copy(node[step], sub)
    if isinstance(node, list | tuple):
        items = list(node)
        for index, value in changed.items():
            items[index] = value
        return items
    out = dict(node)
    out.update(changed)
    renamed: dict[str, str] = {}
    for key, text in branch.get(None, ()):
        if key is None:
            out["pattern"] = text
        else:
            renamed[key] = text
    if renamed:  # patternProperties keys, in their order
        props = out["patternProperties"]
        out["patternProperties"] = {renamed.get(k, k): v for k, v in props.items()}
        if len(out["patternProperties"]) != len(props):
            raise unsupported(
                "patternProperties holds a pattern both as written and spelled out",
                reason="unsupported_pattern",
                patterns=sorted(renamed),
            )
    return out


class AsWritten:
    """What the engine names (a schema path, a message), with the patterns
    it was given spelled out named as the schema writes them.

    In the schema itself a spelled-out text is named by the pattern written
    at its place; elsewhere by the one pattern that gives it, and a text two
    patterns give is left as the engine wrote it.
    """

    __slots__ = ("_keys", "_patterns", "_texts")

    def __init__(self, patterns: Patterns) -> None:
        #: in the schema itself (document 0), by the place of the node:
        #: ``(node path, spelled-out key) -> key as written``, and
        #: ``node path -> (spelled-out pattern, pattern as written)``
        self._keys: dict[tuple[Path, str], str] = {}
        self._patterns: dict[Path, tuple[str, str]] = {}
        texts: dict[str, str | None] = {}
        for number, path, key, text, written in patterns.spelled_out():
            texts[text] = written if texts.get(text, written) == written else None
            if number == 0:
                if key is None:
                    self._patterns[path] = (text, written)
                else:
                    self._keys[(path, text)] = written
        self._texts = {text: pattern for text, pattern in texts.items() if pattern is not None}

    def entry(self, error: jsonschema_rs.ValidationError) -> dict[str, Any]:
        """The error entry for ``error``, patterns named as written."""
        steps = list(error.schema_path)
        for i in range(1, len(steps)):
            step = steps[i]
            if steps[i - 1] == "patternProperties" and type(step) is str:
                written = self._keys.get((tuple(steps[: i - 1]), step))
                steps[i] = written if written is not None else self._texts.get(step, step)
        message = error.message
        spelled = self._patterns.get(tuple(steps[:-1])) if steps[-1:] == ["pattern"] else None
        message = message.replace(*spelled) if spelled is not None else self.message(message)
        return {
            "instance_path": json_pointer(error.instance_path),
            "schema_path": json_pointer(steps),
            "keyword": error.kind.name,
            "message": message[:MAX_MESSAGE],
        }

    def message(self, message: str) -> str:
        """``message`` with every spelled-out text one pattern gives named as written."""
        for text, pattern in self._texts.items():
            if text in message:
                message = message.replace(text, pattern)
        return message

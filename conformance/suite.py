"""Load the JSON-Schema-Test-Suite Draft 2020-12 cases and judge them through our boundary.

Three groups of cases (see ``fetch.py`` for where the suite comes from):

* :func:`required_cases`: every file directly in ``tests/draft2020-12/`` (SCH-42);
* :func:`format_cases`: ``tests/draft2020-12/optional/format/*.json``, run with
  ``format_assertion=True`` (SCH-13);
* :func:`optional_cases`: the other files of ``optional/`` (informational).

:func:`remotes` maps ``http://localhost:1234/<path>`` to each JSON file under
``remotes/``: the suite's tests reference them by those URIs.  It returns the
same dict object on every call, so the boundary's compiled-schema cache (whose
fingerprint includes the registry) sees one registry.

:func:`run_case` calls ``trio_backplane.schema.validate_output`` and
:func:`judge` compares the outcome with the expectation: a returned instance
means valid, an ``Error`` of class ``validation`` means invalid, and for the
groups in :data:`OTHER_DIALECT` every case must raise ``unsupported_capability``.
Anything else is a failure of the case.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

import fetch

__all__ = [
    "DRAFT_2020_12",
    "OPTIONAL_OTHER_DIALECT",
    "OTHER_DIALECT",
    "REMOTE_BASE",
    "Case",
    "Outcome",
    "format_cases",
    "judge",
    "optional_cases",
    "other_dialect_groups",
    "remotes",
    "required_cases",
    "run_case",
]

DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
REMOTE_BASE: Final = "http://localhost:1234/"

Kind = Literal["required", "format", "optional"]
Verdict = Literal["valid", "invalid", "unsupported_capability", "error"]

#: Required groups, by (file stem, test-group description), whose schema
#: declares a dialect other than Draft 2020-12 (SCH-02/SCH-03): every case of
#: them must raise ``unsupported_capability`` instead of getting the suite's
#: verdict.
#:
#: At the pinned suite commit (conformance/COMMIT) there are NONE.  How this
#: was established (and :func:`other_dialect_groups` re-checks it in
#: test_official_suite.py, so a new pin cannot silently change it):
#:
#: * Every ``$schema`` inside ``tests/draft2020-12/*.json`` is
#:   ``https://json-schema.org/draft/2020-12/schema`` (363 occurrences) except
#:   two, both in ``vocabulary.json``:
#:   - "schema that uses custom metaschema with with no validation vocabulary"
#:     declares ``http://localhost:1234/draft2020-12/metaschema-no-validation.json``
#:   - "ignore unrecognized optional vocabulary" declares
#:     ``http://localhost:1234/draft2020-12/metaschema-optional-vocabulary.json``
#:   Both remotes are custom meta-schemas whose own ``$schema`` is Draft
#:   2020-12, supplied through ``schema_registry``: SCH-02 accepts those (and
#:   SCH-04 ignores the unknown vocabulary marked ``false``), so these groups
#:   keep the suite's verdicts.
#: * The remotes that required tests ``$ref`` are ``draft2020-12/*`` (own
#:   ``$schema`` 2020-12) or the unversioned ``different-id-ref-string.json``,
#:   ``urn-ref-string.json`` and ``nested-absolute-ref-to-string.json`` (no
#:   ``$schema``: they are evaluated in the referencing 2020-12 dialect).  No
#:   required test references a ``draft2019-09/``, ``draft7/``, ``draft6/``,
#:   ``draft-next/`` (...) remote.
#:
#: The only other-dialect group of the Draft 2020-12 directory is optional
#: (``optional/cross-draft.json``): see :data:`OPTIONAL_OTHER_DIALECT`.
OTHER_DIALECT: frozenset[tuple[str, str]] = frozenset()

#: Same as :data:`OTHER_DIALECT` for the informational optional (non-format) group.
OPTIONAL_OTHER_DIALECT: frozenset[tuple[str, str]] = frozenset(
    {
        # Its schema declares 2020-12 but $refs
        # http://localhost:1234/draft2019-09/ignore-prefixItems.json, whose
        # $schema is https://json-schema.org/draft/2019-09/schema: SCH-03
        # refuses a referenced resource of another draft.
        ("cross-draft", "refs to historic drafts are processed as historic drafts"),
    }
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One test of the suite."""

    kind: Kind
    group: str  # the file stem, e.g. "ref"
    group_description: str
    description: str
    schema: Any
    data: Any
    valid: bool
    path: str  # the file, relative to the suite directory

    @property
    def id(self) -> str:
        """``"<file stem>::<group description>::<test description>"``."""
        return f"{self.group}::{self.group_description}::{self.description}"

    @property
    def format_assertion(self) -> bool:
        return self.kind == "format"

    @property
    def other_dialect(self) -> bool:
        key = (self.group, self.group_description)
        if self.kind == "required":
            return key in OTHER_DIALECT
        if self.kind == "optional":
            return key in OPTIONAL_OTHER_DIALECT
        return False

    @property
    def expected(self) -> Verdict:
        if self.other_dialect:
            return "unsupported_capability"
        return "valid" if self.valid else "invalid"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the boundary did with one case."""

    verdict: Verdict
    detail: str = ""  # the exception (class: message) when one was raised


def _root(root: pathlib.Path | None) -> pathlib.Path:
    return fetch.suite_dir() if root is None else root


def _tests_dir(root: pathlib.Path | None) -> pathlib.Path:
    return _root(root) / "tests" / "draft2020-12"


def _load(files: list[pathlib.Path], kind: Kind, base: pathlib.Path) -> list[Case]:
    cases: list[Case] = []
    for path in sorted(files):
        with path.open(encoding="utf-8") as fh:
            groups = json.load(fh)
        for group in groups:
            for test in group["tests"]:
                cases.append(
                    Case(
                        kind=kind,
                        group=path.stem,
                        group_description=group["description"],
                        description=test["description"],
                        schema=group["schema"],
                        data=test["data"],
                        valid=test["valid"],
                        path=path.relative_to(base).as_posix(),
                    )
                )
    return cases


def required_cases(root: pathlib.Path | None = None) -> list[Case]:
    """Every case of ``tests/draft2020-12/*.json`` (not ``optional/``)."""
    tests = _tests_dir(root)
    return _load(list(tests.glob("*.json")), "required", tests.parent.parent)


def format_cases(root: pathlib.Path | None = None) -> list[Case]:
    """Every case of ``tests/draft2020-12/optional/format/*.json``."""
    tests = _tests_dir(root)
    return _load(
        list((tests / "optional" / "format").glob("*.json")), "format", tests.parent.parent
    )


def optional_cases(root: pathlib.Path | None = None) -> list[Case]:
    """Every case of ``tests/draft2020-12/optional/*.json`` (not ``format/``)."""
    tests = _tests_dir(root)
    return _load(list((tests / "optional").glob("*.json")), "optional", tests.parent.parent)


@functools.cache
def _remotes(root: pathlib.Path) -> dict[str, Any]:
    base = root / "remotes"
    registry: dict[str, Any] = {}
    for path in sorted(base.rglob("*.json")):
        with path.open(encoding="utf-8") as fh:
            registry[REMOTE_BASE + path.relative_to(base).as_posix()] = json.load(fh)
    return registry


def remotes(root: pathlib.Path | None = None) -> dict[str, Any]:
    """``{"http://localhost:1234/<relative path>": schema}`` for every file under ``remotes/``.

    Built once per suite directory: every call returns the same dict object.
    Do not mutate it.
    """
    return _remotes(_root(root).resolve())


# --------------------------------------------------------------------------
# Running a case


def run_case(case: Case, registry: Mapping[str, Any]) -> Outcome:
    """Pass ``case`` through ``validate_output`` and classify what happened."""
    from trio_backplane.errors import Error, ErrorClass
    from trio_backplane.schema import validate_output

    try:
        validate_output(
            case.schema,
            case.data,
            schema_registry=registry,
            format_assertion=case.format_assertion,
        )
    except Error as exc:
        detail = f"Error({exc.error_class.value}): {exc.message}"
        if exc.details:
            detail += f" {dict(exc.details)!r}"
        if exc.error_class is ErrorClass.VALIDATION:
            return Outcome("invalid", detail)
        if exc.error_class is ErrorClass.UNSUPPORTED_CAPABILITY:
            return Outcome("unsupported_capability", detail)
        return Outcome("error", detail)
    except Exception as exc:  # anything else is a failure of the case, reported
        return Outcome("error", f"{type(exc).__qualname__}: {exc}")
    return Outcome("valid")


def judge(case: Case, registry: Mapping[str, Any]) -> tuple[bool, Outcome]:
    """``(passed, outcome)`` for one case."""
    outcome = run_case(case, registry)
    return outcome.verdict == case.expected, outcome


def iter_failures(cases: list[Case], registry: Mapping[str, Any]) -> Iterator[tuple[Case, Outcome]]:
    for case in cases:
        passed, outcome = judge(case, registry)
        if not passed:
            yield case, outcome


# --------------------------------------------------------------------------
# Re-deriving OTHER_DIALECT from the suite


def _is_2020_12(uri: str) -> bool:
    return uri.rstrip("#") == DRAFT_2020_12


def _declares_other_dialect(
    schema: Any, base: str, registry: Mapping[str, Any], seen: set[str]
) -> bool:
    """Does ``schema`` (at base URI ``base``) declare, or reference a remote
    that declares, a dialect other than Draft 2020-12?

    A ``$schema`` naming a registry entry whose own ``$schema`` is 2020-12 is a
    custom meta-schema (SCH-02), not another dialect.  References are resolved
    against ``$id``s approximately (enough for the suite): only references
    into the registry are followed.
    """
    stack: list[tuple[Any, str]] = [(schema, base)]
    while stack:
        node, node_base = stack.pop()
        if isinstance(node, list):
            stack.extend((item, node_base) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        ident = node.get("$id")
        if isinstance(ident, str):
            node_base = urllib.parse.urldefrag(urllib.parse.urljoin(node_base, ident)).url
        dialect = node.get("$schema")
        if isinstance(dialect, str) and not _is_2020_12(dialect):
            meta = registry.get(urllib.parse.urldefrag(dialect).url)
            if not (isinstance(meta, dict) and _is_2020_12(str(meta.get("$schema", "")))):
                return True
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if isinstance(ref, str):
                target = urllib.parse.urldefrag(urllib.parse.urljoin(node_base, ref)).url
                if target in registry and target not in seen:
                    seen.add(target)
                    if _declares_other_dialect(registry[target], target, registry, seen):
                        return True
        stack.extend((value, node_base) for value in node.values())
    return False


def other_dialect_groups(
    cases: list[Case], registry: Mapping[str, Any]
) -> frozenset[tuple[str, str]]:
    """The (file stem, group description) of the cases whose schema declares another dialect."""
    found: set[tuple[str, str]] = set()
    done: set[tuple[str, str]] = set()
    for case in cases:
        key = (case.group, case.group_description)
        if key in done:
            continue
        done.add(key)
        if _declares_other_dialect(case.schema, "", registry, set()):
            found.add(key)
    return frozenset(found)

"""The store conformance suite against the durable stores, MemoryStore and
deliberately broken stores (STO-11, STO-12)."""

from __future__ import annotations

import inspect
import itertools
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio

from tests.store.broken import BROKEN_STORES, FileStore
from trio_backplane import Error, ErrorClass
from trio_backplane.store import MemoryStore, PostgresStore, SQLiteStore, Store
from trio_backplane.testing import STO_11_CHECKS, FaultyStore, StoreConformance

pytest_plugins = ["tests.store.postgres_fixture"]

REPO = Path(__file__).resolve().parents[2]

CHECKS = sorted(
    name
    for name, member in inspect.getmembers(StoreConformance)
    if name.startswith("test_") and inspect.iscoroutinefunction(member)
)


# -- the reference: a tiny correct durable store on files -------------------


class _FileConformance(StoreConformance):
    store_class: ClassVar[type[FileStore]] = FileStore
    root: Path
    _counter = itertools.count()

    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path

    async def make_store(self) -> Store:
        return self.store_class(self.root / f"store-{next(self._counter)}")

    async def reopen(self, store: Store) -> Store:
        assert isinstance(store, FileStore)
        return self.store_class(store.path)

    async def fail_next_commit(self, store: Store) -> None:
        assert isinstance(store, FileStore)
        store._fail_next_commit()


class TestFileStoreConformance(_FileConformance):
    """The suite passes on a minimal correct durable store (so the broken
    stores below fail for their breakage, not for the suite's sake)."""


# -- STO-11: SQLite -------------------------------------------------------------


class TestSQLiteConformance(StoreConformance):
    """STO-11 on ``SQLiteStore``: a fresh database file per ``make_store``;
    ``reopen`` is a new ``SQLiteStore`` on the same file."""

    root: Path
    _counter = itertools.count()

    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path

    async def make_store(self) -> Store:
        return FaultyStore(SQLiteStore(self.root / f"runs-{next(self._counter)}.db"))

    async def reopen(self, store: Store) -> Store:
        assert isinstance(store, FaultyStore)
        assert isinstance(store.inner, SQLiteStore)
        return FaultyStore(SQLiteStore(store.inner.path))


# -- STO-11: PostgreSQL ----------------------------------------------------------


class TestPostgresConformance(StoreConformance):
    """STO-11 on ``PostgresStore``: each ``make_store`` gets its own schema;
    ``reopen`` is another instance (another host) on that schema."""

    dsn: str
    schemas: list[str]

    @pytest.fixture(autouse=True)
    def _dsn(self, pg_dsn: str) -> Any:
        self.dsn = pg_dsn
        self.schemas = []
        yield
        import psycopg
        from psycopg import sql

        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for schema in self.schemas:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )

    async def make_store(self) -> Store:
        schema = f"conformance_{uuid.uuid4().hex[:16]}"
        self.schemas.append(schema)
        return FaultyStore(PostgresStore(self.dsn, schema=schema))

    async def reopen(self, store: Store) -> Store:
        assert isinstance(store, FaultyStore)
        assert isinstance(store.inner, PostgresStore)
        return FaultyStore(PostgresStore(self.dsn, schema=store.inner.schema))


# -- STO-12: MemoryStore is refused ------------------------------------------


class _MemoryConformance(StoreConformance):
    async def make_store(self) -> Store:
        return MemoryStore()

    async def reopen(self, store: Store) -> Store:
        return store

    async def fail_next_commit(self, store: Store) -> None:
        raise AssertionError("never reached")


@pytest.mark.parametrize("check", CHECKS)
def test_memory_store_is_refused(check: str) -> None:
    """STO-12: every check fails on MemoryStore with unsupported_capability
    "durable store required" instead of passing."""
    suite = _MemoryConformance()
    with pytest.raises(Error) as raised:
        trio.run(getattr(suite, check))
    assert raised.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert raised.value.message == "durable store required"


# -- broken stores fail ---------------------------------------------------------


def _run_checks(store_class: type[FileStore], root: Path) -> dict[str, str]:
    """Run every check against ``store_class``: {check: failure} for those that fail."""
    failures: dict[str, str] = {}
    for check in CHECKS:
        suite = type("_Suite", (_FileConformance,), {"store_class": store_class})()
        suite.root = root / check
        try:
            trio.run(getattr(suite, check))
        except Exception as exc:  # a failing check: AssertionError or Error, mostly
            failures[check] = f"{type(exc).__name__}: {exc}"[:200]
    return failures


#: Which checks must catch which breakage (at least these; others may too).
EXPECTED_CATCHES = {
    "AckWithoutPersistStore": {"test_atomic_commit", "test_durability_across_reopen"},
    "NoFenceStore": {"test_incarnation_fence", "test_uncertain_effect_fencing"},
    "StaleRevisionWinsStore": {"test_stale_revision", "test_concurrent_writers"},
    "TornFailureStore": {"test_failed_commit"},
    "FirstEventOnlyStore": {"test_multi_event_commit"},
    "SameSequencePerCommitStore": {"test_multi_event_commit"},
    "NoIdentityCheckStore": {"test_identity_and_existence"},
    "CreateOverwritesStore": {"test_identity_and_existence"},
    "EmptyFilterMeansAllStore": {"test_list_runs_filters"},
    "HigherIncarnationCommitsStore": {"test_identity_and_existence"},
    "LoadMissingReturnsFreshStore": {"test_identity_and_existence"},
    "AsciiOnlyStore": {"test_data_round_trips_exactly"},
    "BoolAsIntContextStore": {"test_data_round_trips_exactly"},
    "NulDroppingStore": {"test_data_round_trips_exactly"},
    "ShortTextStore": {"test_data_round_trips_exactly"},
    "DoubleNumbersStore": {"test_data_round_trips_exactly"},
    "SingleFloatsStore": {"test_data_round_trips_exactly"},
    "WholeSecondEventsStore": {"test_data_round_trips_exactly"},
    "FirstPageStore": {"test_list_runs_filters"},
    "CaseInsensitiveIdsStore": {"test_identity_and_existence"},
    "TruncatedIdsStore": {"test_identity_and_existence"},
    "CreationIncarnationListedStore": {"test_incarnation_fence"},
    "NoAdmissionTimeStore": {"test_list_runs_filters"},
    "OneAdmissionTimeStore": {"test_list_runs_filters"},
}


@pytest.mark.parametrize("store_class", BROKEN_STORES, ids=lambda c: c.__name__)
def test_broken_store_fails_the_suite(store_class: type[FileStore], tmp_path: Path) -> None:
    """Each deliberately broken store fails at least one check (and the ones
    aimed at its breakage)."""
    failures = _run_checks(store_class, tmp_path)
    assert failures, f"{store_class.__name__} passed every check"
    missing = EXPECTED_CATCHES[store_class.__name__] - set(failures)
    assert not missing, (missing, failures)


def test_reference_file_store_passes_every_check(tmp_path: Path) -> None:
    assert _run_checks(FileStore, tmp_path) == {}


# -- STO-11: what a subclass collects ---------------------------------------


def test_subclass_collects_the_sto_11_checks(tmp_path: Path) -> None:
    """STO-11: pytest collects at least the nine STO-11 checks from a
    subclass and nothing from the base class."""
    assert len(STO_11_CHECKS) == 9
    module = tmp_path / f"test_collect_{uuid.uuid4().hex[:8]}.py"
    module.write_text(
        "from trio_backplane.testing import StoreConformance\n"
        "class TestMine(StoreConformance):\n"
        "    pass\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "trio_mode=true",
            "--rootdir",
            str(tmp_path),
            str(module),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=60,
    )
    collected = {line.split("::")[-1] for line in result.stdout.splitlines() if "::" in line}
    assert {f"test_{name}" for name in STO_11_CHECKS} <= collected, result.stdout
    assert not any("::StoreConformance::" in line for line in result.stdout.splitlines())
    assert StoreConformance.__test__ is False
    assert TestFileStoreConformance.__test__ is True

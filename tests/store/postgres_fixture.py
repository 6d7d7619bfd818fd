"""The PostgreSQL fixtures: a server DSN and stores isolated in their own schema.

``nox -s tests`` starts a throwaway server (``scripts/postgres.sh``) and passes
its DSN in ``TRIO_BACKPLANE_PG_DSN``.  Without it the PostgreSQL tests skip,
except in CI (``CI`` set), where a missing server is a failure, never a skip.

Register in a test module with ``pytest_plugins = ["tests.store.postgres_fixture"]``.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

from tests.prerequisites import unavailable
from trio_backplane.store import PostgresStore

DSN_VARIABLE = "TRIO_BACKPLANE_PG_DSN"
SKIP_REASON = "PostgreSQL not available: set TRIO_BACKPLANE_PG_DSN or run through nox -s tests"

#: ``make(**kwargs)`` -> a ``PostgresStore`` on the test's own schema.
StoreFactory = Callable[..., PostgresStore]


@pytest.fixture
def pg_dsn() -> str:
    """The DSN of a PostgreSQL server to test against."""
    dsn = os.environ.get(DSN_VARIABLE, "").strip()
    if not dsn:
        unavailable(SKIP_REASON)
    try:
        importlib.import_module("psycopg")
    except ImportError:
        unavailable("psycopg is not installed: pip install -e '.[postgres]'")
    return dsn


def _drop_schema(dsn: str, schema: str) -> None:
    psycopg: Any = importlib.import_module("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                psycopg.sql.Identifier(schema)
            )
        )


@pytest.fixture
def pg_schema() -> str:
    """A schema name no other test uses."""
    return f"test_{uuid.uuid4().hex[:16]}"


@pytest.fixture
async def pg_store_factory(pg_dsn: str, pg_schema: str) -> AsyncIterator[StoreFactory]:
    """Make ``PostgresStore`` instances on one fresh schema (many instances on
    one schema act as many hosts on one database); their sessions'
    ``application_name`` is the schema name.  All are closed and the schema
    is dropped when the test ends."""
    opened: list[PostgresStore] = []
    psycopg: Any = importlib.import_module("psycopg")
    # The stores' sessions carry the schema as application_name, so a test can
    # find them in pg_stat_activity.
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, application_name=pg_schema)

    def make(**kwargs: Any) -> PostgresStore:
        kwargs.setdefault("schema", pg_schema)
        store = PostgresStore(dsn, **kwargs)
        opened.append(store)
        return store

    try:
        yield make
    finally:
        with trio.CancelScope(shield=True):
            for store in opened:
                await store.aclose()
            await trio.to_thread.run_sync(_drop_schema, pg_dsn, pg_schema)

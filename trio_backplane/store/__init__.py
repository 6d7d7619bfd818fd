"""Durable records behind one small protocol: memory, SQLite, PostgreSQL."""

from .._public import fixup_module_metadata
from ._memory import MemoryStore
from ._protocol import (
    PreparedCommit,
    Receipt,
    RunSummary,
    Store,
    check_commit,
    prepare_commit,
    prepare_create,
    verify_receipt,
)
from ._sql._postgres import PostgresStore
from ._sql._sqlite import SQLiteStore

__all__ = [
    "MemoryStore",
    "PostgresStore",
    "PreparedCommit",
    "Receipt",
    "RunSummary",
    "SQLiteStore",
    "Store",
    "check_commit",
    "prepare_commit",
    "prepare_create",
    "verify_receipt",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

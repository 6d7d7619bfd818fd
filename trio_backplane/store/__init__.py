"""Durable records behind one small protocol: memory, SQLite, PostgreSQL."""

from ._memory import MemoryStore
from ._protocol import (
    PreparedCommit,
    Receipt,
    RunSummary,
    Store,
    prepare_commit,
    prepare_create,
    verify_receipt,
)

__all__ = [
    "MemoryStore",
    "PreparedCommit",
    "Receipt",
    "RunSummary",
    "Store",
    "prepare_commit",
    "prepare_create",
    "verify_receipt",
]

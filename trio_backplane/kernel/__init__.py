"""The durable run kernel: a pure state machine over JSON-data records.

Sans-I/O (like h11): no Trio, no clock, no store.  ``transition(record,
command)`` returns the next record and its events or raises ``Error``.
"""

from .._public import fixup_module_metadata
from ._codec import decode_event, decode_record, encode_event, encode_record
from ._json import dumps, loads, utf8_size
from ._records import (
    ACTIVE_STATES,
    GROWING,
    MAX_INT,
    MAX_RUN_ID,
    RUN_STATES,
    SCHEMA_VERSION,
    TERMINAL_STATES,
    Budget,
    Command,
    FrozenDict,
    FrozenList,
    LayeredDict,
    RunEvent,
    RunRecord,
    appended,
    assoc,
    changed_keys,
    check_json,
    check_run_id,
    dissoc,
    evolve_record,
    freeze,
    is_time,
    reserve,
    thaw,
)
from ._transition import COMMANDS, cleanup_requirements, fence, transition

__all__ = [
    "ACTIVE_STATES",
    "COMMANDS",
    "GROWING",
    "MAX_INT",
    "MAX_RUN_ID",
    "RUN_STATES",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "Budget",
    "Command",
    "FrozenDict",
    "FrozenList",
    "LayeredDict",
    "RunEvent",
    "RunRecord",
    "appended",
    "assoc",
    "changed_keys",
    "check_json",
    "check_run_id",
    "cleanup_requirements",
    "decode_event",
    "decode_record",
    "dissoc",
    "dumps",
    "loads",
    "encode_event",
    "encode_record",
    "evolve_record",
    "fence",
    "freeze",
    "is_time",
    "reserve",
    "thaw",
    "transition",
    "utf8_size",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

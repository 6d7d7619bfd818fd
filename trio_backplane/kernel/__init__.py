"""The durable run kernel: a pure state machine over JSON-data records.

Sans-I/O (like h11): no Trio, no clock, no store.  ``transition(record,
command)`` returns the next record and its events or raises ``Error``.
"""

from .._public import fixup_module_metadata
from ._checks import cleanup_requirements
from ._codec import decode_event, decode_record, encode_event, encode_record
from ._commands import (
    COMMANDS,
    UNSET,
    Admit,
    Cancel,
    ChildSettled,
    CleanupSettled,
    ConversationUpdated,
    DeadlineExceeded,
    Finish,
    KernelCommand,
    ProviderCompleted,
    ProviderStarted,
    Start,
    ToolCompleted,
    ToolInvoked,
    WaitResolved,
    WaitStarted,
    build_command,
)
from ._derived import appended, assoc, changed_keys, dissoc
from ._evolve import evolve_record
from ._fields import MAX_INT, MAX_RUN_ID, check_run_id, is_time
from ._frozen import FrozenDict, FrozenList, LayeredDict, check_json, freeze, thaw
from ._json import dumps, loads, utf8_size
from ._records import (
    ACTIVE_STATES,
    GROWING,
    RUN_STATES,
    SCHEMA_VERSION,
    TERMINAL_STATES,
    Budget,
    Command,
    RunEvent,
    RunRecord,
    reserve,
)
from ._transition import fence, transition

__all__ = [
    "ACTIVE_STATES",
    "COMMANDS",
    "GROWING",
    "MAX_INT",
    "MAX_RUN_ID",
    "RUN_STATES",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "UNSET",
    "Admit",
    "Budget",
    "Cancel",
    "ChildSettled",
    "CleanupSettled",
    "Command",
    "ConversationUpdated",
    "DeadlineExceeded",
    "Finish",
    "FrozenDict",
    "FrozenList",
    "KernelCommand",
    "LayeredDict",
    "ProviderCompleted",
    "ProviderStarted",
    "RunEvent",
    "RunRecord",
    "Start",
    "ToolCompleted",
    "ToolInvoked",
    "WaitResolved",
    "WaitStarted",
    "appended",
    "assoc",
    "build_command",
    "changed_keys",
    "check_json",
    "check_run_id",
    "cleanup_requirements",
    "decode_event",
    "decode_record",
    "dissoc",
    "dumps",
    "encode_event",
    "encode_record",
    "evolve_record",
    "fence",
    "freeze",
    "is_time",
    "loads",
    "reserve",
    "thaw",
    "transition",
    "utf8_size",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

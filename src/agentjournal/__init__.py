"""agentjournal: durable, crash-resumable runs for LLM agents.

A run's append-only event log is its single source of truth; its state is a
pure fold over that log; a resumed run never repeats a recorded side effect.
"""

from __future__ import annotations

from .errors import (
    ConflictError,
    CorruptLogError,
    DurabilityError,
    EncodingError,
    FencedError,
    InvalidRunIdError,
    JournalError,
    LeaseHeldError,
    MissingExtraError,
    RunNotFoundError,
    StoreUrlError,
    UnknownEventTypeError,
    UnsupportedVersionError,
)
from .events import SCHEMA_VERSION, Event, EventType, decode, encode, make_events
from .keys import canonical_args, idempotency_key, operation_scope, run_scope
from .state import FOLD_RULES, RECORD_ONLY, Message, RunState, apply, fold
from .store import DEFAULT_URL, Durability, Lease, RunInfo, Store, open_store

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL",
    "FOLD_RULES",
    "RECORD_ONLY",
    "SCHEMA_VERSION",
    "ConflictError",
    "CorruptLogError",
    "Durability",
    "DurabilityError",
    "EncodingError",
    "Event",
    "EventType",
    "FencedError",
    "InvalidRunIdError",
    "JournalError",
    "Lease",
    "LeaseHeldError",
    "Message",
    "MissingExtraError",
    "RunInfo",
    "RunNotFoundError",
    "RunState",
    "Store",
    "StoreUrlError",
    "UnknownEventTypeError",
    "UnsupportedVersionError",
    "apply",
    "canonical_args",
    "decode",
    "encode",
    "fold",
    "idempotency_key",
    "make_events",
    "open_store",
    "operation_scope",
    "run_scope",
]

"""agentjournal: durable, crash-resumable runs for LLM agents.

A run's append-only event log is its single source of truth; its state is a
pure fold over that log; a resumed run never repeats a recorded side effect,
and an effect whose outcome is unknown is reconciled or handed to a person.

Layers (each uses only those above it): events -> state -> store ->
execution (agent, tools, models, policy) -> surfaces (cli, demo).
"""

from __future__ import annotations

from .agent import Agent, RunResult, new_run_id
from .decisions import (
    Decision,
    decide_approval,
    record_approval,
    record_resolution,
    resolve_uncertain,
)
from .errors import (
    AlreadyDecidedError,
    AmbiguousKeyError,
    ConflictError,
    CorruptLogError,
    DurabilityError,
    EncodingError,
    FencedError,
    InvalidRunIdError,
    JournalError,
    LeaseExpiredError,
    LeaseHeldError,
    MissingExtraError,
    NotAStoreError,
    NotPendingError,
    RunMismatchError,
    RunNotFoundError,
    StoreUnavailableError,
    StoreUrlError,
    UnknownEventTypeError,
    UnsupportedVersionError,
)
from .events import SCHEMA_VERSION, Event, EventType, decode, encode, make_events
from .journal import fork
from .keys import canonical_args, idempotency_key, operation_scope, run_scope
from .models import Model, ModelError, ModelRequest, ModelResponse, ScriptedModel, calls, reply
from .policy import (
    Allow,
    Budget,
    Compaction,
    Deny,
    Guardrail,
    GuardrailVerdict,
    Policy,
    RegexGuardrail,
    RequireApproval,
    Rules,
)
from .state import FOLD_RULES, RECORD_ONLY, Message, PendingCall, RunState, ToolCall, apply, fold
from .store import DEFAULT_URL, Durability, Lease, RunInfo, Store, open_store
from .tools import (
    Absent,
    Conflict,
    Effect,
    Found,
    Tool,
    ToolContext,
    ToolFailed,
    ToolUncertain,
    Unknown,
    tool,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL",
    "FOLD_RULES",
    "RECORD_ONLY",
    "SCHEMA_VERSION",
    "Absent",
    "Agent",
    "AlreadyDecidedError",
    "AmbiguousKeyError",
    "Allow",
    "Budget",
    "Compaction",
    "Conflict",
    "ConflictError",
    "CorruptLogError",
    "Decision",
    "Deny",
    "Durability",
    "DurabilityError",
    "Effect",
    "EncodingError",
    "Event",
    "EventType",
    "FencedError",
    "Found",
    "Guardrail",
    "GuardrailVerdict",
    "InvalidRunIdError",
    "JournalError",
    "Lease",
    "LeaseExpiredError",
    "LeaseHeldError",
    "Message",
    "MissingExtraError",
    "Model",
    "NotAStoreError",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "NotPendingError",
    "PendingCall",
    "Policy",
    "RegexGuardrail",
    "RequireApproval",
    "Rules",
    "RunInfo",
    "RunMismatchError",
    "RunNotFoundError",
    "RunResult",
    "RunState",
    "ScriptedModel",
    "Store",
    "StoreUnavailableError",
    "StoreUrlError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolFailed",
    "ToolUncertain",
    "UnknownEventTypeError",
    "UnsupportedVersionError",
    "Unknown",
    "apply",
    "calls",
    "canonical_args",
    "decide_approval",
    "decode",
    "encode",
    "fold",
    "fork",
    "idempotency_key",
    "make_events",
    "new_run_id",
    "open_store",
    "operation_scope",
    "record_approval",
    "record_resolution",
    "reply",
    "resolve_uncertain",
    "run_scope",
    "tool",
]

"""Secrets are redacted before an event is encoded.

A :class:`Redaction` is applied by the run's journal to every fact it records
(``RunJournal.record_all``, the one chokepoint every event passes), so the raw
value never reaches the log, a snapshot (built from state folded from these
events), a metric, an observer or the terminal. What it covers is every string
in a payload, keys included: the task, messages, model text and the arguments
of the tool calls a model asks for, tool arguments and results, error messages,
memory values, verdicts and escalations. Each match becomes
``[redacted:<rule>]``; the event records which rules matched and how often in
its ``redactions`` list, never the value.

What it does not cover: what a tool itself sends to its receiver (the tool is
given the real arguments: that is its business), exceptions raised to the
caller, and values that match no rule. A call whose recorded arguments were
redacted cannot be made again from the log: only the live process that still
holds the originals may retry it (see ``Agent``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from .errors import EncodingError
from .events import canonical_payload

#: Patterns for common credentials: API keys (OpenAI, Stripe, Anthropic), AWS
#: access keys, GitHub and Slack tokens, bearer tokens, JWTs, private keys, and
#: the password in a URL's user info. A key starts where no letter or digit is
#: before it (``_START``), not at a word boundary: ``tool_sk-live-...`` or
#: ``TOKEN_ghp_...`` hold a key after an underscore, which ``\b`` does not see.
_START = r"(?<![^\W_])"
DEFAULT_RULES: dict[str, str] = {
    "api_key": _START + r"(?:sk|rk)[-_][A-Za-z0-9_-]{16,}",
    "aws_access_key": _START + r"(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "github_token": _START + r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
    "slack_token": _START + r"xox[abposr]-[A-Za-z0-9-]{10,}",
    "bearer_token": r"\b[Bb]earer\s+[A-Za-z0-9._~+/=-]{20,}",
    "jwt": _START + r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    "private_key": (r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?"
                    r"-----END [A-Z ]*PRIVATE KEY-----"),
    "url_password": r"(?<=://)[^\s/:@]+:[^\s/@]+(?=@)",
}

#: For each default rule, a cheap pattern every one of its matches contains: most
#: strings hold no secret, and searching for these is several times faster.
_HINTS: dict[str, str] = {
    "api_key": r"[sr]k[-_]", "aws_access_key": r"A[KS]IA",
    "github_token": r"gh[pousr]_|github_pat_", "slack_token": r"xox", "bearer_token": r"earer\s",
    "jwt": r"eyJ", "private_key": r"-----BEGIN", "url_password": r"://",
}

#: For each default rule, strings one of which every match holds (or, for
#: url_password, the text before it does): a payload's JSON text holding none of them
#: holds no match (see Redaction._clean).
_NEEDLES: dict[str, tuple[str, ...]] = {
    "api_key": ("sk-", "sk_", "rk-", "rk_"), "aws_access_key": ("AKIA", "ASIA"),
    "github_token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "slack_token": ("xox",), "bearer_token": ("earer",), "jwt": ("eyJ",),
    "private_key": ("-----BEGIN",), "url_password": ("://",),
}

_json = msgspec.json.Encoder()
_ESCAPED = re.compile(r'[\x00-\x1f"\\]')  # what msgspec writes as an escape, and only these

#: What marks a redacted value; a recorded string holding it is not the original.
MARK = "[redacted"


def was_redacted(value: Any) -> bool:
    """Whether a recorded value holds a redaction (so it is not what was given)."""
    if isinstance(value, str):
        return MARK in value
    if isinstance(value, dict):
        return any(was_redacted(k) or was_redacted(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(was_redacted(v) for v in value)
    return False


Finder = Callable[[bytes], "re.Match[bytes] | None"]


def _needle_finders(needles: list[bytes]) -> list[Finder]:
    """Searches that find any of ``needles``: one per byte they start with. A pattern
    that starts with one literal byte is searched for by a fast scan for that byte; an
    alternation of them all starts with a choice of bytes, tested one by one (a third
    more instructions for a step's payloads, for all its single search)."""
    by_first: dict[bytes, list[bytes]] = {}
    for needle in needles:
        by_first.setdefault(needle[:1], []).append(re.escape(needle[1:]))
    return [re.compile(re.escape(first) + b"(?:" + b"|".join(rests) + b")").search
            for first, rests in by_first.items()]


class Redaction:
    """Rules (name -> regex) and literal secret values (name -> value) to keep off disk.

    ``Redaction()`` uses :data:`DEFAULT_RULES`; ``Redaction(rules={...})`` replaces
    them (add ``**DEFAULT_RULES`` to keep them); ``Redaction.none()`` redacts nothing.
    ``values`` are exact strings known in advance (e.g. from the environment).
    """

    def __init__(self, rules: Mapping[str, str] | None = None, *,
                 values: Mapping[str, str] | None = None) -> None:
        self.rules: list[tuple[str, re.Pattern[str], str]] = []
        self._hints: list[str] = []
        self._any: re.Pattern[str] | None = None
        # Literal strings every match of some rule holds, as UTF-8 (see _clean): known for
        # literal values and the default rules; None once a rule has none (any regex).
        self._needles: list[bytes] | None = []
        self._finders: list[Finder] | None = None  # searches for them (see _needle_finders)
        for name, secret in (values or {}).items():
            if len(secret) < 4:  # redacting "a" everywhere would destroy the log
                raise ValueError(f"secret value {name!r} is too short to redact safely")
            self._add(name, re.escape(secret), None, None, (secret,))
        for name, pattern in (DEFAULT_RULES if rules is None else rules).items():
            default = DEFAULT_RULES.get(name) == pattern
            self._add(name, pattern, None, _HINTS[name] if default else None,
                      _NEEDLES[name] if default else None)

    @classmethod
    def none(cls) -> Redaction:
        return cls(rules={})

    def add(self, name: str, pattern: str, replacement: str | None = None, *,
            hint: str | None = None) -> None:
        """Another rule; ``replacement`` defaults to ``[redacted:<name>]``. ``hint``: a
        cheaper pattern found in every match (default: the pattern itself)."""
        self._add(name, pattern, replacement, hint, None)

    def _add(self, name: str, pattern: str, replacement: str | None, hint: str | None,
             needles: tuple[str, ...] | None) -> None:
        self.rules.append((name, re.compile(pattern), replacement or f"[redacted:{name}]"))
        self._hints.append(hint or pattern)
        self._any = None
        if needles is not None and any(_ESCAPED.search(n) for n in needles):
            needles = None  # the JSON text would hold it escaped, not as it is
        if self._needles is not None:
            self._needles = None if needles is None else [
                *self._needles, *(n.encode() for n in needles)]
        self._finders = None

    def extend(self, other: Redaction) -> None:
        """Add ``other``'s rules to these."""
        self.rules += other.rules
        self._hints += other._hints
        self._any = None
        self._needles = (None if self._needles is None or other._needles is None
                         else self._needles + other._needles)
        self._finders = None

    def _prefilter(self) -> re.Pattern[str] | None:
        """One pattern matching where any rule does: most strings hold no secret, and
        one search is several times cheaper than one per rule."""
        if self._any is None:
            try:
                self._any = re.compile("|".join(f"(?:{h})" for h in self._hints))
            except re.error:  # a rule with global flags cannot be joined: search each
                return None
        return self._any

    def _clean(self, payload: Mapping[str, Any]) -> bool:
        """True when no rule can match in ``payload``: its JSON text holds none of the
        rules' needles (one substring test each, instead of a walk of every string).
        A needle holds no character JSON escapes, so it is in the text wherever it is
        in a string or key. False when some rule has no needles: the walk decides."""
        needles = self._needles
        if needles is None:
            return False
        if not needles:
            return True  # no rules
        try:
            text = _json.encode(payload)
        except (TypeError, ValueError, msgspec.EncodeError):  # (not JSON yet: walk it)
            return False
        return self._spares(text)

    def _spares(self, text: bytes) -> bool:
        """Whether JSON ``text`` holds none of the needles (which must be known)."""
        assert self._needles is not None
        if self._finders is None:
            self._finders = _needle_finders(self._needles)
        # A loop, not any() over a generator: resuming it per search cost a third more.
        for find in self._finders:  # noqa: SIM110
            if find(text):
                return False
        return True

    def scrub(self, value: Any, counts: Counter[str] | None = None) -> Any:
        """``value`` with every match replaced; matches counted per rule in ``counts``."""
        if isinstance(value, str):
            if (any_rule := self._prefilter()) is not None and not any_rule.search(value):
                return value
            for name, pattern, replacement in self.rules:
                value, n = pattern.subn(replacement, value)
                if n and counts is not None:
                    counts[name] += n
            return value
        if isinstance(value, dict):
            return {self.scrub(k, counts): self.scrub(v, counts) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v, counts) for v in value]
        return value

    def recorded(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`payload`, put in canonical form (events.canonical_payload) first when
        that can tell no rule matches: the canonical bytes are the JSON text the needles
        are searched in, so a payload without secrets is encoded once, not twice."""
        if self._needles is not None:
            try:
                plain, text = canonical_payload(payload)
            except EncodingError:
                pass  # make_events refuses it, after the walk: its words hold no secret
            else:
                if self._spares(text):
                    return plain
        return self.payload(payload)

    def payload(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """A payload as it may be recorded: scrubbed, with a ``redactions`` list (rule
        and count, sorted by rule) when anything matched."""
        if not self.rules or self._clean(payload):
            return dict(payload)
        counts: Counter[str] = Counter()
        clean: dict[str, Any] = self.scrub(dict(payload), counts)
        if counts:
            clean["redactions"] = [{"rule": r, "count": n} for r, n in sorted(counts.items())]
        return clean

"""7. The digest chain's cost per event: sealing on append, checking on read."""

from __future__ import annotations

from functools import partial

from ..events import GENESIS, Event, decode_stored, encode, seal
from ..store.base import decode_record
from ._common import RUN, Figure, Say, figure, medians, timed


def _encode_all(events: list[Event]) -> int:
    return len([encode(e) for e in events])


def _seal_all(events: list[Event]) -> int:
    return len(seal(events, GENESIS)[0])


def _decode_all(bodies: list[bytes]) -> int:
    return len([decode_stored(b) for b in bodies])


def _check_all(bodies: list[bytes]) -> int:
    prev, kept = GENESIS, []
    for seq, body in enumerate(bodies, start=1):
        event, prev = decode_record(RUN, seq, body, prev)
        kept.append(event)
    return len(kept)


def chain_figures(events: list[Event], reps: int, say: Say) -> list[Figure]:
    """Seal and check ``events`` against encoding and decoding the same events plainly,
    the cases taken in turn (GC paused, as a store's bulk read runs)."""
    n = len(events)
    say(f"digest chain: seal and check {n:,} events")
    bodies, _ = seal(events, GENESIS)
    encoded, sealed, decoded, checked = (t / n * 1e6 for t in medians(reps, [
        partial(timed, partial(_encode_all, events), gc_off=True),
        partial(timed, partial(_seal_all, events), gc_off=True),
        partial(timed, partial(_decode_all, bodies), gc_off=True),
        partial(timed, partial(_check_all, bodies), gc_off=True),
    ]))
    return [
        figure("chain.seal", sealed, "µs/event", encoded, "encode (canonical JSON) only",
               "seal: encode + sha256 over the previous digest and the bytes + splice"),
        figure("chain.check", checked, "µs/event", decoded, "decode_stored (msgspec) only",
               "decode_record: the digest checked against the one before, then decoded"),
    ]

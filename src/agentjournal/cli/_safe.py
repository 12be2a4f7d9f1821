"""Text for a terminal: content from a run is shown, never executed.

A run's content comes from tools, models and people: it can hold a clipboard
write (OSC 52), a screen clear, a carriage return that overwrites the line, C1
controls, or bidi and invisible characters that make text display as other
than it is. One rule, applied where human-readable output is written:

    a control, format, surrogate or line/paragraph-separator character
    (Unicode categories Cc, Cf, Cs, Zl, Zp) and any unassigned code point (Cn)
    is written as ``\\xNN`` (below U+0100) or ``<U+XXXX>``; everything else as
    it is. With ``multiline``, newlines and tabs are kept for the layout.

Rich markup in content (``[bold]``) is never parsed either: print through
``rich.text.Text`` (as ``_base.table`` does), never through a markup string.
JSON output keeps the exact values: the same characters are spelt ``\\uXXXX``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

import click
import msgspec

_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"})
# Printable ASCII is never hidden: only other characters are looked at.
_CANDIDATE = re.compile(r"[^\x20-\x7e]")


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) in _HIDDEN


def _shown(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"<U+{code:04X}>"


def visible(text: str, *, multiline: bool = False) -> str:
    """``text`` with every character a terminal could act on made visible."""
    if text.isprintable():  # the common case, checked in C: nothing can be hidden
        return text
    kept = "\n\t" if multiline else ""

    def show(match: re.Match[str]) -> str:
        ch = match.group()
        return ch if ch in kept or not _hidden(ch) else _shown(ch)

    return _CANDIDATE.sub(show, text)


def cells(rows: Iterable[Sequence[str]]) -> list[tuple[str, ...]]:
    """Table rows with every cell made visible (for ``_base.table``)."""
    return [tuple(visible(cell) for cell in row) for row in rows]


def echo(text: str, *, err: bool = False) -> None:
    """One human-readable line, made visible (stderr with ``err``)."""
    click.echo(visible(text), err=err)


# --- JSON ------------------------------------------------------------------------------


def _json_escape(match: re.Match[str]) -> str:
    ch = match.group()
    if not _hidden(ch):
        return ch
    code = ord(ch)
    if code > 0xFFFF:  # JSON spells an astral character as a UTF-16 surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


# msgspec already escapes C0 controls inside strings; outside strings JSON holds only
# ASCII, so every non-ASCII character found is inside a string and may be \u-escaped.
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def json_text(encoded: bytes) -> str:
    """JSON ``encoded`` by msgspec, with the hidden characters it leaves raw (DEL, C1,
    bidi, zero-width, tags, separators) spelt ``\\uXXXX``: the same value, safe to print."""
    lines = encoded.decode().split("\n")  # indented JSON: look only at lines that need it
    return "\n".join(line if line.isprintable() else
                     _NON_ASCII.sub(_json_escape, line.replace("\x7f", "\\u007f"))
                     for line in lines)


def emit_json(value: Any) -> None:
    """``value`` as indented JSON on stdout, safe for a terminal."""
    click.echo(json_text(msgspec.json.format(msgspec.json.encode(value), indent=2)))

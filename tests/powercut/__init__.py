"""A power cut, simulated for SQLite: ``shim.c`` preloaded into a writer process logs
every write and sync of the files in one directory; ``image`` rebuilds them as the disk
held them at each one's last sync, as if no unsynced write had reached it."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

SHIM = Path(__file__).with_name("shim.c")
_HEAD = struct.Struct("<cHqI")  # op, path length, offset or length, data length


def build(into: Path) -> Path:
    """The shim, compiled into ``into``. Without gcc the test is skipped, saying why (in
    CI it fails: .ci/run installs gcc)."""
    if shutil.which("gcc") is None:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(
            "the power-cut shim needs gcc (apt install gcc)")
    shim = into / "powercut.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM), "-ldl"],
                   check=True, capture_output=True)
    return shim


def environment(shim: Path, directory: Path, log: Path) -> dict[str, str]:
    return {"LD_PRELOAD": str(shim), "AJ_POWERCUT_DIR": f"{directory.resolve()}/",
            "AJ_POWERCUT_LOG": str(log)}


def image(directory: Path, log: Path, into: Path, before: dict[str, bytes]) -> None:
    """Write into ``into`` each file of ``directory`` as of its last sync. ``before``:
    the files' contents (by name) when the logged process started. The SQLite
    wal-index (``-shm``) is left out: it is memory, rebuilt from the WAL on open."""
    now = {name: bytearray(data) for name, data in before.items()}
    synced = dict(before)
    data, at = log.read_bytes(), 0
    while at + _HEAD.size <= len(data):
        op, plen, offset, length = _HEAD.unpack_from(data, at)
        at += _HEAD.size
        name = Path(data[at:at + plen].decode()).name
        body = data[at + plen:at + plen + length]
        at += plen + length
        if op == b"W":
            file = now.setdefault(name, bytearray())
            file.extend(bytes(max(0, offset + length - len(file))))
            file[offset:offset + length] = body
        elif op == b"T":
            file = now.setdefault(name, bytearray())
            del file[offset:]
            file.extend(bytes(offset - len(file)))
        elif op == b"S":
            synced[name] = bytes(now.get(name, b""))
        elif op == b"U":
            now.pop(name, None)
            synced.pop(name, None)
    into.mkdir()
    for name, content in synced.items():
        if not name.endswith("-shm"):
            (into / name).write_bytes(content)

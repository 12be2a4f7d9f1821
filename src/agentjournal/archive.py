"""Cold storage for the logs of runs gc deleted from the hot store (retention.py).

An archive holds one file per run, ``<run_id>.jsonl.gz``: gzip of JSON Lines, a
header line then the run's stored records byte for byte (as ``Store.records``
returns them), so a restore brings back the very bytes that were deleted::

    {"format":"agentjournal-archive","version":1,"run_id":"q3","events":41,"digest":"<sha256>"}
    <record 1>
    ...

``digest`` is ``records_digest`` of the records, the same digest the run's
tombstone keeps. ``file://`` directories now; an object store is another class
with the same three methods.
"""

from __future__ import annotations

import gzip
import os
import zlib
from contextlib import suppress
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

import msgspec

from .errors import JournalError
from .store.base import records_digest, validate_run_id

FORMAT = "agentjournal-archive"
VERSION = 1
SUFFIX = ".jsonl.gz"


class ArchiveError(JournalError):
    """An archive that cannot be used: a bad URL, a missing or damaged file."""

    def __init__(self, where: str, reason: str, *, run_id: str | None = None,
                 missing: bool = False) -> None:
        super().__init__(f"archive {where}: {reason}", run_id=run_id)
        self.where = where
        self.reason = reason
        self.missing = missing


class _Header(msgspec.Struct, frozen=True):
    format: str
    version: int
    run_id: str
    events: int
    digest: str


class Archive(Protocol):
    """Where archived logs live. ``put`` returns only once the file is durable."""

    url: str

    def put(self, run_id: str, data: bytes) -> None: ...

    def get(self, run_id: str) -> bytes: ...

    def size(self, run_id: str) -> int | None: ...


class DirectoryArchive:
    """A local directory (``file:///path``): each file written to ``.tmp``, fsynced,
    renamed into place and the directory fsynced, so a file there is whole."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.url = f"file://{self.path.absolute()}"

    def _file(self, run_id: str) -> Path:
        return self.path / f"{validate_run_id(run_id)}{SUFFIX}"

    def put(self, run_id: str, data: bytes) -> None:
        path = self._file(run_id)
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(tmp)
            raise ArchiveError(self.url, f"cannot write {path.name} ({exc})",
                               run_id=run_id) from exc

    def get(self, run_id: str) -> bytes:
        path = self._file(run_id)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise ArchiveError(self.url, f"holds no {path.name}", run_id=run_id,
                               missing=True) from None
        except OSError as exc:
            raise ArchiveError(self.url, f"cannot read {path.name} ({exc})",
                               run_id=run_id) from exc

    def size(self, run_id: str) -> int | None:
        try:
            return self._file(run_id).stat().st_size
        except FileNotFoundError:
            return None


def open_archive(url: str) -> Archive:
    """The archive at ``url``: ``file:///absolute/dir`` (created on first write)."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        raise ArchiveError(url, f"unknown scheme {parts.scheme!r}: give a file:/// URL "
                           "naming a directory")
    if parts.netloc not in ("", "localhost"):
        raise ArchiveError(url, "a file:// URL names a local directory: file:///path")
    path = unquote(parts.path)
    if not path or "\0" in path:
        raise ArchiveError(url, "no directory named")
    return DirectoryArchive(path)


def pack(run_id: str, records: list[bytes]) -> bytes:
    """The archive file of a run's log (deterministic: no time stamp in the gzip header)."""
    header = _Header(FORMAT, VERSION, run_id, len(records), records_digest(records))
    text = b"\n".join([msgspec.json.encode(header), *records]) + b"\n"
    return gzip.compress(text, compresslevel=6, mtime=0)


def unpack(run_id: str, data: bytes, where: str) -> tuple[list[bytes], str]:
    """(records, digest) of an archive file, checked against its header: the run, the
    count and the digest. Anything else is ``ArchiveError``."""
    try:
        lines = gzip.decompress(data).split(b"\n")
    except (OSError, EOFError, zlib.error) as exc:
        raise ArchiveError(where, f"{run_id}{SUFFIX} does not decompress ({exc})",
                           run_id=run_id) from None
    try:
        header = msgspec.json.decode(lines[0], type=_Header)
    except msgspec.DecodeError as exc:
        raise ArchiveError(where, f"{run_id}{SUFFIX} has no readable header ({exc})",
                           run_id=run_id) from None
    records = lines[1:-1]
    problem = (
        "is not an agentjournal archive" if header.format != FORMAT
        else f"is format version {header.version}, newer than this release reads"
        if header.version > VERSION
        else f"holds run {header.run_id!r}" if header.run_id != run_id
        else f"holds {len(records)} records, its header says {header.events}"
        if len(records) != header.events or lines[-1] != b""
        else "does not match its digest" if records_digest(records) != header.digest
        else None
    )
    if problem:
        raise ArchiveError(where, f"{run_id}{SUFFIX} {problem}", run_id=run_id)
    return records, header.digest

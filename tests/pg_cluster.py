"""A throwaway PostgreSQL cluster for tests that restart or stop the server.

Such a test must never touch the machine's own server (others use it): it gets a cluster
of its own, made by ``initdb`` in a fresh temporary directory, listening on a free port of
127.0.0.1 with its socket in that directory, and removed afterwards. Every ``pg_ctl``
call names that directory, so no other cluster can be reached. PostgreSQL refuses to run
as root: as root, the cluster runs as the ``postgres`` OS user (``runuser``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

#: Generous: a start or stop on a machine loaded by others may take a while.
PG_CTL_WAIT = 120


def pg_bin(name: str) -> str | None:
    """``initdb`` or ``pg_ctl``: on PATH, else in Debian's versioned directory."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def missing_tools() -> str | None:
    """Why a throwaway cluster cannot be made here, or None."""
    absent = [name for name in ("initdb", "pg_ctl") if pg_bin(name) is None]
    if absent:
        return f"no {' or '.join(absent)} here to make a throwaway PostgreSQL cluster"
    if os.geteuid() == 0 and (shutil.which("runuser") is None or not _has_user("postgres")):
        return "running as root, and no postgres OS user (with runuser) to run a cluster as"
    return None


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThrowawayCluster:
    """``with ThrowawayCluster() as pg:`` then ``pg.url``; ``pg.restart()`` as often as
    needed. The directory (data, socket, log) is deleted on exit, the server stopped."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="agentjournal-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self._as, str(pg_bin(tool)), *args], capture_output=True,
                              text=True, timeout=PG_CTL_WAIT + 30)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}\n{log}")

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
                  "-t", str(PG_CTL_WAIT), *args)

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c max_connections=300")
        self._pg_ctl("-o", options, "start")

    def restart(self) -> None:
        """A fast restart: every connection is cut, as a real server restart cuts them."""
        self._pg_ctl("-m", "fast", "restart")

    def stop(self) -> None:
        self._pg_ctl("-m", "immediate", "stop")

    def __enter__(self) -> ThrowawayCluster:
        try:
            # No fsync while the cluster is made: a crash here loses only this directory.
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "--no-sync", "--no-instructions", "-E", "UTF8")
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):  # already down: nothing to stop
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

"""Workspace checkpoints: the files an agent edits, versioned in a shadow git store.

The log makes the run recoverable; it does nothing for the files the run changed. A
:class:`Workspace` keeps every version of a directory in a git store of its own, outside
the directory (the user's ``.git`` and history are never touched; ``.gitignore`` is
honoured), with one ref per run: ``refs/agentjournal/<run_id>``. Git's own plumbing does
the work (``add``, ``write-tree``, ``commit-tree``, ``update-ref``, ``read-tree``): no
hand-written object store, no hooks, no user config. A directory holding a repository
of its own (``vendor/lib/.git``) is versioned file by file like any other; its ``.git``
is neither versioned nor touched.

Guards: a directory with more than ``max_files`` files, or holding a file larger than
``max_file_bytes``, is not committed; the checkpoint records why.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import msgspec

from .errors import JournalError
from .events import Event, EventType
from .journal import open_journal
from .store import Store

MAX_FILES = 50_000
MAX_FILE_BYTES = 100 * 1024 * 1024
MAX_LISTED = 200  # changed paths kept in an event; the count is always whole
EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's id of the empty file
PLACEHOLDER = ".agentjournal-walk-in"  # an index entry that makes git walk into a directory
_IDENTITY = {"GIT_AUTHOR_NAME": "agentjournal", "GIT_AUTHOR_EMAIL": "agentjournal@localhost",
             "GIT_COMMITTER_NAME": "agentjournal",
             "GIT_COMMITTER_EMAIL": "agentjournal@localhost"}


class WorkspaceError(JournalError):
    """git is missing, or refused: the message says which and what to do."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One version of the workspace: its commit, or why none was made."""

    commit: str | None = None
    changed: list[str] = msgspec.field(default_factory=list)  # paths, at most MAX_LISTED
    count: int = 0  # changed paths, all of them
    skipped: str | None = None


def default_shadow(directory: Path) -> Path:
    """Where the shadow store of ``directory`` lives: the user's cache, by its path."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = hashlib.sha256(str(directory).encode()).hexdigest()[:16]
    return cache / "agentjournal" / "workspaces" / f"{directory.name}-{name}.git"


class Workspace:
    """A directory an agent edits, and its shadow git store (created on first use)."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 shadow: str | os.PathLike[str] | None = None, max_files: int = MAX_FILES,
                 max_file_bytes: int = MAX_FILE_BYTES) -> None:
        self.directory = Path(directory).resolve()
        self.shadow = Path(shadow).resolve() if shadow else default_shadow(self.directory)
        if self.shadow == self.directory or self.directory in self.shadow.parents:
            raise ValueError(f"the shadow store {self.shadow} must be outside the "
                             f"workspace {self.directory}")
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes

    # --- git -----------------------------------------------------------------------

    def _git(self, *args: str, index: Path | None = None, tree: bool = True,
             stdin: str | None = None) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(_IDENTITY, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
                   GIT_TERMINAL_PROMPT="0")
        if tree:
            env.update(GIT_DIR=str(self.shadow), GIT_WORK_TREE=str(self.directory))
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        try:
            done = subprocess.run(["git", "-c", "core.autocrlf=false", "-c", "core.quotepath=off",
                                   *args], cwd=self.directory, env=env, capture_output=True,
                                  text=True, check=False, input=stdin)
        except FileNotFoundError:
            raise WorkspaceError("workspace checkpoints need git on the PATH (Debian: apt "
                                 "install git)") from None
        if done.returncode:
            raise WorkspaceError(f"git {args[0]} failed in the shadow store {self.shadow}: "
                                 f"{done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def _ready(self) -> None:
        if not self.directory.is_dir():
            raise WorkspaceError(f"the workspace {self.directory} is not a directory")
        if not (self.shadow / "HEAD").exists():
            self.shadow.parent.mkdir(parents=True, exist_ok=True)
            self._git("init", "--quiet", "--bare", str(self.shadow), tree=False)
            self._git("config", "core.bare", "false")  # its work tree is the workspace

    @staticmethod
    def ref(run_id: str) -> str:
        return f"refs/agentjournal/{run_id}"

    def head(self, run_id: str) -> str | None:
        self._ready()
        return self._head_and_tree(run_id)[0]

    def _head_and_tree(self, run_id: str) -> tuple[str | None, str | None]:
        """The run's newest checkpoint and its tree, in one git call."""
        out = self._git("for-each-ref", "--format=%(objectname) %(tree)", self.ref(run_id))
        commit, _, tree = out.strip().partition(" ")
        return (commit or None), (tree or None)

    # --- taking a version ----------------------------------------------------------

    def _stage_all(self, run_id: str) -> tuple[Path, str | None]:
        """The run's own index holding the directory as it is now, or why it cannot.

        git lists a directory holding its own ``.git`` as one entry, and ``add`` would
        store it as a gitlink (its files in no version); but it walks into any directory
        the index has an entry under. So each one found gets a placeholder entry (the
        ``add -A`` drops it, as a deleted file) and the directory is listed again. git
        never lists or adds a ``.git`` itself."""
        index = self.shadow / f"index-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"
        walked: set[str] = set()
        while True:
            listed = self._git("ls-files", "-z", "--cached", "--others", "--exclude-standard",
                               index=index).split("\0")
            nested, skipped = self._guard(filter(None, listed))
            if skipped is not None:
                return index, skipped
            if not nested - walked:
                break
            self._walk_into(index, nested - walked)
            walked |= nested
        self._git("add", "-A", ".", index=index)
        return index, None

    def _guard(self, listed: Iterable[str]) -> tuple[set[str], str | None]:
        """The nested repositories git ``listed``, and why a guard stops the version."""
        nested: set[str] = set()
        present = 0
        for name in listed:
            if name.endswith("/"):  # an untracked directory holding its own .git
                nested.add(name.rstrip("/"))
                continue
            try:
                found = os.lstat(self.directory / name)  # a link's own size
            except FileNotFoundError:
                continue  # deleted (still in the index): git records that
            if stat.S_ISDIR(found.st_mode):  # a gitlink an older version stored
                nested.add(name)
                continue
            present += 1
            if present > self.max_files:  # (stops there: a huge tree costs no more)
                return nested, f"over the limit of {self.max_files:,} files"
            if found.st_size > self.max_file_bytes:
                return nested, (f"{name} is {found.st_size:,} bytes, over the limit of "
                                f"{self.max_file_bytes:,}")
        return nested, None

    def _walk_into(self, index: Path, nested: set[str]) -> None:
        """Make git list the files of ``nested`` directories: no gitlink, a placeholder."""
        self._git("update-index", "--force-remove", "--", *nested, index=index)
        self._git("update-index", "-z", "--index-info", index=index,
                  stdin="".join(f"100644 {EMPTY_BLOB}\t{n}/{PLACEHOLDER}\0"
                                for n in sorted(nested)))

    def checkpoint(self, run_id: str, message: str) -> Checkpoint:
        """Commit the directory on the run's ref; the commit and what changed since the
        run's previous one (``commit`` is the previous one when nothing changed)."""
        self._ready()
        index, skipped = self._stage_all(run_id)
        if skipped is not None:
            return Checkpoint(skipped=skipped)
        tree = self._git("write-tree", index=index).strip()
        parent, parent_tree = self._head_and_tree(run_id)
        if parent is not None and parent_tree == tree:
            return Checkpoint(commit=parent)
        changed = self._changed(parent, tree)
        args = ["commit-tree", tree, "-m", message, *(["-p", parent] if parent else [])]
        commit = self._git(*args).strip()
        self._git("update-ref", self.ref(run_id), commit, *([parent] if parent else []))
        return Checkpoint(commit=commit, changed=changed[:MAX_LISTED], count=len(changed))

    def _tree(self, commit: str) -> str:
        return self._git("rev-parse", f"{commit}^{{tree}}").strip()

    def _changed(self, before: str | None, after: str) -> list[str]:
        if before is None:
            return sorted(p for p in self._git("ls-tree", "-r", "-z", "--name-only",
                                               after).split("\0") if p)
        out = self._git("diff-tree", "-r", "-z", "--name-only", "--no-renames", before, after)
        return sorted(p for p in out.split("\0") if p)

    def drift(self, run_id: str, commit: str) -> list[str] | None:
        """Paths whose content differs from ``commit`` in the directory now; None when a
        guard stops the comparison (the next checkpoint records why)."""
        self._ready()
        index, skipped = self._stage_all(run_id)
        if skipped is not None:
            return None
        return self._changed(commit, self._git("write-tree", index=index).strip())

    # --- reading and restoring -----------------------------------------------------

    def diff(self, before: str | None, after: str) -> str:
        """What ``after`` changed from ``before`` (from nothing when None), as a patch."""
        self._ready()
        if before is None:
            return self._git("show", "--format=", "--patch", "--no-renames", after)
        return self._git("diff", "--no-renames", before, after)

    def held(self, run_id: str, commits: Sequence[str]) -> bool:
        """Whether the directory as it is now is one of ``commits`` (nothing unsaved)."""
        self._ready()
        index, skipped = self._stage_all(run_id)
        if skipped is not None:
            return False
        tree = self._git("write-tree", index=index).strip()
        trees = self._git("rev-parse", *(f"{c}^{{tree}}" for c in commits)) if commits else ""
        return tree in trees.split()

    def restore(self, run_id: str, commit: str) -> list[str]:
        """Make the directory's files those of ``commit``: changed ones rewritten, ones
        the commit lacks removed (ignored files are left alone). The run's ref moves
        there, so the next checkpoint's parent is what is on disk. Returns the paths
        that differ from the run's version before (none when it had none)."""
        self._ready()
        index, skipped = self._stage_all(run_id)
        if skipped is not None:
            raise WorkspaceError(f"the workspace cannot be restored: {skipped}")
        if linked := self._gitlinks(commit):
            raise WorkspaceError(
                f"the version {commit[:12]} holds {', '.join(linked)} as a nested "
                "repository's commit, not its files (an older agentjournal made it): "
                "restoring it would delete them")
        before = self._head_and_tree(run_id)[0]
        self._git("read-tree", "-u", "--reset", commit, index=index)
        self._git("update-ref", self.ref(run_id), commit)
        return self._changed(before, self._tree(commit)) if before else []

    def _gitlinks(self, commit: str) -> list[str]:
        """The directories ``commit`` stores as gitlinks (older versions did so for a
        directory holding its own ``.git``)."""
        entries = self._git("ls-tree", "-r", "-z", commit).split("\0")
        return [e.partition("\t")[2] for e in entries if e.startswith("160000 ")]


# --- a run's versions, from its log ------------------------------------------------------


class Version(msgspec.Struct, frozen=True, kw_only=True):
    """The workspace as a run recorded it at ``seq``: the checkpoint in force there."""

    run_id: str
    seq: int  # the checkpoint's own seq (at or before the one asked about)
    commit: str | None
    skipped: str | None = None
    previous: str | None = None  # the checkpoint before it
    changed: list[str] = msgspec.field(default_factory=list)
    count: int = 0


def versions(events: Iterable[Event]) -> tuple[Workspace | None, list[Version]]:
    """The run's workspace (as recorded) and every checkpoint in its log, oldest first."""
    found: list[Version] = []
    where: tuple[str, str] | None = None
    for e in events:
        if e.type is not EventType.WORKSPACE_CHECKPOINT:
            continue
        p = e.payload
        if "directory" in p:
            where = (p["directory"], p["shadow"])
        previous = next((v.commit for v in reversed(found) if v.commit), None)
        found.append(Version(run_id=e.run_id, seq=e.seq, commit=p.get("commit"),
                             skipped=p.get("skipped"), previous=previous,
                             changed=list(p.get("changed", ())), count=p.get("count", 0)))
    return (Workspace(where[0], shadow=where[1]) if where else None), found


def version_at(versions_: Sequence[Version], seq: int | None) -> Version | None:
    """The checkpoint in force at ``seq`` (the last one when None)."""
    at = [v for v in versions_ if seq is None or v.seq <= seq]
    return at[-1] if at else None


def restore_workspace(store: Store, run_id: str, at_seq: int, *, by: str, force: bool = False,
                      reason: str = "") -> Version:
    """Put the run's files back as they were at ``at_seq``, and record it in the log (the
    model is told when the run goes on). Refused (WorkspaceError) when the directory
    holds changes that none of the run's checkpoints holds, unless ``force``."""
    with open_journal(store, run_id, owner=f"decision:{by}", must_exist=True) as j:
        ws, found = versions(j.store.read(run_id))
        target = version_at(found, at_seq)
        if ws is None or target is None or target.commit is None:
            raise WorkspaceError(f"run {run_id!r} has no workspace version at seq {at_seq}"
                                 + (f" ({target.skipped})" if target and target.skipped else ""))
        commits = [v.commit for v in found if v.commit]
        if not force and not ws.held(run_id, commits):
            raise WorkspaceError(
                f"the workspace {ws.directory} has changes that no checkpoint of run "
                f"{run_id!r} holds; restoring would lose them. Save them, or use --force")
        changed = ws.restore(run_id, target.commit)
        j.record(EventType.WORKSPACE_CHECKPOINT, cause="restore", commit=target.commit,
                 restored_seq=target.seq, by=by, reason=reason, changed=changed[:MAX_LISTED],
                 count=len(changed))
    return target


def files_at_fork(run_id: str, log: Sequence[Event], at_seq: int, *,
                  force: bool) -> Callable[[str], object] | None:
    """A fork of ``run_id`` at ``at_seq`` starts from the files of that seq (forks.fork asks
    this): refused (WorkspaceError) when the directory holds changes
    that none of the run's checkpoints holds, unless ``force``; else the restore, for the
    fork's id once its log is written. None when the run has no version at ``at_seq``."""
    ws, found = versions(log[:at_seq])
    start = version_at(found, at_seq)
    if ws is None or start is None or start.commit is None:
        return None
    commit = start.commit
    if not force and not ws.held(run_id, [v.commit for v in versions(log)[1] if v.commit]):
        raise WorkspaceError(
            f"the workspace {ws.directory} has changes that no checkpoint of run "
            f"{run_id!r} holds; the fork would lose them. Save them, or force")
    return lambda new_id: ws.restore(new_id, commit)


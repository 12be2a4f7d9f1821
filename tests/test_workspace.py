"""Workspace checkpoints: a scripted agent edits files turn by turn; every turn's version
is in a shadow git store (the user's own repository and history untouched), its commit
recorded with the turn's results; versions are shown, restored byte for byte and forked
from; a change made while the run was down is told to the model before it is asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentjournal import (
    Agent,
    ConflictError,
    EventType,
    ModelRequest,
    ModelResponse,
    Rules,
    ScriptedModel,
    calls,
    decide_approval,
    fold,
    fork,
    open_store,
    reply,
    tool,
)
from agentjournal.store import Store
from agentjournal.workspace import Workspace, WorkspaceError, restore_workspace

from .conftest import backend_params
from .test_crash_models import ROOT

E = EventType
TURNS = 5


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: its own git repository with one commit, and a .gitignore."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("the project\n")
    (root / ".gitignore").write_text("*.log\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-qm", "init")
    return root


def editor(ws: Workspace, *, requests: list[ModelRequest] | None = None,
           approve: bool = False, turns: int = TURNS) -> Agent:
    root = ws.directory

    @tool(effect="idempotent", identity=["path", "text"], local=True)
    def write_file(path: str, text: str) -> str:
        """Write `text` to `path` in the workspace."""
        (root / path).write_text(text)
        return f"wrote {path}"

    @tool(effect="idempotent", identity=["path"], local=True)
    def delete_file(path: str) -> str:
        """Delete `path`."""
        (root / path).unlink()
        return f"deleted {path}"

    def seen(response: ModelResponse) -> Any:
        def turn(request: ModelRequest) -> ModelResponse:
            if requests is not None:
                requests.append(request)
            return response
        return turn

    script = []
    for i in range(turns):  # turn i writes f{i}.txt and rewrites notes.md; turn 3 deletes f0
        edits = [("write_file", {"path": f"f{i}.txt", "text": f"file {i}\n"}),
                 ("write_file", {"path": "notes.md", "text": f"notes after turn {i}\n"})]
        if i == 3:
            edits.append(("delete_file", {"path": "f0.txt"}))
        script.append(seen(calls(*edits)))
    script.append(seen(reply("edited")))
    policy = Rules(require_approval={"delete_file"}) if approve else None
    return Agent(ScriptedModel(script), [write_file, delete_file], workspace=ws,
                 policy=policy, parallel_calls=1)


def checkpoints(store: Store, run_id: str) -> list[Any]:
    return [e for e in store.read(run_id) if e.type is E.WORKSPACE_CHECKPOINT]


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}


@backend_params()
def test_every_turn_is_a_version_and_restore_gives_its_files(
        store_url: str, project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git")
    history, user_index = git(project, "log", "--format=%H %s"), (
        project / ".git" / "index").read_bytes()
    (project / "debug.log").write_text("ignored\n")
    snapshots: dict[int, dict[str, bytes]] = {}
    with open_store(store_url) as store:
        agent = editor(ws)
        assert agent.run(store, "r1", "edit the files").status == "finished"
        marks = checkpoints(store, "r1")
        # The start, then one version per turn, each stored with that turn's results.
        assert [m.payload["cause"] for m in marks] == ["start"] + ["turn"] * TURNS
        log = list(store.read("r1"))
        for m in marks[1:]:
            assert log[m.seq - 2].type is E.TOOL_CALL_COMPLETED  # right after its results
            assert m.payload["commit"] and m.payload["changed"]
        assert "debug.log" not in str([m.payload for m in marks])  # .gitignore honoured
        assert marks[4].payload["changed"] == ["f0.txt", "f3.txt", "notes.md"]
        final = files(project)
        # Restore turn 3's version (seq of its checkpoint) byte for byte, then the last.
        turn3 = marks[3].seq
        restore_workspace(store, "r1", turn3, by="ana")
        expected = {"README.md": b"the project\n", ".gitignore": b"*.log\n",
                    "debug.log": b"ignored\n", "notes.md": b"notes after turn 2\n",
                    **{f"f{i}.txt": f"file {i}\n".encode() for i in range(3)}}
        assert files(project) == expected
        snapshots[turn3] = files(project)
        restore_workspace(store, "r1", marks[-1].seq, by="ana")
        assert files(project) == final
        assert fold(list(store.read("r1"))).workspace.commit == marks[-1].payload["commit"]
    # The user's own repository: same history, same index.
    assert git(project, "log", "--format=%H %s") == history
    assert (project / ".git" / "index").read_bytes() == user_index


def test_a_turn_of_read_only_calls_looks_for_no_version(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    @tool(effect="read_only")
    def read_file(path: str) -> str:
        """Read a file of the project."""
        return (project / path).read_text()

    ws = Workspace(project, shadow=tmp_path / "shadow")
    looked: list[str] = []
    real = Workspace.checkpoint
    monkeypatch.setattr(Workspace, "checkpoint", lambda self, run_id, message: (
        looked.append(message), real(self, run_id, message))[1])
    agent = Agent(ScriptedModel([calls(("read_file", {"path": "README.md"})),
                                 calls(("read_file", {"path": ".gitignore"})), reply("read")]),
                  [read_file], workspace=ws)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert agent.run(store, "reader", "read").status == "finished"
        events = list(store.read("reader"))
    assert len(looked) == 1 and looked[0].endswith("start")  # no git run after the reads
    assert [e.payload["cause"] for e in events if e.type is E.WORKSPACE_CHECKPOINT] == ["start"]
    completed = [e for e in events if e.type is E.TOOL_CALL_COMPLETED]
    assert [e.payload["result"] for e in completed] == ["the project\n", "*.log\n"]


def test_restore_refuses_to_lose_unsaved_changes(project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git")
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        editor(ws).run(store, "r1", "edit")
        (project / "mine.txt").write_text("not in any checkpoint\n")
        first = checkpoints(store, "r1")[1].seq
        with pytest.raises(WorkspaceError, match="no checkpoint of run 'r1' holds"):
            restore_workspace(store, "r1", first, by="ana")
        assert (project / "mine.txt").exists()
        restore_workspace(store, "r1", first, by="ana", force=True)
        assert not (project / "mine.txt").exists() and (project / "f0.txt").exists()


def test_a_workspace_over_the_file_limit_is_skipped_and_recorded(
        project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git", max_files=4)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert editor(ws, turns=3).run(store, "r1", "edit").status == "finished"
        marks = checkpoints(store, "r1")
        assert marks[0].payload.get("commit")  # 3 files at the start: versioned
        skipped = [m.payload["skipped"] for m in marks if m.payload.get("skipped")]
        assert skipped and "over the limit of 4" in skipped[0]
        assert fold(list(store.read("r1"))).workspace.commit is None


def test_a_change_made_while_the_run_was_down_is_told_before_the_next_turn(
        project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git")
    requests: list[ModelRequest] = []
    agent = editor(ws, requests=requests, approve=True)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert agent.run(store, "r1", "edit").status == "waiting_approval"
        waiting = fold(list(store.read("r1")))
        (project / "f1.txt").write_text("edited by a person\n")  # while the run is down
        decide_approval(store, "r1", next(iter(waiting.approvals)), approved=True, by="ana")
        agent.run(store, "r1")
        drift = [m for m in checkpoints(store, "r1") if m.payload["cause"] == "drift"]
        assert len(drift) == 1 and drift[0].payload["changed"] == ["f1.txt"]
        log = list(store.read("r1"))
        turns_after = [e.seq for e in log if e.type is E.MODEL_TURN and e.seq > drift[0].seq]
        assert turns_after  # recorded before the model was asked again
        told = [m for m in requests[4].messages if "since its last recorded version" in
                m.content]
        assert len(told) == 1 and "f1.txt" in told[0].content
        # The note waited for the results of the calls the model was awaiting: every
        # turn's calls are still followed by their results, as providers require.
        messages = requests[4].messages
        for i, m in enumerate(messages):
            if m.tool_calls:
                answers = messages[i + 1:i + 1 + len(m.tool_calls)]
                assert [a.role for a in answers] == ["tool"] * len(m.tool_calls)


def test_fork_starts_from_the_files_of_its_seq(project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git")
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        editor(ws).run(store, "r1", "edit")
        at = checkpoints(store, "r1")[2].seq  # after turn 1
        new = fork(store, "r1", at, "r1-fork")
        assert sorted(files(project)) == [".gitignore", "README.md", "f0.txt", "f1.txt",
                                          "notes.md"]
        assert fold(list(store.read(new))).workspace.commit == \
            checkpoints(store, "r1")[2].payload["commit"]


def test_a_fork_refused_changes_no_file(project: Path, tmp_path: Path) -> None:
    """A fork into an id that is taken is refused before the files are touched."""
    ws = Workspace(project, shadow=tmp_path / "shadow.git")
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        editor(ws).run(store, "r1", "edit")
        editor(ws).run(store, "r2", "edit")
        before = {name: (project / name).read_bytes() for name in files(project)}
        r2_ref = ws.head("r2")
        at = checkpoints(store, "r1")[2].seq
        with pytest.raises(ConflictError):
            fork(store, "r1", at, "r2")
        assert {name: (project / name).read_bytes() for name in files(project)} == before
        assert ws.head("r2") == r2_ref


def test_the_cli_shows_a_version_and_its_diff(project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git")
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with open_store(url) as store:
        editor(ws).run(store, "r1", "edit")
        at = checkpoints(store, "r1")[2].seq

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentjournal", *args, "--store", url],
                              capture_output=True, text=True, cwd=ROOT, timeout=60,
                              env={**os.environ, "COLUMNS": "200"})

    shown = json.loads(cli("workspace", "r1", "--at", str(at), "--json").stdout)
    assert shown["seq"] == at and shown["changed"] == ["f1.txt", "notes.md"]
    assert "+file 1" in shown["diff"] and "-notes after turn 0" in shown["diff"]
    text = cli("workspace", "r1", "--at", str(at))
    assert text.returncode == 0 and "2 file(s) changed" in text.stdout
    restored = cli("workspace", "r1", "--restore", str(at), "--by", "ana")
    assert restored.returncode == 0, restored.stderr
    assert not (project / "f2.txt").exists()
    none = cli("workspace", "nope")
    assert none.returncode == 2
    timeline = cli("show", "r1").stdout
    assert "workspace_checkpoint  turn: " in timeline and "f1.txt, notes.md" in timeline
    assert "restore by ana to seq" in timeline


@pytest.fixture(autouse=True)
def no_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # never the real one
    yield


@backend_params()
def test_a_kill_before_the_checkpoint_loses_neither_files_nor_versions(
        store_url: str, project: Path, tmp_path: Path) -> None:
    """SIGKILL after turn 2's calls changed the files, before their results and the
    version were stored: on resume the change is found and recorded, the calls are
    settled (idempotent: made again with the same keys), and every turn has a version."""
    shadow = tmp_path / "shadow.git"
    argv = [sys.executable, "-m", "tests.workspace_agent", "--store", store_url, "--run-id",
            "r1", "--dir", str(project), "--shadow", str(shadow)]
    killed = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "AGENTJOURNAL_FAULT": "before_checkpoint:4"})
    assert killed.returncode == -9, killed.stderr
    with open_store(store_url) as store:
        before = list(store.read("r1"))
        assert before[-1].type is E.TOOL_CALL_STARTED  # the turn's results died with it
    resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert resumed.stdout.strip() == "finished", resumed.stderr
    with open_store(store_url) as store:
        log = list(store.read("r1"))
        marks = [m.payload["cause"] for m in checkpoints(store, "r1")]
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    # Turn 2's files are found on resume (drift); its calls, made again with the same
    # keys, change nothing more; turns 3 and 4 follow.
    assert marks == ["start", "turn", "turn", "drift", "turn", "turn"]
    assert sorted(files(project)) == [".gitignore", "README.md", "f1.txt", "f2.txt",
                                      "f3.txt", "f4.txt", "notes.md"]


def test_a_guard_met_on_resume_records_a_skipped_version_and_the_run_goes_on(
        project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git", max_files=12)
    agent = editor(ws, approve=True)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert agent.run(store, "r1", "edit").status == "waiting_approval"
        for i in range(10):  # while the run waits, the directory outgrows the guard
            (project / f"extra{i}.txt").write_text("x\n")
        waiting = fold(list(store.read("r1")))
        decide_approval(store, "r1", next(iter(waiting.approvals)), approved=True, by="ana")
        assert agent.run(store, "r1").status == "finished"
        drift = [m.payload for m in checkpoints(store, "r1") if m.payload["cause"] == "drift"]
        assert len(drift) == 1 and "over the limit of 12" in drift[0]["skipped"]
        # The comparison was not made, so the model is told its files may have changed.
        told = [m.content for m in fold(list(store.read("r1"))).messages
                if "could not be compared" in m.content]
        assert len(told) == 1 and "over the limit of 12" in told[0]


def test_a_resume_after_a_skipped_version_compares_with_the_last_commit(
        project: Path, tmp_path: Path) -> None:
    """The last version was skipped by a guard; the run is resumed once the guard no
    longer holds: what changed since the last commit is recorded and told."""
    ws = Workspace(project, shadow=tmp_path / "shadow.git", max_files=12)
    requests: list[ModelRequest] = []
    agent = editor(ws, requests=requests, approve=True)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        for i in range(10):
            (project / f"extra{i}.txt").write_text("x\n")
        assert agent.run(store, "r1", "edit").status == "waiting_approval"
        assert fold(list(store.read("r1"))).workspace.commit is None  # skipped so far
        for i in range(10):  # while the run waits: back under the guard, one file changed
            (project / f"extra{i}.txt").unlink()
        (project / "README.md").write_text("edited by a person\n")
        waiting = fold(list(store.read("r1")))
        decide_approval(store, "r1", next(iter(waiting.approvals)), approved=True, by="ana")
        assert agent.run(store, "r1").status == "finished"
        drift = [m.payload for m in checkpoints(store, "r1") if m.payload["cause"] == "drift"]
        assert len(drift) == 1 and drift[0].get("commit"), drift
        assert "README.md" in drift[0]["changed"]
        told = [m for r in requests for m in r.messages
                if "since its last recorded version" in m.content]
        assert told and "README.md" in told[0].content


def test_a_file_over_the_size_limit_is_skipped_and_recorded(
        project: Path, tmp_path: Path) -> None:
    ws = Workspace(project, shadow=tmp_path / "shadow.git", max_file_bytes=100)
    (project / "big.bin").write_bytes(b"x" * 1000)
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert editor(ws, turns=2).run(store, "r1", "edit").status == "finished"
        skipped = {m.payload.get("skipped") for m in checkpoints(store, "r1")}
        assert skipped == {"big.bin is 1,000 bytes, over the limit of 100"}
        shadow_objects = git(tmp_path / "shadow.git", "count-objects", "-v")
        assert "count: 0" in shadow_objects and "in-pack: 0" in shadow_objects  # nothing added


def tree_of(file: Path) -> dict[str, bytes]:
    """Every file under ``file`` (a directory), with its bytes: what must not change."""
    return {p.relative_to(file).as_posix(): p.read_bytes() for p in sorted(file.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("committed", [True, False], ids=["cloned", "no-commit-yet"])
def test_files_in_a_nested_repository_are_versioned_and_restored(
        project: Path, tmp_path: Path, committed: bool) -> None:
    """A directory holding its own .git (a vendored clone, or one with no commit yet) is
    versioned file by file, never as a gitlink: its edits are in the turn's version, a
    restore puts its files back, and its own .git is neither versioned nor touched."""
    lib = project / "vendor" / "lib"
    lib.mkdir(parents=True)
    (lib / "lib.c").write_text("int v = 1;\n")
    (lib / ".gitignore").write_text("*.o\n")
    (lib / "lib.o").write_bytes(b"\x7fELF")  # ignored by the nested repo's own rules
    git(lib, "init", "-q")
    if committed:
        git(lib, "add", ".")
        git(lib, "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-qm", "v1")
    nested_git = tree_of(lib / ".git")

    @tool(effect="idempotent", identity=["path", "text"])
    def write_file(path: str, text: str) -> str:
        """Write `text` to `path` in the workspace."""
        (project / path).write_text(text)
        return f"wrote {path}"

    script = [calls(("write_file", {"path": "vendor/lib/lib.c", "text": "int v = 2;\n"}),
                    ("write_file", {"path": "vendor/lib/new.c", "text": "int w;\n"})),
              reply("edited")]
    ws = Workspace(project, shadow=tmp_path / "shadow.git")
    with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        agent = Agent(ScriptedModel(script), [write_file], workspace=ws, parallel_calls=1)
        assert agent.run(store, "r1", "edit the library").status == "finished"
        start, turn = checkpoints(store, "r1")
        assert turn.payload["changed"] == ["vendor/lib/lib.c", "vendor/lib/new.c"]
        stored = git(tmp_path / "shadow.git", "ls-tree", "-r", start.payload["commit"])
        assert "vendor/lib/lib.c" in stored and "vendor/lib/.gitignore" in stored
        assert " commit " not in stored and ".git/" not in stored and "lib.o" not in stored
        restore_workspace(store, "r1", start.seq, by="ana")
        assert (lib / "lib.c").read_text() == "int v = 1;\n"
        assert not (lib / "new.c").exists() and (lib / "lib.o").exists()
        restore_workspace(store, "r1", turn.seq, by="ana")
        assert (lib / "lib.c").read_text() == "int v = 2;\n"
        assert (lib / "new.c").read_text() == "int w;\n"
    assert tree_of(lib / ".git") == nested_git


def test_a_file_over_the_limit_in_a_nested_repository_is_skipped_and_recorded(
        project: Path, tmp_path: Path) -> None:
    """The guards see a nested repository's files like any others."""
    lib = project / "vendor" / "lib"
    lib.mkdir(parents=True)
    (lib / "big.bin").write_bytes(b"x" * 1000)
    git(lib, "init", "-q")
    git(lib, "add", ".")
    git(lib, "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-qm", "v1")
    ws = Workspace(project, shadow=tmp_path / "shadow.git", max_file_bytes=100)
    made = ws.checkpoint("r1", "start")
    assert made.skipped == "vendor/lib/big.bin is 1,000 bytes, over the limit of 100"
    assert made.commit is None

def test_a_version_holding_a_gitlink_is_never_restored_over_the_nested_files(
        project: Path, tmp_path: Path) -> None:
    """A version made before nested repositories were versioned file by file holds a
    gitlink where their files are: restoring it would delete them, so it is refused."""
    lib = project / "vendor" / "lib"
    lib.mkdir(parents=True)
    (lib / "lib.c").write_text("int v = 1;\n")
    git(lib, "init", "-q")
    git(lib, "add", ".")
    git(lib, "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-qm", "v1")
    shadow = tmp_path / "shadow.git"
    ws = Workspace(project, shadow=shadow)
    assert ws.checkpoint("r1", "now").commit
    env = {**os.environ, "GIT_DIR": str(shadow), "GIT_WORK_TREE": str(project),
           "GIT_INDEX_FILE": str(tmp_path / "old-index")}

    def old_git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=project, env=env, capture_output=True,
                              text=True, check=True).stdout.strip()

    old_git("add", "-A", ".")  # what an older version stored: vendor/lib as a gitlink
    old = old_git("commit-tree", old_git("write-tree"), "-m", "old")
    with pytest.raises(WorkspaceError, match="vendor/lib"):
        ws.restore("r1", old)
    assert (lib / "lib.c").read_text() == "int v = 1;\n"


@backend_params()
def test_a_resumed_fork_makes_its_file_edits_and_no_payment_again(
        store_url: str, project: Path, tmp_path: Path) -> None:
    """Forked after its second turn, the files are those of that turn; resumed, the fork
    makes its own edits (they are local to the run: the origin's are not its files) and
    every file its log says it wrote is on disk with that content. A payment the origin
    made after the fork point is an effect of the scope: served, never made again."""
    paid: list[str] = []

    @tool(effect="idempotent", identity=["path", "text"], local=True)
    def write_file(path: str, text: str) -> str:
        """Write `text` to `path` in the workspace."""
        (project / path).write_text(text)
        return f"wrote {path}"

    @tool(effect="irreversible", identity=["invoice"])
    def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        paid.append(invoice)
        return f"paid {invoice}"

    def write(path: str, text: str) -> tuple[str, dict[str, Any]]:
        return "write_file", {"path": path, "text": text}

    script = [calls(write("a.txt", "a0\n")),
              calls(write("a.txt", "a1\n"), write("b.txt", "b1\n")),
              calls(write("c.txt", "c2\n"), ("pay", {"invoice": "inv-1", "amount": 10})),
              calls(write("a.txt", "a3\n")),
              reply("done")]
    ws = Workspace(project, shadow=tmp_path / "shadow.git")

    def agent() -> Agent:
        return Agent(ScriptedModel(script), [write_file, pay], workspace=ws, parallel_calls=1)

    with open_store(store_url) as store:
        assert agent().run(store, "r1", "edit and pay").status == "finished"
        assert paid == ["inv-1"]
        log = list(store.read("r1"))
        paying = next(e.seq for e in log if e.type is E.TOOL_CALL_STARTED
                      and e.payload["tool"] == "pay")
        # After the second turn's version; and inside the third turn, its calls started
        # but not completed (the fork settles them on resume).
        for at in (checkpoints(store, "r1")[2].seq, paying):
            forked = fork(store, "r1", at, f"r1-fork-{at}")
            assert (project / "a.txt").read_text() == "a1\n"
            assert not (project / "c.txt").exists()
            assert agent().run(store, forked).status == "finished"
            state = fold(list(store.read(forked)))
            said = {}  # what the fork's log says each file holds: its last write
            for done in sorted(state.completed.values(), key=lambda c: c.seq):
                if done.args is not None and "path" in done.args:
                    said[done.args["path"]] = done.args["text"].encode()
            assert said == {"a.txt": b"a3\n", "b.txt": b"b1\n", "c.txt": b"c2\n"}
            assert {name: files(project)[name] for name in said} == said
            writes = [c for c in state.completed.values()
                      if c.seq > at and "path" in (c.args or {})]
            assert writes and {c.source for c in writes} == {"tool"}  # made by the fork
            assert paid == ["inv-1"]  # the world does not fork: the payment was served
            (payment,) = [c for c in state.completed.values() if "invoice" in (c.args or {})]
            assert payment.source == "scope"

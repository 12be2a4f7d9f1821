"""`agentjournal ui` over HTTP: every page's JSON twin, and its security (CSRF, the
token off loopback, decisions only with --allow-decisions, markup shown as text,
hostile run ids, no password from a store URL) on the store backends."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from agentjournal import EventType, open_store
from agentjournal.cli import cli
from agentjournal.fleet import queue_of
from agentjournal.ui import Viewer, create_app

from .ui_runs import (
    HOSTILE,
    approval_run,
    big_result_run,
    interrupted_run,
    long_run,
    markup_run,
    uncertain_run,
)

BASE = "http://127.0.0.1"


def made(url: str) -> None:
    store = open_store(url)
    try:
        approval_run(store, "pay-bob")
        uncertain_run(store, "wire-w1")
        markup_run(store, "markup")
        long_run(store, "long", 40)
    finally:
        store.close()


@pytest.fixture
def viewer(store_url: str) -> Iterator[tuple[str, TestClient]]:
    made(store_url)
    v = Viewer(store_url, allow_decisions=True, by="ops")
    try:
        yield store_url, TestClient(v.app, base_url=BASE, follow_redirects=False)
    finally:
        v.close()


def csrf_of(client: TestClient) -> str:
    page = client.get("/").text
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def log_of(url: str, run_id: str) -> list[Any]:
    store = open_store(url, readonly=True)
    try:
        return list(store.read(run_id))
    finally:
        store.close()


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite", "postgres"], indirect=True)
def test_every_page_answers_as_json(viewer: tuple[str, TestClient]) -> None:
    url, client = viewer
    queue = client.get("/index.json").json()
    assert [(i["kind"], i["run_id"]) for i in queue["items"]] == [
        ("approval", "pay-bob"), ("uncertain", "wire-w1")]  # oldest first
    approval, wire = queue["items"]
    assert approval["args"] == {"to": "bob", "amount": 500} and approval["tool"] == "pay"
    assert (wire["effect"], wire["attempts"], wire["tool"]) == ("irreversible", 1, "wire")
    again = client.get("/", headers={"accept": "application/json"}).json()["items"]
    assert [i["id"] for i in again] == [approval["id"], wire["id"]]

    runs = client.get("/runs.json").json()
    assert {r["run_id"]: r["status"] for r in runs["runs"]} == {
        "pay-bob": "waiting_approval", "wire-w1": "paused", "markup": "finished",
        "long": "finished"}
    counts = {r["run_id"]: (r["approvals"], r["uncertain"]) for r in runs["runs"]}
    assert counts["pay-bob"] == (1, 0) and counts["wire-w1"] == (0, 1)
    paused = client.get("/runs.json?status=paused").json()["runs"]
    assert [r["run_id"] for r in paused] == ["wire-w1"]
    assert client.get("/runs.json?newer_than=1h&per_page=2").json()["more"] is True
    pages = [client.get(f"/runs.json?per_page=3&page={n}").json() for n in (1, 2)]
    assert [r["run_id"] for p in pages for r in p["runs"]] == [r["run_id"] for r in runs["runs"]]
    assert [p["more"] for p in pages] == [True, False]
    assert client.get("/runs.json?older_than=1h").json()["runs"] == []

    log = log_of(url, "long")
    run = client.get("/runs/long.json?limit=10&after=5").json()
    assert [e["seq"] for e in run["events"]] == list(range(6, 16))
    assert run["run"]["status"] == "finished" and run["last_seq"] == len(log)
    assert run["events"][0]["payload"] == log[5].payload
    events = client.get("/runs/long/events.json?after=0&limit=3").json()["events"]
    assert [e["type"] for e in events] == [e.type.value for e in log[:3]]

    at = client.get("/runs/pay-bob/state.json?seq=2").json()
    assert (at["seq"], at["status"], at["state"]["approvals"]) == (2, "running", [])
    now = client.get("/runs/pay-bob/state.json").json()
    assert now["status"] == "waiting_approval" and len(now["state"]["approvals"]) == 1
    diff = client.get("/runs/pay-bob/diff.json?a=2&b=4").json()
    assert "approvals" in {c["field"] for c in diff["changes"]}
    call = client.get(f"/runs/wire-w1/calls/{wire['id'][:10]}.json").json()
    assert [e["type"] for e in call["events"]][:2] == ["tool_call_started", "tool_call_uncertain"]
    for path in ("/", "/runs", "/runs/long", "/runs/long/state?seq=3", "/runs/long/diff?a=1&b=9",
                 f"/runs/wire-w1/calls/{wire['id']}", "/runs/long/events"):
        assert client.get(path).headers["content-type"].startswith("text/html"), path


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_decision_needs_its_csrf_token_and_records_who(viewer: tuple[str, TestClient]) -> None:
    url, client = viewer
    approval_id = client.get("/index.json").json()["items"][0]["id"]
    path = f"/runs/pay-bob/approvals/{approval_id}"
    before = len(log_of(url, "pay-bob"))
    for form in ({"decision": "approve"}, {"decision": "approve", "csrf": "forged"}):
        refused = client.post(path, data=form)
        assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert len(log_of(url, "pay-bob")) == before  # nothing appended
    done = client.post(path, data={"decision": "approve", "csrf": csrf_of(client),
                                   "by": "alice", "reason": "checked", "confirm": "yes"})
    assert done.status_code == 303
    decided = log_of(url, "pay-bob")[before:]
    assert [(e.type, e.payload["by"], e.payload["approved"]) for e in decided] == [
        (EventType.APPROVAL_DECIDED, "alice", True)]
    run = client.get("/runs/pay-bob.json").json()["run"]
    assert (run["status"], run["runnable"]) == ("running", True)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_resolving_an_uncertain_call_over_json(viewer: tuple[str, TestClient]) -> None:
    url, client = viewer
    key = client.get("/index.json").json()["items"][1]["id"]
    conflict = client.post(f"/runs/wire-w1/calls/{key[:12]}/resolve",
                           data={"outcome": "conflict", "reason": "another transfer there",
                                 "csrf": csrf_of(client), "confirm": "yes"})
    assert conflict.status_code == 303
    item = client.get("/index.json").json()["items"][1]
    assert item["conflict"]["ours"] == {"ref": "w-1"}  # ours, beside theirs, for a person
    assert [(v["verdict"], v["by"]) for v in item["evidence"]] == [("conflict", "ops")]
    answer = client.post(f"/runs/wire-w1/calls/{key}/resolve",
                         headers={"accept": "application/json"},
                         data={"outcome": "happened", "result": '{"wired": 1}',
                               "csrf": csrf_of(client)})
    assert answer.status_code == 200 and answer.json()["appended"] is True
    types = [e["type"] for e in answer.json()["events"]]
    assert types == ["tool_call_reconciled", "tool_call_completed"]
    assert log_of(url, "wire-w1")[-1].payload["result"] == {"wired": 1}
    assert client.get("/index.json").json()["items"][1:] == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_decisions_are_refused_without_allow_decisions(store_url: str) -> None:
    made(store_url)
    v = Viewer(store_url)  # read only
    try:
        client = TestClient(v.app, base_url=BASE, follow_redirects=False)
        item = client.get("/index.json").json()["items"][0]
        page = client.get("/").text
        assert "Approve" not in page and 'name="csrf"' not in page
        before = len(log_of(store_url, "pay-bob"))
        for path, form in ((f"/runs/pay-bob/approvals/{item['id']}", {"decision": "approve"}),
                           ("/runs/pay-bob/fork", {"seq": "2"}), ("/runs/pay-bob/cancel", {})):
            refused = client.post(path, data={**form, "csrf": "x"})
            assert refused.status_code == 403 and "--allow-decisions" in refused.json()["detail"]
        assert len(log_of(store_url, "pay-bob")) == before
    finally:
        v.close()


def test_a_bind_off_loopback_needs_a_token(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    made(url)
    store = open_store(url, readonly=True)
    try:
        with pytest.raises(ValueError, match="token"):
            create_app(store, url, host="0.0.0.0")
        result = CliRunner().invoke(cli, ["ui", "--store", url, "--host", "0.0.0.0"])
        assert result.exit_code == 1 and "--token" in result.output
        client = TestClient(create_app(store, url, host="0.0.0.0", token="t0ken"),
                            base_url="http://10.1.2.3", follow_redirects=False)
        assert client.get("/runs.json").status_code == 401
        for bearer, status in (("nope", 401), ("t0ken", 200)):
            answer = client.get("/runs.json", headers={"authorization": f"Bearer {bearer}"})
            assert answer.status_code == status
        login = client.get("/runs?token=t0ken")
        assert login.status_code == 303 and login.headers["location"] == "/runs"
        assert client.get("/runs.json").status_code == 200  # the cookie it set
        # On loopback without a token, a page must be asked for by this machine's name:
        # a page elsewhere cannot reach it by pointing its own name here (DNS rebinding).
        local = TestClient(create_app(store, url), base_url="http://evil.example")
        assert local.get("/runs.json").status_code == 403
    finally:
        store.close()


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_markup_in_a_tool_result_is_shown_as_text(viewer: tuple[str, TestClient]) -> None:
    _, client = viewer
    for path in ("/runs/markup", "/runs/markup/state?seq=6", "/runs/markup/diff?a=1&b=7"):
        page = client.get(path)
        assert HOSTILE not in page.text and "<script>document" not in page.text
        assert "&lt;script&gt;document.title=" in page.text, path
        assert "script-src 'self'" in page.headers["content-security-policy"]
    data = client.get("/runs/markup.json").json()
    assert HOSTILE in json.dumps(data)  # the JSON twin has the data as stored


def fingerprint(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


HOSTILE_IDS = ["..%2F..%2Fetc%2Fpasswd", "%2e%2e", "a%00b", "x'%20OR%201=1", "-rf", "a" * 200,
               "%C3%A9t%C3%A9", "no-such-run", "long.json.json", ".hidden"]


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite"], indirect=True)
def test_hostile_run_ids_are_404_and_touch_no_file(store_url: str, tmp_path: Path) -> None:
    made(store_url)
    before = fingerprint(tmp_path)
    v = Viewer(store_url)
    try:
        client = TestClient(v.app, base_url=BASE)
        for rid in HOSTILE_IDS:
            for suffix in ("", ".json", "/state?seq=1", "/events.json", "/diff", "/tail",
                           "/calls/abc"):
                assert client.get(f"/runs/{rid}{suffix}").status_code == 404, (rid, suffix)
    finally:
        v.close()
    assert fingerprint(tmp_path) == before
    assert not [p for p in tmp_path.rglob("*") if "passwd" in p.name or p.name == "b"]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_no_page_shows_a_store_password(store_url: str) -> None:
    secret_url = store_url.replace("postgres@", "postgres:hunter2-s3cret@", 1)
    made(secret_url)
    v = Viewer(secret_url)
    try:
        client = TestClient(v.app, base_url=BASE)
        for path in ("/", "/runs", "/runs/pay-bob", "/runs/nope", "/index.json", "/metrics"):
            assert "hunter2" not in client.get(path).text, path
        assert "postgres:***@" in client.get("/runs").text
    finally:
        v.close()


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_metrics_parse_and_carry_the_uncertain_queue(viewer: tuple[str, TestClient]) -> None:
    _, client = viewer
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    verdicts = {s.labels["verdict"] for s in families["agentjournal_uncertain_verdicts"].samples}
    assert verdicts == {"found", "absent", "retry", "conflict", "unknown"}
    assert families["agentjournal_uncertain_verdicts"].type == "counter"
    open_calls = {s.labels["effect"]: s.value
                  for s in families["agentjournal_uncertain_open"].samples}
    assert open_calls == {"irreversible": 1}
    assert families["agentjournal_approvals_waiting"].samples[0].value == 1
    runs = {s.labels["status"]: s.value for s in families["agentjournal_runs"].samples}
    assert runs == {"waiting_approval": 1, "paused": 1, "finished": 2}
    assert all(f.name.startswith("agentjournal_") for f in families.values())
    assert not [s for f in families.values() for s in f.samples if "run_id" in s.labels]


def test_the_ui_command_serves_the_store_read_only(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["ui", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0 and "--allow-decisions" in result.output
    url = f"sqlite:///{tmp_path / 'j.db'}"
    made(url)
    with socket.socket() as probe:  # a free port, for the server to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "AGENTJOURNAL_UI_TOKEN"}
    server = subprocess.Popen([sys.executable, "-m", "agentjournal", "ui", "--store", url,
                               "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        runs = None
        for _ in range(600):  # a loaded machine starts it slowly
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs.json") as answer:
                    runs = json.load(answer)
                break
            except OSError:
                time.sleep(0.1)
        assert runs is not None and {r["run_id"] for r in runs["runs"]} == {
            "pay-bob", "wire-w1", "markup", "long"}
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=60)
    assert "(read only)" in stderr and "127.0.0.1" in stderr


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_fork_from_a_seq_and_cancel(viewer: tuple[str, TestClient]) -> None:
    url, client = viewer
    forked = client.post("/runs/pay-bob/fork", data={"seq": "2", "new_run_id": "pay-bob-2",
                                                      "csrf": csrf_of(client)})
    assert (forked.status_code, forked.headers["location"]) == (303, "/runs/pay-bob-2")
    run = client.get("/runs/pay-bob-2.json").json()["run"]
    assert run["origin"] == {"run_id": "pay-bob", "at_seq": 2} and run["events"] == 2
    cancelled = client.post("/runs/pay-bob/cancel", data={"reason": "wrong payee",
                                                          "csrf": csrf_of(client)})
    assert cancelled.status_code == 303
    last = log_of(url, "pay-bob")[-1]
    assert (last.type, last.payload["by"], last.payload["reason"]) == (
        EventType.RUN_CANCELLED, "ops", "wrong payee")
    assert client.get("/runs/pay-bob.json").json()["run"]["status"] == "cancelled"


# --- hostile or huge input: a clear refusal, never a 500, a redirect off the viewer, a page
# of megabytes or a file made by a read-only viewer ---------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_huge_or_foreign_number_is_a_400_with_a_message(viewer: tuple[str, TestClient]) -> None:
    url, client = viewer
    client = TestClient(client.app, base_url=BASE, follow_redirects=False,
                        raise_server_exceptions=False)
    huge = str(10**30)
    for path in (f"/runs/long?after={huge}", f"/runs/long/events?after={huge}",
                 f"/runs/long/events.json?after={huge}", f"/runs/long.json?limit={huge}",
                 f"/runs/long/state?seq={huge}", f"/runs/long/diff?a=1&b={huge}",
                 f"/runs/long/tail?after={huge}", f"/runs?page={huge}", "/runs/long?after=ten"):
        answer = client.get(path)
        assert answer.status_code == 400, path
        assert "a whole number from" in answer.text, path
    assert client.get("/runs/long?after=3&limit=5").status_code == 200
    last = len(log_of(url, "long"))
    for seq in (huge, "-5", "0", str(last + 1), "two"):
        forked = client.post("/runs/long/fork", data={"seq": seq, "csrf": csrf_of(client)})
        assert forked.status_code == 400 and f"from 1 to {last}" in forked.text, seq


def test_a_login_redirects_only_to_the_viewers_own_paths(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    made(url)
    store = open_store(url, readonly=True)
    try:
        client = TestClient(create_app(store, url, host="0.0.0.0", token="t0ken"),
                            base_url="http://10.1.2.3", follow_redirects=False)
        for path, target in (("//other.host/x", "/other.host/x"),
                             ("///other.host/x", "/other.host/x"), ("/runs", "/runs")):
            login = client.get(f"http://10.1.2.3{path}?token=t0ken&status=paused")
            assert login.status_code == 303, path
            assert login.headers["location"] == f"{target}?status=paused", path
        location = client.get("http://10.1.2.3/\\other.host/x?token=t0ken").headers["location"]
        assert location[:2] not in ("//", "/\\"), location  # a browser reads both as a site
    finally:
        store.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_decision_redirects_back_only_to_a_page_of_the_viewer(
        viewer: tuple[str, TestClient]) -> None:
    _, client = viewer
    approval_id = client.get("/index.json").json()["items"][0]["id"]
    done = client.post(f"/runs/pay-bob/approvals/{approval_id}",
                       headers={"referer": "http://other.host/phish"},
                       data={"decision": "deny", "csrf": csrf_of(client)})
    assert done.status_code == 303
    assert done.headers["location"].startswith("/") and "other.host" not in \
        done.headers["location"]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_megabyte_result_is_cut_with_a_link_to_the_full_value(store_url: str) -> None:
    store = open_store(store_url)
    try:
        big_result_run(store, "big")
    finally:
        store.close()
    v = Viewer(store_url)
    try:
        client = TestClient(v.app, base_url=BASE)
        full = "ab" * (3 * 1024 * 1024 // 2)
        for path in ("/runs/big", "/runs/big/events", "/runs/big/state?seq=6",
                     "/runs/big/diff?a=1&b=6"):
            page = client.get(path)
            assert page.status_code == 200, path
            assert len(page.text) < 200_000, (path, len(page.text))
            links = [part.split('"', 1)[0] for part in page.text.split('class="full" href="')[1:]]
            assert links, path  # each cut value links to its full value
            assert any(full in json.dumps(client.get(link.replace("&amp;", "&")).json())
                       for link in links), path
    finally:
        v.close()


def test_a_read_only_viewer_stopped_by_sigterm_leaves_no_file_behind(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    made(url)
    before = fingerprint(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "agentjournal", "ui", "--store", url,
                               "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # a loaded machine starts it slowly
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs/pay-bob") as page:
                    assert page.status == 200
                break
            except OSError:
                time.sleep(0.1)
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    assert fingerprint(tmp_path) == before  # no -wal, no -shm: read-only made nothing


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite", "postgres"], indirect=True)
def test_each_run_has_one_state_on_every_backend(store_url: str) -> None:
    """The state to act on, from the log, the run's lease and the fleet's queue: waiting
    for a person, running (held), stalled (let go, nobody holds it), failed (parked)."""
    store = open_store(store_url)
    try:
        approval_run(store, "pay-bob")
        interrupted_run(store, "held")
        store.acquire("held", "worker-7", ttl=3600)
        interrupted_run(store, "stalled")
        interrupted_run(store, "parked")
        if not store_url.startswith("jsonl"):  # JSONL has no queue
            queue = queue_of(store)
            queue.submit("parked", "payments:agent", "read")
            claim = queue.claim("worker-8", 60, ["default"])
            assert claim is not None and claim.lease.run_id == "parked"
            assert queue.hand_back(claim.lease, "parked", 4, "it killed its worker 3 times")
    finally:
        store.close()
    v = Viewer(store_url)  # read only
    try:
        client = TestClient(v.app, base_url=BASE)
        standing = {r: client.get(f"/runs/{r}.json").json()["run"]["standing"]
                    for r in ("pay-bob", "held", "stalled", "parked")}
        listed = {r["run_id"]: r["standing"]["state"]
                  for r in client.get("/runs.json").json()["runs"]}
    finally:
        v.close()
    assert standing["pay-bob"]["state"] == "waiting"
    assert standing["held"]["state"] == "running"
    assert "held by worker-7 (lease epoch 2)" in standing["held"]["detail"]
    assert standing["stalled"]["state"] == "stalled"
    if store_url.startswith("jsonl"):
        assert standing["parked"]["state"] == "stalled"
    else:
        assert standing["parked"]["state"] == "failed"
        assert standing["parked"]["detail"].startswith(
            "a worker parked it: it killed its worker 3 times")
    assert listed == {r: s["state"] for r, s in standing.items()}


def _snapshotted_long_run(url: str, turns: int) -> list[Any]:
    """A long run with a snapshot at about two thirds of it and a damaged one at its end
    (a wrong state, its body not what its digest says): its log."""
    from agentjournal import fold
    from agentjournal.snapshots import take, write_snapshot

    store = open_store(url)
    try:
        long_run(store, "long", turns)
        log = list(store.read("long"))
        write_snapshot(store, fold(log[: len(log) * 2 // 3]))
        wrong = fold(log)
        wrong.turns = 999
        store.put_snapshot(msgspec.structs.replace(take(wrong), digest="0" * 64), keep=3)
        assert [s.seq for s in store.snapshots("long")] == [len(log), len(log) * 2 // 3]
    finally:
        store.close()
    return log


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite"], indirect=True)
def test_time_travel_through_a_window_says_what_the_whole_log_says(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A late seq of a long run is shown from its snapshot and the last events: status,
    usage and every field equal the whole log's, the messages and calls are the whole
    log's of the window, each call as its whole history says (tried, took, result)."""
    from agentjournal import fold
    from agentjournal.ui import views

    monkeypatch.setattr(views, "WINDOW", 20)
    log = _snapshotted_long_run(store_url, 60)
    v = Viewer(store_url)
    try:
        client = TestClient(v.app, base_url=BASE)
        for seq in (len(log), len(log) - 7, len(log) * 2 // 3, 25):
            shown = client.get(f"/runs/long/state.json?seq={seq}").json()
            whole = client.get(f"/runs/long/state.json?seq={seq}&after=0").json()
            after = shown["after"]
            assert whole["after"] == 0 and after <= max(0, seq - 20)
            assert after > 0 or seq == 25  # (a seq this early: the whole run)
            folded = fold(log[:seq])
            assert (shown["status"], shown["turns"], shown["usage"]) == (
                whole["status"], whole["turns"], whole["usage"]) == (
                folded.status, folded.turns, msgspec.to_builtins(folded.usage))
            assert shown["messages"] == [m for m in whole["messages"] if m["seq"] > after]
            moved = {e.payload.get("key") or e.payload.get("idempotency_key")
                     for e in log[after:seq]}
            assert shown["calls"] == [c for c in whole["calls"] if c["key"] in moved]
            assert shown["calls"], seq
            for name, value in shown["state"].items():
                if name in ("messages", "completed", "completed_args", "attempts"):
                    continue  # (the window's, as above)
                assert value == whole["state"][name], (seq, name)
        html = client.get(f"/runs/long/state?seq={len(log)}").text
        assert 'id="window"' in html and f"seq={len(log)}&after=0" in html
    finally:
        v.close()


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite"], indirect=True)
def test_time_travel_decodes_only_the_message_segments_its_window_shows(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run snapshotted in message segments, then redacted in two of them and compacted:
    time travel at each seq shows the fold's messages of its window, counts all of the
    fold's and says what the fold says, decoding only the segments its window shows."""
    import itertools

    from agentjournal import fold
    from agentjournal.bench._common import run_facts, workload
    from agentjournal.events import make_events
    from agentjournal.snapshots import SEGMENT, _form_of, write_snapshot
    from agentjournal.state import durable_fields
    from agentjournal.ui import views

    monkeypatch.setattr(views, "WINDOW", 400)
    store = open_store(store_url)
    try:
        store.append("long", workload("long", 1500), expected_seq=0, epoch=0)
        write_snapshot(store, fold(list(store.read("long"))))
        (snapshot,) = store.snapshots("long")
        segments = _form_of(snapshot.body).messages  # type: ignore[union-attr]
        assert len(segments) == 3
        tail = [*itertools.islice(run_facts("long"), 1500, 1530),
                *[(EventType.GUARDRAIL_TRIGGERED, {"name": "pii", "action": "redact",
                                                   "message_index": index})
                  for index in (5, 3 * SEGMENT - 1)],
                (EventType.CONTEXT_COMPACTED, {"summary": "so far", "kept": 300})]
        store.append("long", make_events("long", 1500, 0, tail), expected_seq=1500, epoch=0)
        log = list(store.read("long"))
        fetched: list[str] = []
        segments_of = store.segments
        monkeypatch.setattr(store, "segments", lambda run_id, digests: (
            fetched.extend(digests), segments_of(run_id, digests))[1])
        for seq in (1500, 1530, 1531, 1532, 1533):
            fetched.clear()
            shown = views.state_at(store, "long", seq)
            folded, after = fold(log[:seq]), shown["after"]
            assert 0 < after <= seq - 400
            assert shown["messages"] == [views._message(m) for m in folded.messages
                                         if m.seq > after], seq
            assert shown["all_messages"] == len(folded.messages)
            assert any(m["content"] == "[redacted]" for m in shown["messages"]) == (seq > 1531)
            whole = durable_fields(folded)
            assert shown["state"]["messages"] == [row for m, row in zip(
                folded.messages, whole["messages"], strict=True) if m.seq > after]
            for name, value in shown["state"].items():
                if name not in ("messages", "completed", "completed_args", "attempts"):
                    assert value == whole[name], (seq, name)
            # Only the last segment holds messages of the window; the fold reads the
            # first too once it redacts a message there (and the compaction keeps it).
            decoded = [d for d in segments if d in fetched]
            assert decoded == (segments[2:] if seq <= 1530 else [segments[0], segments[2]])
    finally:
        store.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_verify_catches_message_tops_that_would_hide_messages(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot that says its message segments end earlier than they do (a window
    would pass over their messages): verify names it and quarantines its fold version,
    and time travel then shows what the log says."""
    import hashlib
    import zlib

    from agentjournal import fold
    from agentjournal.bench._common import workload
    from agentjournal.snapshots import _encoder, _form_of, verify, write_snapshot
    from agentjournal.ui import views

    monkeypatch.setattr(views, "WINDOW", 900)
    store = open_store(store_url)
    try:
        store.append("long", workload("long", 1500), expected_seq=0, epoch=0)
        log = list(store.read("long"))
        written = write_snapshot(store, fold(log))
        assert written is not None
        form = _form_of(written.body)
        assert form is not None and len(form.messages_tops) == 3
        body = zlib.compress(_encoder.encode(msgspec.structs.replace(
            form, messages_tops=[0] * len(form.messages_tops))))
        store.put_snapshot(msgspec.structs.replace(
            written, body=body, digest=hashlib.sha256(body).hexdigest()), keep=1)
        hidden = views.state_at(store, "long", 1500)
        expected = [views._message(m) for m in fold(log).messages if m.seq > hidden["after"]]
        assert hidden["messages"] == expected[-len(hidden["messages"]):] != expected
        report = verify(store, "long")
        assert [(m.check, m.fields) for m in report.mismatches] == [
            ("snapshot", ["messages_tops"])]
        shown = views.state_at(store, "long", 1500)
        assert shown["after"] == hidden["after"] and shown["messages"] == expected
    finally:
        store.close()


@pytest.mark.parametrize("store_url", ["jsonl", "sqlite", "postgres"], indirect=True)
def test_a_calls_page_read_from_its_start_is_its_whole_history(
        viewer: tuple[str, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call's page, read from the start its link carries (in chunks, to its end),
    from an open call's start in the outline, or from a wrong start (the whole log):
    the same events as a read of the whole log."""
    from agentjournal.ui import views

    monkeypatch.setattr(views, "CALL_CHUNK", 2)
    url, client = viewer
    for run_id in ("long", "wire-w1", "markup"):
        calls = client.get(f"/runs/{run_id}/state.json?after=0").json()["calls"]
        assert calls
        for call in calls:
            whole = [(e.seq, e.type.value) for e in log_of(url, run_id)
                     if (e.payload.get("key") or e.payload.get("idempotency_key")) == call["key"]]
            for at in (f"?at={call['started_seq']}", "", "?at=1"):
                page = client.get(f"/runs/{run_id}/calls/{call['key']}.json{at}").json()
                assert [(e["seq"], e["type"]) for e in page["events"]] == whole, (run_id, at)
        html = client.get(f"/runs/{run_id}/state").text
        assert f"/calls/{calls[0]['key']}?at={calls[0]['started_seq']}" in html


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_run_whose_log_cannot_be_read_is_named_and_the_others_shown(
        store_url: str) -> None:
    """One run's log edited by hand, its outline gone (a read must fold it): the
    needs-a-person page and the runs list name it unreadable and show every other run;
    its own page says what is wrong (409)."""
    import sqlite3

    made(store_url)
    with sqlite3.connect(store_url.split("///")[1].split("?")[0]) as db:
        db.execute("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'read', 'READ')"
                   " AS BLOB) WHERE key = (SELECT (run_no << 32) + 1 FROM run_numbers"
                   " WHERE run_id = 'markup')")
        db.execute("DELETE FROM outlines WHERE run_no = (SELECT run_no FROM run_numbers"
                   " WHERE run_id = 'markup')")
    v = Viewer(store_url)
    try:
        client = TestClient(v.app, base_url=BASE)
        queue = client.get("/index.json").json()
        assert [u["run_id"] for u in queue["unreadable"]] == ["markup"]
        assert [i["run_id"] for i in queue["items"]] == ["pay-bob", "wire-w1"]
        runs = {r["run_id"]: r["status"] for r in client.get("/runs.json").json()["runs"]}
        assert runs == {"pay-bob": "waiting_approval", "wire-w1": "paused",
                        "markup": "unreadable", "long": "finished"}
        assert client.get("/runs/markup.json").status_code == 409
        assert client.get("/runs/long.json").json()["run"]["status"] == "finished"
    finally:
        v.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_damaged_snapshot_segment_is_read_past_and_nothing_is_written(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long run snapshotted in segments, one segment damaged at a time: the read-only
    viewer's time travel (through a window that looks up its oldest calls) says what the
    log says, and the snapshot stays where it is."""
    import sqlite3

    from agentjournal import fold
    from agentjournal.bench._common import workload
    from agentjournal.snapshots import write_snapshot
    from agentjournal.ui import views

    monkeypatch.setattr(views, "WINDOW", 1490)

    store = open_store(store_url)
    try:
        store.append("long", workload("long", 1500), expected_seq=0, epoch=0)
        log = list(store.read("long"))
        write_snapshot(store, fold(log))
        digests = sorted(store.segment_digests("long"))
    finally:
        store.close()
    assert len(digests) > 3  # (messages, completed calls, attempts, their filters)
    folded = fold(log)
    v = Viewer(store_url)  # read-only
    try:
        client = TestClient(v.app, base_url=BASE)
        with sqlite3.connect(store_url.split("///")[1].split("?")[0]) as db:
            for digest in digests:
                kept = db.execute("SELECT body FROM segments WHERE digest = ?",
                                  (digest,)).fetchone()[0]
                db.execute("UPDATE segments SET body = x'00' WHERE digest = ?", (digest,))
                db.commit()
                page = client.get(f"/runs/long/state.json?seq={len(log)}")
                assert page.status_code == 200, (digest, page.text)
                assert (page.json()["turns"], page.json()["status"]) == (
                    folded.turns, folded.status)
                db.execute("UPDATE segments SET body = ? WHERE digest = ?", (kept, digest))
                db.commit()
    finally:
        v.close()
    with open_store(store_url, readonly=True) as store:
        assert [s.seq for s in store.snapshots("long")] == [len(log)]

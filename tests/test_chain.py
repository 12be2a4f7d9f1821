"""The digest chain as people meet it: `snapshots.verify` and `agentjournal verify` name
the first event whose digest does not match, on every backend, and check the other runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentjournal import EventType, fold, make_events, open_store
from agentjournal.cli import cli
from agentjournal.errors import EncodingError
from agentjournal.snapshots import verify, write_snapshot
from agentjournal.store import Store

from .conftest import backend_params
from .test_store_conformance import edited, rewrite_stored

MakeStore = Callable[[], Store]
DAMAGED = {"kept": 2, "recomputed": 3}  # where an edit of seq 2 is found


def a_log(store: Store, run_id: str) -> None:
    """A run of four events: run_started, then three messages."""
    facts = [(EventType.RUN_STARTED, {"task": "t"}),
             *((EventType.USER_MESSAGE, {"content": c}) for c in "abc")]
    store.append(run_id, make_events(run_id, 0, 0, facts), expected_seq=0, epoch=0)


def damage(store: Store, run_id: str, digest: str = "kept") -> None:
    """Edit seq 2 of ``run_id`` in place, keeping its digest or recomputing it."""
    log = list(store.read(run_id))
    rewrite_stored(store, run_id, log[1], edited(log[1], log[0].digest if digest != "kept"
                                                 else None))


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200", "AGENTJOURNAL_STORE": ""})


@backend_params()
@pytest.mark.parametrize("digest", list(DAMAGED))
def test_verify_names_the_first_seq_whose_digest_does_not_match(
    make_store: MakeStore, digest: str
) -> None:
    store = make_store()
    a_log(store, "r1")
    assert write_snapshot(store, fold(list(store.read("r1"))[:3])) is not None
    assert verify(store, "r1").ok
    damage(store, "r1", digest)
    report = verify(make_store(), "r1")
    assert not report.ok
    assert report.corrupt_seq == DAMAGED[digest]
    assert "digest does not match" in (report.corrupt or "")
    # A damaged log proves nothing against a snapshot: no fold version is blamed.
    assert report.quarantined == [] and store.quarantined() == {}


@backend_params()
def test_cli_verify_reports_the_damaged_seq_and_exits_3(
    make_store: MakeStore, store_url: str
) -> None:
    store = make_store()
    a_log(store, "r1")
    damage(store, "r1")
    result = invoke("verify", "r1", "--store", store_url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "r1: CORRUPT at seq 2" in result.stdout
    assert result.stderr.startswith("error: r1: the log is corrupt at seq 2: its digest")
    assert "Traceback" not in result.stderr
    result = invoke("verify", "r1", "--json", "--store", store_url)
    assert result.exit_code == 3
    (report,) = json.loads(result.stdout)
    assert (report["ok"], report["corrupt_seq"]) == (False, 2)


@backend_params()
def test_cli_verify_all_reports_the_damaged_run_and_checks_the_others(
    make_store: MakeStore, store_url: str
) -> None:
    store = make_store()
    for run_id in ("before", "r1", "after"):
        a_log(store, run_id)
    damage(store, "r1", "recomputed")
    result = invoke("verify", "--all", "--json", "--store", store_url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    reports: dict[str, Any] = {r["run_id"]: r for r in json.loads(result.stdout)}
    assert set(reports) == {"before", "r1", "after"}
    assert reports["r1"]["corrupt_seq"] == 3 and not reports["r1"]["ok"]
    assert reports["before"]["ok"] and reports["after"]["ok"]
    assert reports["after"]["events"] == 4
    assert "r1: the log is corrupt at seq 3" in result.stderr


@pytest.mark.parametrize(("payload", "refusal"), [
    ({"n": {1: "a"}}, "non-string key 1"), ({"n": [float("nan")]}, r"value.n\[0\] is nan"),
    ({"n": {"m": float("-inf")}}, "value.n.m is -inf"),
])
def test_make_events_refuses_what_json_would_change(payload: dict[str, Any],
                                                    refusal: str) -> None:
    """Refused by name, though msgspec would write the key as "1" and a NaN as null."""
    with pytest.raises(EncodingError, match=refusal):
        make_events("r", 0, 0, [(EventType.USER_MESSAGE, payload)])


def test_make_events_keeps_the_canonical_form_of_what_json_holds() -> None:
    (event,) = make_events("r", 0, 0, [(EventType.USER_MESSAGE,
                                        {"b": (1, 2.5), "a": [None, {"z": True}]})])
    assert event.payload == {"a": [None, {"z": True}], "b": [1, 2.5]}


# --- verify --heads: the heads kept elsewhere ----------------------------------------


@backend_params()
def test_verify_heads_exports_then_checks_a_store_against_its_copy(
    make_store: MakeStore, store_url: str, tmp_path: Path
) -> None:
    store = make_store()
    a_log(store, "r1")
    a_log(store, "r2")
    heads = tmp_path / "heads.json"
    exported = invoke("verify", "--all", "--heads", str(heads), "--store", store_url)
    assert exported.exit_code == 0, exported.stderr
    recorded = json.loads(heads.read_text())["heads"]
    assert recorded == {r: {"seq": 4, "digest": list(store.read(r))[-1].digest}
                        for r in ("r1", "r2")}
    store.append("r2", make_events("r2", 4, 0, [(EventType.USER_MESSAGE, {"content": "d"})]),
                  expected_seq=4, epoch=0)  # a log that grew since still holds its head
    checked = invoke("verify", "--all", "--heads", str(heads), "--json", "--store", store_url)
    assert checked.exit_code == 0, checked.stderr
    assert "2 of 2 runs hold the heads" in checked.stderr
    assert all(r["ok"] and r["head"] == "ok" for r in json.loads(checked.stdout))


@backend_params()
def test_verify_heads_catches_a_log_rewritten_with_its_head(
    make_store: MakeStore, store_url: str, tmp_path: Path
) -> None:
    """Someone who can rewrite a whole run (every digest, its head too) passes every check
    inside the store; only the heads kept elsewhere tell."""
    store = make_store()
    a_log(store, "r1")
    heads = tmp_path / "heads.json"
    assert invoke("verify", "--all", "--heads", str(heads), "--store", store_url).exit_code == 0
    forged = json.loads(heads.read_text())
    forged["heads"]["r1"]["digest"] = "0" * 32  # as good as a log rewritten after export
    forged["heads"]["gone"] = {"seq": 3, "digest": "1" * 32}
    heads.write_text(json.dumps(forged))
    result = invoke("verify", "--all", "--heads", str(heads), "--store", store_url)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "r1: ok" in result.stdout  # the store alone finds nothing wrong
    assert "error: r1: the event at seq 4 has digest" in result.stderr
    assert "error: gone: the log no longer reaches seq 3" in result.stderr
    (report, gone) = json.loads(invoke("verify", "--all", "--heads", str(heads), "--json",
                                       "--store", store_url).stdout)
    assert (report["ok"], gone["run_id"], gone["ok"]) == (False, "gone", False)
    assert "was rewritten" in report["head"]


def test_verify_heads_refuses_a_file_that_is_not_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with open_store(url) as store:
        a_log(store, "r1")
    (tmp_path / "h.json").write_text("milk, eggs")
    result = invoke("verify", "--all", "--heads", str(tmp_path / "h.json"), "--store", url)
    assert result.exit_code == 2 and "is not a heads file" in result.stderr

"""The demo ledger service, run as a real subprocess: it must count effects honestly."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentjournal.demo.ledger import LedgerService, http_json


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LedgerService]:
    with LedgerService(tmp_path / "ledger.db") as svc:
        yield svc


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerService]:
    """One service for tests that must apply nothing (saves a process start each)."""
    with LedgerService(tmp_path_factory.mktemp("shared") / "ledger.db") as svc:
        yield svc


def correction(cid: str = "corr-1", amount: int = 1250, ledger: str = "ledger-a") -> dict[str, Any]:
    return {"correction_id": cid, "ledger": ledger, "amount": amount, "memo": "Q1 close"}


def counts(corrections: dict[str, int], tickets: dict[str, int], *, replays: int = 0,
           fenced: int = 0) -> dict[str, Any]:
    """What GET /effects answers."""
    return {"corrections": corrections, "tickets": tickets, "replays": replays, "fenced": fenced}


def post(svc: LedgerService, path: str, body: dict[str, Any], key: str | None = None,
         timeout: float = 10.0, epoch: int | str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Idempotency-Key": key} if key else {}
    if epoch is not None:
        headers["Fencing-Token"] = str(epoch)
    return http_json("POST", svc.url + path, body, headers, timeout=timeout)


def raw_post(svc: LedgerService, path: str, data: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(svc.url + path, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def test_same_key_twice_applies_once_and_replays(service: LedgerService) -> None:
    first = post(service, "/corrections", correction(), key="k1")
    second = post(service, "/corrections", correction(), key="k1")
    assert first[0] == 201
    assert first[1]["status"] == "applied"
    assert second == first
    assert service.effects() == counts({"corr-1": 1}, {}, replays=1)


def test_same_key_different_body_is_422(service: LedgerService) -> None:
    assert post(service, "/corrections", correction(amount=1250), key="k1")[0] == 201
    status, body = post(service, "/corrections", correction(amount=999), key="k1")
    assert status == 422
    assert body == {"error": "idempotency key reused with different parameters"}
    assert service.effects()["corrections"] == {"corr-1": 1}


def test_without_key_every_post_applies(service: LedgerService) -> None:
    ids = [post(service, "/corrections", correction())[1]["applied_id"] for _ in range(3)]
    assert len(set(ids)) == 3
    assert service.effects() == counts({"corr-1": 3}, {}, replays=0)
    status, body = http_json("GET", service.url + "/corrections/corr-1")
    assert (status, body["applied_count"], body["applied_id"]) == (200, 3, ids[-1])


def test_no_idempotency_flag_ignores_the_key(tmp_path: Path) -> None:
    with LedgerService(tmp_path / "ledger.db", idempotency=False) as svc:
        first = post(svc, "/corrections", correction(), key="k1")
        second = post(svc, "/corrections", correction(), key="k1")
        assert first[0] == second[0] == 201
        assert first[1]["applied_id"] != second[1]["applied_id"]
        assert svc.effects() == counts({"corr-1": 2}, {}, replays=0)


def test_concurrent_posts_with_one_key_apply_once(service: LedgerService) -> None:
    results: list[tuple[int, dict[str, Any]]] = []

    def send() -> None:
        results.append(post(service, "/corrections", correction(), key="k-race"))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {status for status, _ in results} == {201}
    assert len({body["applied_id"] for _, body in results}) == 1
    assert service.effects() == counts({"corr-1": 1}, {}, replays=7)


def test_tickets_dedupe_like_corrections(service: LedgerService) -> None:
    ticket = {"ticket_id": "t-1", "title": "ledger-c off by 42.00", "body": "see Q1"}
    first = post(service, "/tickets", ticket, key="tk")
    assert first == (201, {"ticket_id": "t-1", "status": "filed"})
    assert post(service, "/tickets", ticket, key="tk") == first
    assert post(service, "/tickets", {**ticket, "title": "other"}, key="tk")[0] == 422
    assert post(service, "/tickets", ticket)[0] == 201
    assert service.effects() == counts({}, {"t-1": 2}, replays=1)


def test_an_older_epoch_is_refused_for_an_identity_seen_at_a_newer_one(
    service: LedgerService,
) -> None:
    assert post(service, "/corrections", correction(), key="k2", epoch=2)[0] == 201
    # A stale writer (epoch 1) is refused, with or without the key the newer one sent.
    for key in ("k1", "k2", None):
        status, body = post(service, "/corrections", correction(), key=key, epoch=1)
        assert status == 409
        assert body == {"error": "stale epoch", "epoch": 1, "current_epoch": 2,
                        "identity": "corrections/corr-1"}
    # The same or a newer epoch goes through; other identities are not fenced by it.
    assert post(service, "/corrections", correction(), key="k2", epoch=2)[0] == 201  # replay
    assert post(service, "/corrections", correction(cid="corr-2"), epoch=1)[0] == 201
    assert post(service, "/corrections", correction(), key="k3", epoch=3)[0] == 201
    assert post(service, "/corrections", correction(), key="k4", epoch=2)[0] == 409
    assert service.effects() == counts({"corr-1": 2, "corr-2": 1}, {}, replays=1, fenced=4)
    assert http_json("GET", service.url + "/corrections/corr-1")[1]["epoch"] == 3


def test_tickets_are_fenced_by_their_id(service: LedgerService) -> None:
    ticket = {"ticket_id": "t-1", "title": "off by 42.00", "body": "see Q1"}
    assert post(service, "/tickets", ticket, epoch=5)[0] == 201
    assert post(service, "/tickets", ticket, epoch=4)[0] == 409
    assert service.effects()["tickets"] == {"t-1": 1}


@pytest.mark.parametrize("epoch", ["x", "-1", "1.5", ""])
def test_a_malformed_epoch_is_refused(shared: LedgerService, epoch: str) -> None:
    status, body = post(shared, "/corrections", correction(), epoch=epoch)
    assert status == 400 and "Fencing-Token" in body["error"]
    assert shared.effects()["corrections"] == {}


def test_correction_lookup(service: LedgerService) -> None:
    status, body = http_json("GET", service.url + "/corrections/nope")
    assert (status, body) == (404, {"error": "not found", "correction_id": "nope"})
    _, applied = post(service, "/corrections", correction(), key="k1")
    status, body = http_json("GET", service.url + "/corrections/corr-1")
    assert status == 200
    assert body == {"correction_id": "corr-1", "ledger": "ledger-a", "amount": 1250,
                    "memo": "Q1 close", "applied_id": applied["applied_id"], "applied_count": 1,
                    "epoch": None}


def test_ledgers_are_seeded_and_corrections_close_the_discrepancy(service: LedgerService) -> None:
    seeded = {name: http_json("GET", f"{service.url}/ledgers/{name}")
              for name in ("ledger-a", "ledger-b", "ledger-c")}
    assert {n: (s, b["discrepancy"]) for n, (s, b) in seeded.items()} == {
        "ledger-a": (200, 1250), "ledger-b": (200, -300), "ledger-c": (200, 4200)}
    assert all(body["entries"] and body["ledger"] == name for name, (_, body) in seeded.items())
    assert http_json("GET", service.url + "/ledgers/ledger-z")[0] == 404
    post(service, "/corrections", correction(amount=1250))
    assert http_json("GET", service.url + "/ledgers/ledger-a")[1]["discrepancy"] == 0
    # A second (non-idempotent) apply is visible as a new discrepancy.
    post(service, "/corrections", correction(amount=1250))
    assert http_json("GET", service.url + "/ledgers/ledger-a")[1]["discrepancy"] == -1250


@pytest.mark.parametrize(("path", "data", "status"), [
    ("/corrections", b"{not json", 400),
    ("/corrections", b"[1, 2]", 400),
    ("/corrections", b"", 400),
    ("/corrections", b'{"correction_id": "c", "ledger": "ledger-a", "amount": "12"}', 400),
    ("/corrections", b'{"correction_id": "c", "ledger": "ledger-a", "amount": true}', 400),
    ("/corrections", b'{"correction_id": "c", "ledger": "ledger-z", "amount": 1}', 404),
    ("/tickets", b'{"ticket_id": "t"}', 400),
    ("/nowhere", b"{}", 404),
])
def test_bad_requests_get_json_errors(
    shared: LedgerService, path: str, data: bytes, status: int
) -> None:
    got, raw = raw_post(shared, path, data)
    assert got == status
    assert "error" in json.loads(raw)
    assert shared.effects() == counts({}, {}, replays=0)


def test_unknown_paths_and_methods_are_json(shared: LedgerService) -> None:
    status, body = http_json("GET", shared.url + "/no/such/thing")
    assert (status, body["error"]) == (404, "not found")
    assert http_json("GET", shared.url + "/health") == (200, {"ok": True})
    assert http_json("POST", shared.url + "/health", {})[0] == 405
    with pytest.raises(urllib.error.HTTPError) as raised:  # 5xx propagate from http_json
        http_json("PUT", shared.url + "/corrections", {})
    assert raised.value.code == 501
    assert "error" in json.loads(raised.value.read())
    raised.value.close()


def test_data_and_keys_survive_a_restart(tmp_path: Path) -> None:
    svc = LedgerService(tmp_path / "ledger.db")
    with svc:
        first = post(svc, "/corrections", correction(), key="k1")
    assert svc.process is not None and svc.process.returncode == 0  # clean SIGTERM exit
    with svc.start():
        assert post(svc, "/corrections", correction(), key="k1") == first
        assert svc.effects() == counts({"corr-1": 1}, {}, replays=1)
        assert http_json("GET", svc.url + "/ledgers/ledger-a")[1]["discrepancy"] == 0


def test_latency_opens_an_uncertain_window(tmp_path: Path) -> None:
    with LedgerService(tmp_path / "ledger.db", latency_ms=300) as svc:
        with pytest.raises(TimeoutError):
            post(svc, "/corrections", correction(), key="k1", timeout=0.1)
        # The client saw only a timeout, yet the effect was committed.
        assert svc.effects()["corrections"] == {"corr-1": 1}
        assert http_json("GET", svc.url + "/corrections/corr-1")[0] == 200
    assert svc.stderr() == ""  # the hung-up client is not logged as an error


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com"])
def test_non_loopback_host_is_refused(tmp_path: Path, host: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentjournal.demo.ledger", "--db", str(tmp_path / "l.db"),
         "--host", host],
        capture_output=True, text=True, timeout=20)
    assert result.returncode != 0
    assert "non-loopback" in result.stderr
    assert "listening on" not in result.stdout

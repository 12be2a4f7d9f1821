"""`agentjournal ui` in a real browser: Playwright driving Debian's Chromium (no browser
download: `executable_path`). One browser and one server for the module, over a store
holding the demo's run (killed by SIGKILL and resumed in a new process), a run waiting
for an approval, one with an uncertain call, and runs a thread drives while a page
watches. Each test saves a screenshot under its tmp dir."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # in CI the dev extra has them: a missing one fails
    pytest.importorskip("starlette")
    pytest.importorskip("playwright.sync_api")
from playwright import sync_api

from agentjournal import Agent, EventType, ScriptedModel, calls, open_store, reply
from agentjournal.decisions import record_approval
from agentjournal.demo.run_demo import RUN_ID, run_demo
from agentjournal.fleet import queue_of
from agentjournal.state import fold
from agentjournal.ui import Viewer
from agentjournal.ui.server import serve_in_thread

from .ui_runs import (
    HOSTILE,
    approval_run,
    fetch_page,
    interrupted_run,
    markup_run,
    uncertain_run,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
TIMEOUT_MS = 30_000  # a loaded machine is slow, never wrong


def test_a_browser_is_installed() -> None:
    """The browser tests need Debian's chromium (.ci/run installs it): in CI its absence
    fails here, loudly, instead of skipping every test below."""
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no chromium on PATH: apt-get install -y chromium")
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    root = tmp_path_factory.mktemp("ui")
    demo = run_demo(root / "demo", kill_at="after-effect")
    assert demo.kills == 1 and demo.ok
    url = f"sqlite:///{root / 'demo' / 'journal.db'}"
    store = open_store(url)
    try:
        approval_run(store, "pay-bob", agent_ref="payments:agent")
        approval_run(store, "queued-pay")  # a run of the fleet's queue
        approval_run(store, "decided-pay")  # approved by carol, then resumed to its end
        approval_id = next(iter(fold(store.read("decided-pay")).approvals))
        record_approval(store, "decided-pay", approval_id, approved=True, by="carol",
                        reason="invoice checked")
        approval_run(store, "decided-pay")
        queue_of(store).submit("queued-pay", "payments:agent", "pay bob 500")
        uncertain_run(store, "wire-w1")
        markup_run(store, "markup")
        interrupted_run(store, "stalled")  # its process stopped: nobody holds it
        interrupted_run(store, "held")
        store.acquire("held", "worker-7", ttl=3600)  # a worker has it now
    finally:
        store.close()
    viewer = Viewer(url, allow_decisions=True, by="ops")
    server, thread, port = serve_in_thread(viewer)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield {"url": url, "base": f"http://127.0.0.1:{port}", "browser": browser}
        finally:
            browser.close()
            server.should_exit = True
            thread.join(10)
            viewer.close()


@pytest.fixture
def page(site: dict[str, Any], tmp_path: Path) -> Iterator[Any]:
    context = site["browser"].new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield tab
        assert errors == []  # no script error on any page
    finally:
        tab.screenshot(path=str(tmp_path / "screenshot.png"), full_page=True)
        context.close()
    assert (tmp_path / "screenshot.png").stat().st_size > 0


def log_of(url: str, run_id: str) -> list[Any]:
    store = open_store(url, readonly=True)
    try:
        return list(store.read(run_id))
    finally:
        store.close()


def test_needs_a_person_leads(page: Any, site: dict[str, Any]) -> None:
    page.goto(site["base"] + "/")
    assert page.title().startswith("Needs a person")
    items = page.locator("section.item")
    kinds = {(items.nth(i).get_attribute("data-kind"), items.nth(i).get_attribute("data-run"))
             for i in range(items.count())}
    assert {("approval", "pay-bob"), ("uncertain", "wire-w1")} <= kinds
    assert '"amount": 500' in page.locator("section[data-run=pay-bob]").inner_text()
    assert "irreversible" in page.locator("section[data-run=wire-w1]").inner_text()
    # A call in flight (its run's lease held), or one a resume retries by itself (read
    # only, its process stopped), is nothing a person is asked about.
    assert {run for _, run in kinds}.isdisjoint({"held", "stalled"})


def test_each_run_shows_one_state_the_one_to_act_on(page: Any, site: dict[str, Any]) -> None:
    """One badge: waiting for a person (for what), running (held by whom, until when),
    stalled, finished; never "runnable" beside a run that waits for a person."""
    expected = {
        "pay-bob": ("waiting", "waiting for a person", "approve or deny pay(amount=500, to='bob')"),
        "wire-w1": ("waiting", "waiting for a person", "say whether wire(ref='w-1') happened"),
        "held": ("running", "running", "held by worker-7 (lease epoch 2) until"),
        "stalled": ("stalled", "stalled", "let go of it, and nobody holds it now"),
        RUN_ID: ("finished", "finished", ""),
    }
    for run_id, (state, label, detail) in expected.items():
        page.goto(f"{site['base']}/runs/{run_id}")
        header = page.locator("h1 .badge")
        assert header.count() == 1, run_id  # one state, not a status and a "runnable"
        assert (header.get_attribute("data-state"), header.inner_text()) == (state, label)
        if detail:
            assert detail in page.locator("#state-detail").inner_text(), run_id
    # Its open call, said as what it is: in flight while held, retried by whoever goes
    # on when safe to repeat; a person is asked only about one that is uncertain.
    for run_id, call in (("held", "in flight"), ("stalled", "retried"), ("wire-w1", "uncertain")):
        page.goto(f"{site['base']}/runs/{run_id}")
        assert page.locator("section.item h2 .badge").first.inner_text() == call, run_id
        assert page.locator("section.item form").count() == (call == "uncertain"), run_id
    page.goto(f"{site['base']}/runs")
    shown = {row.locator("td a").first.inner_text(): row.locator(".badge").first.inner_text()
             for row in page.locator("#runs tbody tr").all()}
    assert {r: shown[r] for r in expected} == {r: e[1] for r, e in expected.items()}


def test_the_demo_run_shows_its_kill_and_resume(page: Any, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/runs/{RUN_ID}?after=0&limit=100")
    assert page.locator("#status").inner_text() == "finished"
    gap = page.locator("tr.gap")
    assert gap.count() == 1
    log = log_of(site["url"], RUN_ID)
    resumed = next(e for e in log if e.type is EventType.RUN_RESUMED)
    assert gap.get_attribute("data-seq") == str(resumed.seq)
    assert gap.get_attribute("data-kind") == "stopped"
    assert (f"the process holding lease epoch {resumed.epoch - 1} stopped mid-run after seq "
            f"{resumed.seq - 1}") in gap.inner_text()
    assert f"lease epoch {resumed.epoch} took over and resumed it" in gap.inner_text()
    epochs = page.locator("td.epoch").all_inner_texts()
    assert epochs == [str(e.epoch) for e in log]  # every event's lease epoch shown


def test_a_gap_says_whether_a_process_stopped_or_the_run_waited_for_a_person(
        page: Any, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/runs/decided-pay?after=0")
    gaps = page.locator("tr.gap")
    assert [gaps.nth(i).get_attribute("data-kind") for i in range(gaps.count())] == [
        "person", "after_decision"]
    waited, went_on = gaps.all_inner_texts()
    assert "the run waited" in waited and "for a person: carol approved approval-" in waited
    assert "(invoice checked)" in waited and "stopped" not in waited
    assert "after carol's decision, the run went on under lease epoch 3" in went_on


def test_time_travel_to_an_earlier_seq(page: Any, site: dict[str, Any]) -> None:
    log = log_of(site["url"], RUN_ID)
    first_effect = next(e for e in log if e.type is EventType.TOOL_CALL_STARTED
                        and e.payload["tool"] == "post_correction")
    page.goto(f"{site['base']}/runs/{RUN_ID}")
    page.fill("#time-travel input[name=seq]", str(first_effect.seq))
    page.click("#time-travel button")
    page.wait_for_url(f"**/state?seq={first_effect.seq}")
    assert page.locator("#at-seq").inner_text() == str(first_effect.seq)
    assert page.locator("#status-at").inner_text() == "running"
    corrections = page.locator("#calls tr[data-tool=post_correction]")
    assert corrections.count() == 1  # in flight then: uncertain at that seq
    assert corrections.locator(".outcome").inner_text() == "in flight"
    page.click("#earlier")  # one step further back
    page.wait_for_url(f"**/state?seq={first_effect.seq - 1}")
    assert page.locator("#calls tr[data-tool=post_correction]").count() == 0


KEY = re.compile(r"\b[0-9a-f]{64}\b")


def test_time_travel_and_diff_read_as_messages_and_calls(page: Any, site: dict[str, Any]) -> None:
    """No raw dump of 64-character keys: messages, and calls by tool and arguments with
    their outcome and duration (the raw fields stay one click away, folded)."""
    log = log_of(site["url"], RUN_ID)
    completed = [e for e in log if e.type is EventType.TOOL_CALL_COMPLETED]
    page.goto(f"{site['base']}/runs/{RUN_ID}/state?seq={len(log)}")
    rows = page.locator("#calls tr.call")
    calls = len({e.payload["idempotency_key"] for e in completed})
    assert rows.count() == calls
    first = rows.first
    assert first.locator(".outcome").inner_text().startswith("completed")
    assert first.locator(".took").inner_text().endswith(("ms", "s"))
    assert page.locator("#messages tr.message").count() >= 2
    assert page.locator("#messages tr.role-user").first.inner_text().count("\n") <= 2
    assert not KEY.search(page.locator("main").inner_text())  # the raw state is folded
    page.goto(f"{site['base']}/runs/{RUN_ID}/diff?a=1&b={len(log)}")
    assert "→ finished" in page.locator("#diff-status").inner_text()
    assert page.locator("#diff-calls tr.call").count() == calls
    assert page.locator("#diff-messages tr.message").count() >= 1
    assert not KEY.search(page.locator("main").inner_text())


def test_the_runs_list_has_cost_duration_and_search(page: Any, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/runs")
    demo = page.locator(f"#runs tr[data-run='{RUN_ID}']")
    assert demo.locator(".cost").inner_text().startswith("$")
    assert demo.locator(".duration").inner_text() != "-"
    page.fill("#search input[name=q]", "wire")
    with page.expect_navigation():
        page.click("#search button")
    assert [r.get_attribute("data-run") for r in page.locator("#runs tbody tr").all()] == [
        "wire-w1"]
    page.goto(f"{site['base']}/runs?q=payments")  # by agent
    assert {r.get_attribute("data-run") for r in page.locator("#runs tbody tr").all()} == {
        "pay-bob"}
    page.goto(f"{site['base']}/runs?status=stalled")  # by the state to act on
    assert [r.get_attribute("data-run") for r in page.locator("#runs tbody tr").all()] == [
        "stalled"]


def test_the_event_list_says_how_long_each_call_took(page: Any, site: dict[str, Any]) -> None:
    log = log_of(site["url"], RUN_ID)
    page.goto(f"{site['base']}/runs/{RUN_ID}?after=0&limit=100")
    for e in log:
        if e.type is EventType.TOOL_CALL_COMPLETED:
            assert "took " in page.locator(f"#seq-{e.seq} .summary").inner_text(), e.seq


def test_approving_makes_the_run_runnable(page: Any, site: dict[str, Any]) -> None:
    page.goto(site["base"] + "/")
    form = page.locator("section[data-run=pay-bob] form")
    assert [line.split(":")[0] for line in form.locator(".verdicts li").all_inner_texts()] == [
        "Approve", "Deny"]
    form.locator("input[name=by]").fill("alice")
    form.locator("input[name=reason]").fill("checked the invoice")
    with page.expect_navigation():
        form.locator("button[value=approve]").click()
    assert "Confirm: approve pay" in page.locator("h1").inner_text()  # one more click
    assert '"amount": 500' in page.locator("main").inner_text()
    with page.expect_navigation():
        page.locator("#confirm button[value=yes]").click()
    assert page.locator("section[data-run=pay-bob]").count() == 0  # back on the queue
    # which says what was recorded, and how the run goes on: the command to copy
    assert "alice approved approval" in page.locator("#decided").inner_text()
    assert page.locator("#next-command").inner_text() == (
        f"agentjournal resume pay-bob --store {site['url']}")
    page.goto(site["base"] + "/runs/pay-bob")
    assert page.locator("#status").inner_text() == "running"
    assert page.locator("#state").inner_text() == "runnable"
    decided = log_of(site["url"], "pay-bob")[-1]
    assert (decided.type, decided.payload["by"], decided.payload["approved"]) == (
        EventType.APPROVAL_DECIDED, "alice", True)


def test_a_result_that_is_not_json_is_shown_beside_the_field_and_kept(
        page: Any, site: dict[str, Any]) -> None:
    before = len(log_of(site["url"], "wire-w1"))
    for start, form_at in (("/runs/wire-w1", "section.uncertain form"),
                           ("/", "section[data-run=wire-w1] form")):
        page.goto(site["base"] + start)
        form = page.locator(form_at)
        form.locator("input[name=by]").fill("bob")
        form.locator("input[name=reason]").fill("the bank says so")
        form.locator("input[name=result]").fill('{"wired": 1')
        with page.expect_navigation():
            form.locator("button[value=happened]").click()
        form = page.locator(form_at)  # the same page again, the form as it was typed
        assert "the result is not JSON" in form.locator("#result-error").inner_text(), start
        assert [form.locator(f"input[name={n}]").input_value()
                for n in ("by", "reason", "result")] == ["bob", "the bank says so",
                                                          '{"wired": 1'], start
        assert page.locator("header").is_visible()  # a page of the viewer, not raw JSON
    assert len(log_of(site["url"], "wire-w1")) == before  # nothing recorded


def test_each_verdict_is_explained_and_an_irreversible_one_confirmed(
        page: Any, site: dict[str, Any]) -> None:
    page.goto(site["base"] + "/")
    lines = page.locator("section[data-run=wire-w1] .verdicts li").all_inner_texts()
    assert [line.split(":")[0] for line in lines] == [
        "It happened", "It did not happen", "Conflict"]
    assert all(len(line) > 40 for line in lines)  # a line each, saying what it does
    before = len(log_of(site["url"], "wire-w1"))
    form = page.locator("section[data-run=wire-w1] form")
    form.locator("input[name=reason]").fill("the bank has it")
    with page.expect_navigation():
        form.locator("button[value=happened]").click()
    assert "Confirm: it happened" in page.locator("h1").inner_text()
    assert "irreversible" in page.locator("#confirm-what").inner_text()
    assert len(log_of(site["url"], "wire-w1")) == before  # nothing recorded on one click
    with page.expect_navigation():
        page.locator("#confirm-back").click()
    assert page.url == site["base"] + "/"  # back where the form was, still open
    assert page.locator("section[data-run=wire-w1]").count() == 1
    assert len(log_of(site["url"], "wire-w1")) == before


def test_resolving_an_uncertain_call(page: Any, site: dict[str, Any]) -> None:
    page.goto(site["base"] + "/runs/wire-w1")
    form = page.locator("section.uncertain form")
    form.locator("input[name=by]").fill("bob")
    form.locator("input[name=reason]").fill("the bank has no such transfer")
    with page.expect_navigation():
        form.locator("button[value=did_not_happen]").click()
    with page.expect_navigation():  # wire is irreversible: confirmed
        page.locator("#confirm button[value=yes]").click()
    assert "/runs/wire-w1?" in page.url
    assert page.locator("section.uncertain").count() == 0
    assert page.locator("#state").inner_text() == "runnable"
    assert "bob said the call to wire did not happen" in page.locator("#decided").inner_text()
    assert "wire-w1" in page.locator("#next").inner_text()
    assert "paused because" not in page.locator("#head").inner_text()  # no longer true
    verdict = log_of(site["url"], "wire-w1")[-1]
    assert (verdict.type, verdict.payload["verdict"], verdict.payload["by"]) == (
        EventType.TOOL_CALL_RECONCILED, "absent", "bob")
    page.goto(site["base"] + "/")
    assert page.locator("section[data-run=wire-w1]").count() == 0


def test_a_queued_run_after_a_decision_waits_for_a_worker(page: Any, site: dict[str, Any]) -> None:
    page.goto(site["base"] + "/runs/queued-pay")
    with page.expect_navigation():
        page.locator("section.approval button[value=approve]").click()
    with page.expect_navigation():
        page.locator("#confirm button[value=yes]").click()
    assert "/runs/queued-pay?" in page.url  # back on the run's page
    assert "approved approval" in page.locator("#decided").inner_text()
    assert "a worker will take it up" in page.locator("#next").inner_text()
    assert "no worker has been seen" in page.locator("#worker-silent").inner_text()
    assert page.locator("#next-command").count() == 0  # nothing to type


def test_no_page_scrolls_sideways_on_a_phone(site: dict[str, Any], tmp_path: Path) -> None:
    """At 390 px wide every page fits: no sideways scrolling, and what a person acts on
    (a run's state, the decision buttons) is on screen."""
    context = site["browser"].new_context(viewport={"width": 390, "height": 844},
                                          is_mobile=True, has_touch=True)
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    key = next(e.payload["key"] for e in log_of(site["url"], "wire-w1") if "key" in e.payload)
    paths = ["/", "/runs", f"/runs/{RUN_ID}", "/runs/pay-bob", "/runs/wire-w1", "/runs/markup",
             "/runs/held", f"/runs/{RUN_ID}/state?seq=5", f"/runs/{RUN_ID}/diff?a=1&b=20",
             f"/runs/{RUN_ID}/events", f"/runs/wire-w1/calls/{key[:12]}", "/runs/nope"]
    try:
        for n, path in enumerate(paths):
            tab.goto(site["base"] + path)
            tab.screenshot(path=str(tmp_path / f"phone-{n}.png"), full_page=True)
            wide = tab.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, (path, wide)
            for what in ("#state", "#state-detail", "form.decide button"):
                for i in range(tab.locator(what).count()):
                    box = tab.locator(what).nth(i).bounding_box()
                    assert box is not None and box["x"] >= 0 and \
                        box["x"] + box["width"] <= 390, (path, what, box)
    finally:
        context.close()
    assert (tmp_path / "phone-0.png").stat().st_size > 0


def test_markup_from_a_tool_stays_text(page: Any, site: dict[str, Any]) -> None:
    page.goto(site["base"] + "/runs/markup")
    page.locator("details").first.click()
    assert page.title() != "pwned" and "pwned" not in page.title()
    assert page.locator("img[src=x]").count() == 0
    assert HOSTILE[:30] in page.locator("#timeline").inner_text()


def test_a_live_run_updates_without_reload(page: Any, site: dict[str, Any]) -> None:
    go, started = threading.Event(), threading.Event()

    def drive() -> None:
        store = open_store(site["url"])
        try:
            script = [calls(("fetch_page", {"url": f"http://x/{n}"})) for n in range(3)]
            Agent(ScriptedModel([*script, reply("done")]), [fetch_page]).run(
                store, "live", "read three pages", observer=lambda e, s: _pace(e, go, started))
        finally:
            store.close()

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    assert started.wait(60)  # the run exists, and waits for the page before going on
    page.goto(site["base"] + "/runs/live")
    page.evaluate("window.__loadedOnce = true")
    shown = int(page.locator("#timeline tbody tr.event").last.get_attribute("data-seq"))
    go.set()
    thread.join(60)
    last = len(log_of(site["url"], "live"))
    assert last > shown
    page.locator(f"#seq-{last}").wait_for()  # appended by the event stream
    assert page.evaluate("window.__loadedOnce") is True  # the same page: no reload
    seqs = [int(s) for s in page.locator("#timeline tbody tr.event").evaluate_all(
        "rows => rows.map(r => r.dataset.seq)")]
    assert seqs == list(range(1, last + 1))  # every event once, in order
    assert page.locator("#event-count").inner_text() == str(last)


def test_a_live_page_moves_together_as_of_one_seq(page: Any, site: dict[str, Any]) -> None:
    """Opened while a call is in flight, the page follows the run to its end: the state,
    the counts, the open calls and the table all as of the last seq."""
    go, started = threading.Event(), threading.Event()

    def hold_in_flight(event: Any, state: Any) -> None:
        if event.type is EventType.TOOL_CALL_STARTED and not started.is_set():
            started.set()
            go.wait(60)

    def drive() -> None:
        store = open_store(site["url"])
        try:
            Agent(ScriptedModel([calls(("fetch_page", {"url": "http://x/1"})), reply("done")]),
                  [fetch_page]).run(store, "moving", "read a page", observer=hold_in_flight)
        finally:
            store.close()

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    assert started.wait(60)
    page.goto(site["base"] + "/runs/moving")
    assert page.locator("#state").inner_text() == "running"
    assert page.locator("section.in-flight").count() == 1  # the call, while it runs
    opened_at = int(page.locator("#as-of-seq").inner_text())
    go.set()
    thread.join(60)
    last = len(log_of(site["url"], "moving"))
    assert last > opened_at
    sync_api.expect(page.locator("#as-of-seq")).to_have_text(str(last), timeout=TIMEOUT_MS)
    assert page.locator("#state").inner_text() == "finished"
    assert page.locator("#status").inner_text() == "finished"
    assert page.locator("#event-count").inner_text() == str(last)
    assert page.locator("section.in-flight, section.uncertain").count() == 0
    page.locator(f"#seq-{last}").wait_for()
    seqs = page.locator("#timeline tbody tr.event").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.seq))")
    assert seqs == list(range(1, last + 1))


def _pace(event: Any, go: threading.Event, started: threading.Event) -> None:
    """Hold the run after its first batch until the page is open."""
    if event.seq <= 2 and not started.is_set():
        started.set()
        go.wait(60)

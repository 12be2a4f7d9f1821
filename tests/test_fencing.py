"""Effects are fenced, not only appends: right before a tool with an effect runs, the
loop checks its lease by a local monotonic deadline, and stops if it may have been
superseded. (The multi-process version, with SIGSTOP and a real receiver, is in
test_crash.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentjournal import EventType, LeaseExpiredError, StoreUnavailableError, open_store
from agentjournal import steps as steps_module
from agentjournal.agent import Agent
from agentjournal.models import ScriptedModel, calls, reply
from agentjournal.store import Lease, Store
from agentjournal.tools import ToolContext, tool

E = EventType
TTL = 0.5


@pytest.fixture
def store(each_backend: str) -> Iterator[Store]:
    store = open_store(each_backend)
    yield store
    store.close()


class Outage:
    """Makes the store's renewals fail while ``on``: a heartbeat that cannot get through."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        real = store.renew

        def renew(lease: Lease, ttl: float) -> Lease:
            if self.on:
                raise StoreUnavailableError("test://", "renewals are down")
            return real(lease, ttl)

        monkeypatch.setattr(store, "renew", renew)
        real_all = getattr(store, "renew_all", None)
        if real_all is not None:  # the journals' shared heartbeat renews through it

            def renew_all(leases: list[Lease], ttl: float) -> dict[str, Lease]:
                if self.on:
                    raise StoreUnavailableError("test://", "renewals are down")
                return real_all(leases, ttl)  # type: ignore[no-any-return]

            monkeypatch.setattr(store, "renew_all", renew_all)


def pause_before_effect(monkeypatch: pytest.MonkeyPatch, then: Any) -> None:
    """At the before_effect point, call ``then()``: the worker's pause."""
    real = steps_module.fault_point

    def point(name: str) -> None:
        real(name)
        if name == "before_effect":
            then()

    monkeypatch.setattr(steps_module, "fault_point", point)


def posting_agent(sent: list[int]) -> Agent:
    @tool(effect="irreversible")
    def post(ctx: ToolContext) -> str:
        sent.append(ctx.epoch)
        return "posted"

    return Agent(ScriptedModel([calls(("post", {})), reply("done")]), [post], lease_ttl=TTL)


def test_a_worker_whose_lease_was_taken_over_stops_before_the_effect(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outage = Outage(store, monkeypatch)
    taken: list[Lease] = []

    def paused_past_its_lease() -> None:
        outage.on = True
        time.sleep(TTL + 0.2)
        taken.append(store.acquire("r1", "successor", 30))  # a successor takes over
        outage.on = False

    pause_before_effect(monkeypatch, paused_past_its_lease)
    sent: list[int] = []
    before: list[str] = []
    with pytest.raises(LeaseExpiredError) as raised:
        posting_agent(sent).run(store, "r1", "t",
                                observer=lambda e, s: before.append(e.type.value))
    assert sent == []  # the effect was not attempted
    assert raised.value.epoch == 1 and taken[0].epoch == 2 and raised.value.tool == "post"
    # Nothing appended after the start: the successor settles that call.
    assert [e.type.value for e in store.read("r1")] == before
    assert before[-1] == "tool_call_started"


def test_a_lapsed_lease_nobody_took_is_renewed_and_the_call_goes_ahead(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outage = Outage(store, monkeypatch)

    def paused_past_its_lease() -> None:
        outage.on = True
        time.sleep(TTL + 0.2)
        outage.on = False

    pause_before_effect(monkeypatch, paused_past_its_lease)
    sent: list[int] = []
    result = posting_agent(sent).run(store, "r1", "t")
    assert result.status == "finished" and sent == [1]


def test_read_only_calls_are_not_held_back_by_the_check(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outage = Outage(store, monkeypatch)
    taken: list[Lease] = []

    def paused_past_its_lease() -> None:
        outage.on = True
        time.sleep(TTL + 0.2)
        taken.append(store.acquire("r1", "successor", 30))

    pause_before_effect(monkeypatch, paused_past_its_lease)
    looked: list[int] = []

    @tool(effect="read_only")
    def look(ctx: ToolContext) -> str:
        looked.append(ctx.epoch)
        return "seen"

    agent = Agent(ScriptedModel([calls(("look", {})), reply("done")]), [look], lease_ttl=TTL)
    with pytest.raises(Exception, match="superseded"):  # its completion is fenced
        agent.run(store, "r1", "t")
    assert looked == [1]

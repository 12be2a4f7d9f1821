"""Which agents a worker runs (fleet/trust.py): a ref is checked as text against the
agents the worker was told to trust before anything is imported, and what it names must
be an Agent or a factory of one, never any other callable. Worker processes that meet
hostile refs are in tests/test_worker.py; here the rules themselves, and the Python API's
registry driving a real Worker on every backend with a queue."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentjournal import Agent, ScriptedModel, open_store, reply
from agentjournal.errors import AgentRefError
from agentjournal.fleet import Runnable, Stopped, submit
from agentjournal.fleet.trust import AgentTrust
from agentjournal.fleet.worker import Worker

from . import fleet_agents
from .builders import drive_until
from .conftest import fresh_url


@pytest.mark.parametrize("ref, why", [
    ("os:abort", "not among the agents this worker trusts"),
    ("tests.fleet_agentsx:counter", "not among"),  # a prefix ends at a dot
    ("tests:counter", "not among"),
    ("tests.fleet_agents:_write_line", "private"),
    ("tests.fleet_agents:counter.__globals__", "private"),
    ("tests.fleet_agents:counter()", "not MODULE:OBJECT"),
    ("tests.fleet_agents", "not MODULE:OBJECT"),
    (".fleet_agents:counter", "not MODULE:OBJECT"),
    ("tests.fleet_agents:\x1b[31mred", "not MODULE:OBJECT"),
    ("tests.fleet_agents :counter", "not MODULE:OBJECT"),
])
def test_a_ref_is_refused_as_text_before_any_import(ref: str, why: str) -> None:
    trust = AgentTrust(["tests.fleet_agents", "elsewhere.agents:one"])
    before = set(sys.modules)
    with pytest.raises(AgentRefError, match=why):
        trust.load(ref)
    assert set(sys.modules) == before  # nothing imported


@pytest.mark.parametrize("ref", ["tests.fleet_agents:counter", "tests.fleet_agents.sub:x",
                                 "elsewhere.agents:one"])
def test_a_ref_inside_a_trusted_prefix_or_named_whole_passes_the_text_check(ref: str) -> None:
    AgentTrust(["tests.fleet_agents", "elsewhere.agents:one"]).check(ref)


def test_elsewhere_agents_named_whole_trusts_that_ref_only() -> None:
    with pytest.raises(AgentRefError, match="not among"):
        AgentTrust(["elsewhere.agents:one"]).check("elsewhere.agents:two")


@pytest.mark.parametrize("ref, why", [
    ("tests.fleet_agents:os.abort", "builtin"),  # never called: the test lives on
    ("tests.fleet_agents:os.fork", "builtin"),
    ("tests.fleet_agents:time.sleep", "builtin"),
    ("tests.fleet_agents:explode", "Tool"),
    ("tests.fleet_agents:ENV", "str"),
    ("tests.fleet_agents:calls", "defined in agentjournal.models"),  # imported, not theirs
    ("tests.fleet_agents:os", "module"),
])
def test_what_a_trusted_ref_names_must_be_an_agent_factory(ref: str, why: str) -> None:
    with pytest.raises(AgentRefError, match=f"not an Agent.*{why}|{why}.*not an Agent"):
        AgentTrust(["tests.fleet_agents"]).load(ref)


def test_a_factory_is_a_function_annotated_to_return_an_agent_and_its_result_checked(
        ) -> None:
    trust = AgentTrust(["tests.fleet_agents", "tests.test_agent_trust"])
    assert isinstance(trust.load("tests.fleet_agents:counter"), Agent)
    with pytest.raises(AgentRefError, match="not annotated"):
        trust.load("tests.test_agent_trust:unannotated")
    with pytest.raises(AgentRefError, match="returned a str, not an Agent"):
        trust.load("tests.test_agent_trust:lying")
    with pytest.raises(AgentRefError, match="takes arguments"):
        trust.load("tests.test_agent_trust:needs_args")
    assert isinstance(trust.load("tests.test_agent_trust:AN_AGENT"), Agent)


def unannotated():  # type: ignore[no-untyped-def]
    return AN_AGENT


def lying() -> Agent:
    return "not an agent"  # type: ignore[return-value]


def needs_args(model: str) -> Agent:
    return AN_AGENT


AN_AGENT = Agent(ScriptedModel([reply("done")]), [])


def test_a_registry_trusts_its_refs_only_and_imports_nothing() -> None:
    trust = AgentTrust({"made:here": AN_AGENT, "made:by_factory": lambda: AN_AGENT})
    assert trust.load("made:here") is AN_AGENT
    assert trust.load("made:by_factory") is AN_AGENT
    with pytest.raises(AgentRefError, match="not among"):
        trust.load("tests.fleet_agents:counter")


def test_a_worker_must_be_given_the_agents_it_trusts() -> None:
    with pytest.raises(ValueError, match="trust"):
        Worker("sqlite:///unused.db", agents=[])
    with pytest.raises(ValueError, match="prefix"):
        Worker("sqlite:///unused.db", agents=["os:"])
    with pytest.raises(TypeError):
        Worker("sqlite:///unused.db")  # type: ignore[call-arg]


@pytest.fixture(params=("sqlite", "postgres"))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_url(request.param, tmp_path)


def test_a_worker_with_a_registry_runs_its_agents_and_parks_the_rest(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fleet_agents.ENV, str(tmp_path / "effects.txt"))
    with open_store(url) as store:
        submit(store, "mine:counter", "count", "good")
        submit(store, "never_imported_module:agent", "t", "bad")
    worker = Worker(url, agents={"mine:counter": fleet_agents.counter}, poll=0.05)
    runs: list[Any] = []

    def settled(queue: Any) -> bool:
        runs[:] = queue.runs()
        return {r.run_id: r.state for r in runs} == {"good": "done", "bad": "parked"}

    drive_until(worker, url, settled)
    (bad,) = [r for r in runs if r.run_id == "bad"]
    assert "never_imported_module" not in sys.modules
    assert (bad.claims, bad.crashes) == (1, 0)
    assert bad.reason is not None and "not among the agents this worker trusts" in bad.reason
    lines = (tmp_path / "effects.txt").read_text().split("\n")
    assert [line.split()[:2] for line in lines if line] == [["good", "a"], ["good", "b"]]


# --- another framework's agent: a Runnable (fleet/runnable.py) ---------------------------


class OtherFramework:
    """A Runnable: an agent of another framework, which a worker drives by run_claimed."""

    def run_claimed(self, store: Any, run_id: str, task: str | None, *, agent_ref: str,
                    owner: str, ttl: float, stop: threading.Event) -> Stopped:
        return Stopped("finished", 1, 1)


A_RUNNABLE = OtherFramework()


def runnable_factory() -> OtherFramework:
    return OtherFramework()


def runnable_liar() -> OtherFramework:
    return "not runnable"  # type: ignore[return-value]


def test_a_runnable_or_a_factory_annotated_to_return_its_class_is_trusted() -> None:
    trust = AgentTrust(["tests.test_agent_trust"])
    assert trust.load("tests.test_agent_trust:A_RUNNABLE") is A_RUNNABLE
    assert isinstance(trust.load("tests.test_agent_trust:runnable_factory"), OtherFramework)
    assert isinstance(OtherFramework(), Runnable)
    with pytest.raises(AgentRefError, match="returned a str, not an Agent or a Runnable"):
        trust.load("tests.test_agent_trust:runnable_liar")
    # The class itself has a run_claimed attribute but is no Runnable: a call would make
    # one, so it is refused like any other callable that is not a factory.
    with pytest.raises(AgentRefError, match="not an Agent, a Runnable"):
        trust.load("tests.test_agent_trust:OtherFramework")


def test_a_runnable_ref_is_still_checked_as_text_before_any_import() -> None:
    trust = AgentTrust(["tests.test_agent_trust"])
    before = set(sys.modules)
    for ref in ("tests.test_agent_trustx:A_RUNNABLE", "tests.test_agent_trust:_private",
                "os:abort"):
        with pytest.raises(AgentRefError):
            trust.load(ref)
    assert set(sys.modules) == before


def test_a_registry_may_map_a_ref_to_a_runnable() -> None:
    trust = AgentTrust({"made:runnable": A_RUNNABLE, "made:factory": OtherFramework})
    assert trust.load("made:runnable") is A_RUNNABLE
    assert isinstance(trust.load("made:factory"), OtherFramework)

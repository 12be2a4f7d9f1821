"""The thread a sync tool call runs on, so its caller can stop waiting at the timeout:
reused from call to call, let go with an abandoned call, stopped with its runner, and
never shared with a forked child (which gets its own)."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest

from agentjournal.tools import CallGuard, CallRunner, ToolTimedOut


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    """Set at the end of the test, so an abandoned call can finish."""
    gate = threading.Event()
    yield gate
    gate.set()


def the_thread(runner: CallRunner) -> threading.Thread:
    """The thread ``runner`` makes its calls on."""
    ident = runner.call(threading.get_ident, 60, CallGuard(), "ident")
    (thread,) = [t for t in threading.enumerate() if t.ident == ident]
    return thread


def test_calls_share_one_thread_and_return_what_the_call_did() -> None:
    runner = CallRunner()
    thread = the_thread(runner)
    assert thread is not threading.current_thread() and thread.daemon
    assert [runner.call(lambda i=i: i * 2, 60, CallGuard(), "double")  # type: ignore[misc]
            for i in range(100)] == list(range(0, 200, 2))
    assert the_thread(runner) is thread

    def fails() -> None:
        raise KeyError("no such order")

    with pytest.raises(KeyError, match="no such order"):
        runner.call(fails, 60, CallGuard(), "fails")
    assert the_thread(runner) is thread  # an error is the call's, not the thread's


def test_a_call_past_its_timeout_is_abandoned_with_its_thread(hang: threading.Event) -> None:
    runner, guard = CallRunner(), CallGuard()
    stuck = the_thread(runner)
    with pytest.raises(ToolTimedOut, match=r"slow did not return within 0\.1s"):
        runner.call(hang.wait, 0.1, guard, "slow")
    assert guard.abandoned
    assert runner.call(lambda: "next", 60, CallGuard(), "next") == "next"
    assert the_thread(runner) is not stuck  # the next call got a thread of its own
    hang.set()
    stuck.join(60)
    assert not stuck.is_alive()  # once its call returned, the abandoned thread ended


def test_a_runner_let_go_stops_its_thread() -> None:
    runner = CallRunner()
    thread = the_thread(runner)
    del runner
    gc.collect()
    thread.join(60)
    assert not thread.is_alive()


def test_a_forked_child_makes_its_calls_on_a_thread_of_its_own() -> None:
    runner = CallRunner()
    parents = the_thread(runner)
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not in it
        try:
            tid = runner.call(threading.get_native_id, 5, CallGuard(), "tid")
            os._exit(0 if tid not in (parents.native_id, threading.get_native_id()) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert the_thread(runner) is parents  # the child never woke the parent's thread
    assert runner.call(lambda: "still", 60, CallGuard(), "still") == "still"

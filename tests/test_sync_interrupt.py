"""Ctrl-C on a bridged sync batch (agentjournal.bridge ``call_batch``), whose calls run at
once on other threads while the user's main thread waits for them to complete: a real
subprocess, Ctrl-C forced into the race of tests/test_cli_interrupt.py (its handler ran
before the main thread began to wait, so it does not end that wait)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentjournal import open_store

from .conftest import BACKENDS
from .test_cli_interrupt import HANG

SCRIPT = '''
import linecache
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from agentjournal import CallSpec, ToolContext, open_run, open_store


def main_stack() -> list:
    frame = sys._current_frames().get(threading.main_thread().ident)
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    return stack


def main_thread_waits_on_the_batch() -> bool:
    """Whether the main thread is in its wait for the batch's completions (past its
    last look for a signal), not in one while it starts the batch's threads."""
    stack = main_stack()
    return (bool(stack) and stack[0].f_code is threading.Condition.wait.__code__
            and "waiter.acquire(" in linecache.getline(stack[0].f_code.co_filename,
                                                       stack[0].f_lineno)
            and any(f.f_code.co_name == "_invoke_sync" for f in stack)
            and not any(f.f_code is threading.Thread.start.__code__ for f in stack))


def main_thread_gave_up_the_batch() -> bool:
    """Whether the main thread left the wait (interrupted) and now lets the pool end."""
    return any(f.f_code is ThreadPoolExecutor.shutdown.__code__ for f in main_stack())


both = threading.Barrier(2)


def signalled(ctx: ToolContext) -> str:
    """Ctrl-C taken by this thread once the main thread waits on the batch; returns
    once the main thread gave up waiting on it (never, if Ctrl-C is lost)."""
    both.wait()
    while not main_thread_waits_on_the_batch():
        time.sleep(0.001)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    print("SIGNALLED", flush=True)
    while not main_thread_gave_up_the_batch():
        time.sleep(0.001)
    return "done"


def other(ctx: ToolContext) -> str:
    both.wait()
    while not main_thread_gave_up_the_batch():
        time.sleep(0.001)
    return "done"


store = open_store(sys.argv[1])
try:
    with open_run(store, "b1", input="hi") as run:
        run.call_batch([CallSpec(tool="signalled", args={}, call_id="c0", body=signalled),
                        CallSpec(tool="other", args={}, call_id="c1", body=other)])
    print("NOT INTERRUPTED", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
finally:
    store.close()
'''


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_ctrl_c_whose_handler_ran_before_the_main_thread_waited_on_a_batch_interrupts_it(
        store_url: str, tmp_path: Path) -> None:
    """The batch is given up: neither call is recorded as completed (the main thread
    records completions, and it stopped waiting for them), not waited on until its
    calls return (here: never; the hang guard fails the test first)."""
    (tmp_path / "batch.py").write_text(SCRIPT)
    child = subprocess.Popen([sys.executable, "batch.py", store_url], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        out, err = child.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:  # hung: its threads' stacks say where (faulthandler)
        child.send_signal(signal.SIGABRT)
        out, err = child.communicate(timeout=HANG)
        raise AssertionError(f"the batch hung after Ctrl-C:\n{out}\n{err}") from None
    assert out.split() == ["SIGNALLED", "INTERRUPTED"], (out, err)
    store = open_store(store_url)
    try:
        events = [e.type.value for e in store.read("b1")]
    finally:
        store.close()
    assert events.count("tool_call_started") == 2, events
    assert "tool_call_completed" not in events, events

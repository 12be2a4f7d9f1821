"""``agentjournal bench``: every figure measured beside its physical floor, in one process.

Machines of this class are shared and noisy (±30 % run to run, up to 2x for
micro-benchmarks), so an absolute number means little on its own; the ratio
to a floor measured moments earlier, in the same process, holds. One
convention everywhere: ``ratio = value / floor``. For a duration or a size
that is "how many floors it costs" (lower is better); for a throughput
(events/s) it is "what fraction of the floor's speed it reaches" (higher is
better).

Figure families (a name up to its first dot):

    append, tool_call              durable appends (fsync) per backend vs a raw write + sync
    replay                         fold(decode(...)) vs decode-only, events/s
    recovery, recovery_growth      open the store + load_state, with and without snapshots, of a
                                   run that compacts its context every 100 steps
    snapshot_write                 write_snapshot vs msgpack encode + write + fsync
    storage, storage_growth        bytes per event and per step as the run grows
    cpu_per_event                  envelope + encode + write with syncing off
    chain                          the digest chain per event: seal vs encode, check vs decode
    agent_step, agent_step_growth  a real Agent loop, syncing off: µs per step at 200 and 2,000
                                   steps vs 1 INSERT+COMMIT per step (hand-written)
    step                           the Agent as shipped (synced, snapshots on) per step vs
                                   2 records per step, each INSERT+COMMIT (hand-written)
    group_commit                   100 concurrent runs appending to one SQLite store, durable
                                   events/s vs one connection's commits/s
    check                          µs per run of `agentjournal check` over N unfinished runs
                                   (10,000; 1,000 with --quick) vs load_state of each
    saga                           µs per effect undone by compensate (no-op undo) vs one
                                   durable effect (started + completed appends), per backend
    workspace                      a checkpoint of 3 changed files in a 1,000-file workspace
                                   vs git add + commit of the same change
    gc                             runs archived/s by gc vs writing each run's records to a
                                   synced file; the archive's bytes per event vs the store's
    temporal                       ms/step of a run as a JournalRun workflow vs by Agent.run;
                                   history events of a run of N steps vs N/10
    parallel_turn                  a turn of 8 concurrent 100 ms calls vs the same turn with 1
    model_step, model_call         the loop's part of a step with a real adapter (stub server)
                                   vs ScriptedModel; the adapter + SDK's own part of a call
    fleet, claim                   runs/s and events/s of 1-8 worker processes on Postgres vs
                                   its commit floor; claim + hand-back latency p50/p99
    peers (--peers)                LangGraph and eventsourcing on the same workload, per step
                                   and on resume, beside agentjournal and the hand-written floor

Beside the figures, ``targets`` (bench/targets.py) holds each target's limit and whether
this run met it. ``--only`` runs some of the command's sections (``command.SECTIONS``,
each one measuring function: ``cpu``, ``step``, ``group-commit``, ...), for working on
one figure without the rest of the run; the other sections' targets read "not measured".
The imports run one way: ``command`` imports the sections, ``targets`` and ``plots``
(``--plot``'s PNGs), and none of them imports ``command``; the shared modules they draw
on import no other part of the bench: ``_common``, ``postgres`` (whether a server can be
measured, throwaway schemas) and ``fleet_settings`` (read by the fleet section and by
its takeover target alike).

Scratch stores are throwaway: the command removes its directory afterwards,
and Postgres runs in its own ``bench_<random>`` schema, dropped at the end.
"""

from ._common import Figure
from .command import bench, run_bench

__all__ = ["Figure", "bench", "run_bench"]

"""Runtimes host the searchers and move data; the training loop (tba.algorithm.loop) is the same for all of them
(a sharded trainer's ranks are tba.ranks').

    inline.py         one process: search and training alternate (and `offline`: no searchers)
    local.py          searcher processes on this machine (torch.multiprocessing)
    visibility.py     which GPUs each local searcher process sees, and the placement rules
    ray.py            searcher actors on a Ray cluster
    worker.py         what every runtime shares: RuntimeParts, building a searcher, one worker step, the report
    searcher_spec.py  what a searcher is built from, picklable (never the run's config)
    supervision.py    heartbeats and the restart budget of searchers that live elsewhere
    forkserver.py     local searchers fork from a server that imported tba once
    lifetime.py       no process outlives its run: searchers watch their trainer, the trainer ends its children
    transport/        how published weights travel: shared memory / CUDA IPC, broadcast, Ray's object store,
                      vLLM's own weight transfer

This file is the registry (light: config validation reads it without importing torch): `RUNTIMES` maps
`runtime` to the `tba.plugins` target of its factory, `TRANSPORTS` lists `search.weight_transport`'s choices.
The protocol a runtime meets is tba.algorithm.runtime.Runtime. Adding a runtime: one module with a class that
meets it and a `build(parts: RuntimeParts)` function, plus one line here (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeEntry:
    name: str
    target: str
    """`module:function`, loaded when a run builds this runtime: function(tba.runtime.worker.RuntimeParts) → Runtime
    (a name, not an import: validating a config imports no runtime)."""
    summary: str


RUNTIMES: dict[str, RuntimeEntry] = {e.name: e for e in (
    RuntimeEntry("inline", "tba.runtime.inline:build_inline",
                 "one process: search and training alternate (debugging, the sync baseline)"),
    RuntimeEntry("local", "tba.runtime.local:build", "searcher processes on this machine (torch.multiprocessing)"),
    RuntimeEntry("ray", "tba.runtime.ray:build", "searcher actors on a Ray cluster"),
    RuntimeEntry("offline", "tba.runtime.inline:build_offline",
                 "no searchers: train on a saved buffer.sqlite (buffer.source)"),
)}

TRANSPORTS: dict[str, str] = {
    "shared": "flat buffers handed to searcher processes: host shared memory, or CUDA IPC when all share the "
              "trainer's GPU",
    "broadcast": "a torch.distributed group fed by the trainer (NCCL between GPUs, gloo on CPU)",
    "object_store": "Ray's object store: ray.put once per version, fetched once per node (ray only)",
    "vllm": "vLLM's NCCL weight transfer from the trainer's GPU straight into each vLLM engine (local only)",
}
"""`search.weight_transport` (besides `auto`): each has a sender (`tba.runtime.transport.make_sender`) and a
receiver."""

START_METHODS = ("auto", "forkserver", "spawn")
"""`supervision.start_method`: how runtime=local starts searcher processes (tba.runtime.forkserver)."""

"""Runtimes host the searchers and move data; the training loop (tba.loop) is the same for all of them.

This file is the registry (light: config validation reads it without importing torch): `RUNTIMES` maps
`runtime` to a factory, `TRANSPORTS` lists `search.weight_transport`'s choices. tba.runtime.base defines the
seam (`Runtime`); tba.runtime.supervision is what the worker runtimes share. Adding a runtime: one module
with a class that meets `Runtime` (the process or actor plumbing; `WorkerRuntime` brings the supervision),
plus one line here (docs/architecture.md, "Adding a runtime or a sampler").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeSpec:
    name: str
    factory: str
    """`module:function`, imported when a run builds this runtime: function(cfg, **parts) → Runtime, parts as
    `tba.build.build_runtime` passes them (a name, not an import: validating a config imports no runtime)."""
    summary: str

    def build(self, cfg, **parts):
        module, function = self.factory.split(":")
        return getattr(importlib.import_module(module), function)(cfg, **parts)


RUNTIMES: dict[str, RuntimeSpec] = {s.name: s for s in (
    RuntimeSpec("inline", "tba.runtime.inline:build_inline",
                "one process: search and training alternate (debugging, the sync baseline)"),
    RuntimeSpec("local", "tba.runtime.local:build", "searcher processes on this machine (torch.multiprocessing)"),
    RuntimeSpec("ray", "tba.runtime.ray:build", "searcher actors on a Ray cluster"),
    RuntimeSpec("offline", "tba.runtime.inline:build_offline",
                "no searchers: train on a saved buffer.sqlite (buffer.source)"),
)}

TRANSPORTS: dict[str, str] = {
    "shared": "flat buffers on the trainer's device handed to searcher processes (CPU shared memory, CUDA IPC)",
    "broadcast": "a torch.distributed group fed by the trainer (NCCL between GPUs, gloo on CPU)",
    "object_store": "Ray's object store: ray.put once per version, fetched once per node (ray only)",
}
"""`search.weight_transport` (besides `auto`): each has a sender (`tba.runtime.transport.make_sender`) and a
receiver."""

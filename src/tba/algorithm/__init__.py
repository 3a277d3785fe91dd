"""The algorithm: TBA as the paper describes it, and nothing about where searchers run.

    loop.py        the order of operations: prefill, then per update collect → draw → update → publish
    trainer.py     one optimizer step of an objective on a batch of buffer draws
    objectives/    the losses, one file each (tb.py: VarGrad Trajectory Balance), and their registry
    buffer.py      the replay buffer: per-prompt histories, recency windows, eviction, restore
    sampling.py    the sampling rule: recency with probability m, else softmax(ι·r) over a prompt's history
    store.py       the buffer's durable half (SQLite): every accepted group is on disk before it is drawn
    runtime.py     the protocol a runtime meets (tba.runtime hosts the searchers; this package imports none)
    types.py       what crosses between components: Sample, Group, Draw
    state.py · monitor.py · metrics.py · seeding.py · timeout.py   the loop's state, clocks, metrics, seeds

Nothing here imports a runtime, Ray, multiprocessing, torch.distributed or vLLM (tests/test_layout.py).
"""

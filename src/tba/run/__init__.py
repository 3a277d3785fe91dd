"""One run: everything built from a config, trained around the loop, and what it leaves on disk.

    train.py       a run, fresh or resumed, to its summary (`tba train`); the SFT warm start alone (`tba sft`)
    build.py       every part a run trains with, from its config (the only reader of a whole RunConfig), the
                   trainer too: one process or N FSDP2 ranks (tba.run.sharded, tba.ranks)
    searchers.py   the searchers' part of it: groups, placements, sampler and task specs, the runtime
    plan.py        the memory each device needs, from the config alone (`tba plan`, checked by `tba train`)
    checkpoint.py  atomic full checkpoints        rundir.py   the run directory's rules
    logger.py      metrics.jsonl and logging.report_to's backends (reporters.py: TensorBoard, W&B, trackio,
                   MLflow)                         summary.py  summary.json
    utilization.py trainer/mfu: the update's model FLOPs over the devices' peak (peak.py: a GPU table, a CPU's
                   measured matmul rate)
    progress.py    the live bar, Ctrl-C, the before/after table
    sft.py         the builtin model's warm start  export.py   a servable model    report.py   figures
"""

"""A sharded trainer across nodes for real: a two-node Ray cluster on this machine (a head and a second node, each
with one `trainer` resource), `tba train` with trainer.world_size=2 and one rank per node (STRICT_SPREAD), a
searcher beside it; the run checkpoints, its controller is killed with SIGKILL, and `tba train --resume` finishes
it. Ray's own node table shows the two ranks on the two nodes. Only this cluster's processes are stopped."""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from test_ray_cluster import BIN, free_port, stop_cluster

ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_two_trainer_ranks_on_two_nodes_checkpoint_are_killed_and_resume(tmp_path):
    from runs import TINY

    port = free_port()
    temp = tempfile.mkdtemp(prefix="tba-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    ray_cli = str(BIN / "ray") if (BIN / "ray").exists() else shutil.which("ray")

    def sh(*args, timeout=180):
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)

    out = tmp_path / "run"
    args = [*TINY, f"output_dir={out}", f"sft.cache_dir={tmp_path / 'cache'}", "runtime=ray",
            f"ray.address=127.0.0.1:{port}", "trainer.world_size=2", "trainer.prompts_per_step=4",
            "ray.trainer_placement=STRICT_SPREAD", "ray.trainer_resources={trainer: 1}", "threads=1",
            "search.num_searchers=1", "ray.searcher_cpus=1", "sft.enabled=false", "checkpoint.every_steps=2",
            "eval.every_steps=1000"]
    try:
        head = sh(ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                  '--resources={"trainer": 1}', "--include-dashboard=false", "--disable-usage-stats",
                  f"--temp-dir={temp}/head")
        assert head.returncode == 0, head.stderr
        node = sh(ray_cli, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                  '--resources={"trainer": 1}', "--disable-usage-stats", f"--temp-dir={temp}/node")
        assert node.returncode == 0, node.stderr
        proc = subprocess.Popen([str(BIN / "tba"), "train", *args, "trainer.steps=400"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ckpt = out / "checkpoints" / "latest"
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if ckpt.is_file() and int(ckpt.read_text().split("_")[1]) >= 4:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert ckpt.is_file(), "no checkpoint within 600 s"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        step = int(ckpt.read_text().split("_")[1])
        resumed = sh(str(BIN / "tba"), "train", "--resume", str(out), f"trainer.steps={step + 2}", timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["trainer_steps"] == step + 2 and summary["resumed_at_steps"] == [step]
        ranks = {r["rank"]: r["node_id"] for r in summary["trainer_ranks"]}

        probe = (f"import json, ray; ray.init(address='127.0.0.1:{port}', logging_level='ERROR');"
                 "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))")
        nodes = sh(sys.executable, "-c", probe)
        assert nodes.returncode == 0, nodes.stderr
        alive = set(json.loads(nodes.stdout.strip().splitlines()[-1]))
        assert len(alive) == 2 and set(ranks) == {0, 1} and set(ranks.values()) == alive  # one rank on each node
    finally:
        left = stop_cluster(temp, port)  # this cluster's processes only
        shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"processes of the test cluster still running: {left}"

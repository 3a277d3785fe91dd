"""The cluster path for real: a two-node Ray cluster on this machine (head + a node tagged with a custom
`searcher` resource), `tba train` against its address, and Ray's own node table showing that the searchers
ran on the tagged node. Both nodes are stopped afterwards."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_searchers_run_on_the_second_node_of_a_two_node_cluster(tmp_path):
    from tests.runtime.test_runtimes import TINY

    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    ray_cli = str(BIN / "ray") if (BIN / "ray").exists() else shutil.which("ray")

    def sh(*args, timeout=120):
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)

    head = sh(ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1",
              "--include-dashboard=false", "--disable-usage-stats")
    assert head.returncode == 0, head.stderr
    try:
        node = sh(ray_cli, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
                  '--resources={"searcher": 2}', "--disable-usage-stats")
        assert node.returncode == 0, node.stderr
        out = tmp_path / "run"
        run = sh(str(BIN / "tba"), "train", f"output_dir={out}", f"sft.cache_dir={tmp_path / 'cache'}", *TINY,
                 "runtime=ray", f"ray.address=127.0.0.1:{port}", "search.num_searchers=2",
                 "search.resources={searcher: 1}", timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        placed = {s["node_id"] for s in json.loads((out / "summary.json").read_text())["searchers"]}

        probe = (f"import json, ray; ray.init(address='127.0.0.1:{port}', logging_level='ERROR');"
                 "print(json.dumps([[n['NodeID'], n['Resources']] for n in ray.nodes() if n['Alive']]))")
        nodes = sh(sys.executable, "-c", probe)
        assert nodes.returncode == 0, nodes.stderr
        table = json.loads(nodes.stdout.strip().splitlines()[-1])
        tagged = {nid for nid, res in table if "searcher" in res}
        head_ids = {nid for nid, res in table if "node:__internal_head__" in res}
        assert len(table) == 2 and len(tagged) == 1 and tagged.isdisjoint(head_ids)
        assert placed == tagged  # both searchers ran on the second node, per Ray's own node ids
    finally:
        sh(ray_cli, "stop", "--force", timeout=60)

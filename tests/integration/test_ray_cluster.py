"""The cluster path for real: a two-node Ray cluster on this machine (head + a node tagged with a custom
`searcher` resource), `tba train` against its address, and Ray's own node table showing that the searchers
ran on the tagged node. Both nodes are stopped afterwards — only they: not `ray stop`, which would end every
Ray process of the user on the machine (other runs, other tests)."""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from procs import cmdline, pids, stat

ray = pytest.importorskip("ray")
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_processes(temp_dir: str, port: int) -> list[int]:
    """PIDs of one cluster's processes: those whose command line names its temp dir (gcs_server, raylets,
    monitors) or its GCS port (the client server), and all their descendants (workers, agents)."""
    own = re.compile(rf"{re.escape(temp_dir)}|:{port}(?!\d)")
    parents, roots = {}, set()
    for pid in pids():
        fields = stat(pid)
        if not fields or fields[0] == "Z":
            continue
        parents[pid] = int(fields[1])
        if own.search(cmdline(pid)) and pid != os.getpid():
            roots.add(pid)
    found, grew = set(roots), True
    while grew:
        kids = {p for p, pp in parents.items() if pp in found} - found
        found |= kids
        grew = bool(kids)
    return sorted(found)


def stop_cluster(temp_dir: str, port: int, timeout: float = 20.0) -> list[int]:
    """SIGTERM this cluster's processes, then SIGKILL what is left after `timeout`; returns the survivors."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in cluster_processes(temp_dir, port):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while cluster_processes(temp_dir, port) and time.monotonic() < deadline:
            time.sleep(0.2)
    return cluster_processes(temp_dir, port)


@pytest.mark.slow
def test_searchers_run_on_the_second_node_of_a_two_node_cluster(tmp_path):
    from runs import TINY

    port = free_port()
    temp = tempfile.mkdtemp(prefix="tba-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    ray_cli = str(BIN / "ray") if (BIN / "ray").exists() else shutil.which("ray")

    def sh(*args, timeout=120):
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)

    try:
        head = sh(ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1",
                  "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}/head")
        assert head.returncode == 0, head.stderr
        node = sh(ray_cli, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
                  '--resources={"searcher": 2}', "--disable-usage-stats", f"--temp-dir={temp}/node")
        assert node.returncode == 0, node.stderr
        out = tmp_path / "run"
        run = sh(str(BIN / "tba"), "train", *TINY, f"output_dir={out}", f"sft.cache_dir={tmp_path / 'cache'}",
                 "runtime=ray", f"ray.address=127.0.0.1:{port}", "search.num_searchers=2",
                 "ray.searcher_resources={searcher: 1}", "sft.enabled=false",
                 "supervision.ready_timeout_s=900", timeout=1500)  # a loaded 2-core machine starts workers slowly
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
        left = stop_cluster(temp, port)  # this cluster's processes only
        shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"processes of the test cluster still running: {left}"

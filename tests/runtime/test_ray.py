"""tba.runtime.ray's helpers against a private Ray on this machine."""

import os

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def private_ray():
    started = not ray.is_initialized()  # another test of this process may have left one running
    if started:
        ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def test_kill_returns_once_the_actors_processes_have_exited(private_ray):
    from tba.runtime.ray import _running, _started, kill

    @ray.remote(num_cpus=0)
    class Sleeper:
        def pid(self) -> int:
            return os.getpid()

    actors = [Sleeper.remote() for _ in range(2)]
    procs = [(p, _started(p)) for p in ray.get([a.pid.remote() for a in actors], timeout=60)]
    assert all(_running(*p) for p in procs)
    kill(actors)
    assert not any(_running(*p) for p in procs)  # ray.kill alone returns while they still run

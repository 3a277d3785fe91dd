"""tba.runtime.supervision: the restart budget and the heartbeat every worker runtime shares."""

import time

import pytest

from tba.config.schema import SupervisionConfig
from tba.runtime.supervision import Supervisor
from tba.runtime.worker import SearcherError


def test_the_budget_logs_each_restart_and_stops_the_run_with_the_cause(caplog):
    sup = Supervisor(2, SupervisionConfig(max_restarts=1))
    sup.charge(1, "failed:\nTraceback ...\nValueError: boom")
    assert [r.getMessage() for r in caplog.records] == ["searcher 1 failed: — restarting it (1/1 restarts used)",
                    "failed:\nTraceback ...\nValueError: boom"]
    with pytest.raises(SearcherError, match=r"(?s)searcher 0 died.*restart limit reached \(supervision.max_restarts=1, "
                                            r"1 restarts so far\)"):
        sup.charge(0, "died (exit code -9)")


def test_a_silent_searcher_is_caught_on_its_own_time_scale():
    """The hang the fixed 300 s heartbeat missed: batches every ≈ 0.1 s, then silence."""
    sup = Supervisor(1, SupervisionConfig(heartbeat_timeout_s=300, heartbeat_floor_s=2))
    sup.ready(0, owes=True)
    for _ in range(3):
        time.sleep(0.05)
        sup.delivered(0, owes_more=True)
    since = sup.clocks[0].since
    assert sup.silent(0, now=since + 1.5) is None
    why = sup.silent(0, now=since + 2.5)
    assert why.startswith("sent no batch for 2s (limit 2.0s = max(supervision.heartbeat_floor_s=2, 20 × its slowest")


def test_a_restarted_searcher_has_the_ready_timeout_then_a_fresh_pace():
    sup = Supervisor(1, SupervisionConfig(heartbeat_timeout_s=30, heartbeat_floor_s=2, ready_timeout_s=5))
    sup.ready(0, owes=True)
    sup.delivered(0, owes_more=True)
    sup.restarted(0)
    start = sup.starting_since[0]
    sup.due(0)  # asked while starting: not timed by the heartbeat yet
    assert sup.silent(0, now=start + 4) is None
    assert "did not report ready within supervision.ready_timeout_s=5s" in sup.silent(0, now=start + 6)
    sup.ready(0, owes=True)
    assert sup.clocks[0].limit_s() == 30  # its pace is unknown again: the cap applies

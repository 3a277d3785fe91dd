"""tba.algorithm.timeout: a limit learnt from the observed pace, capped, floored; the cap alone before any interval."""

from tba.algorithm.timeout import LearntTimeout


def test_the_cap_applies_until_an_interval_has_been_seen():
    c = LearntTimeout(cap_s=300, floor_s=10)
    assert c.limit_s() == 300 and c.overdue_s(now=1e9) is None  # nothing awaited yet
    c.start(now=0.0)
    assert c.overdue_s(now=299.0) is None and c.overdue_s(now=301.0) == 301.0
    assert c.explain("supervision.heartbeat_timeout_s", "floor") == "supervision.heartbeat_timeout_s=300"


def test_a_fast_stream_gets_a_short_limit_but_never_below_the_floor():
    c = LearntTimeout(cap_s=300, floor_s=10, factor=20)
    c.start(now=0.0)
    for k in range(1, 6):  # a batch every 0.1 s
        c.tick(now=0.1 * k)
    assert c.limit_s() == 10  # 20 × 0.1 s = 2 s, floored at 10 s
    assert c.overdue_s(now=0.5 + 9.0) is None and c.overdue_s(now=0.5 + 11.0) == 11.0
    assert "max(floor=10, 20 × its slowest recent interval 0.10s)" in c.explain("cap", "floor")


def test_the_slowest_recent_interval_sets_the_limit_and_old_ones_age_out():
    c = LearntTimeout(cap_s=300, floor_s=1, factor=20, window=4)
    c.start(now=0.0)
    t = 0.0
    for gap in (2.0, 0.1, 0.1, 0.1):
        t += gap
        c.tick(now=t)
    assert c.limit_s() == 40  # the 2 s gap (an evaluation that delayed reading): 20 × 2 s
    t += 0.1
    c.tick(now=t)  # the 2 s gap leaves the window of 4
    assert abs(c.limit_s() - 2.0) < 1e-9
    c.forget()  # a restarted source: pace unknown, nothing awaited
    assert c.limit_s() == 300 and c.since is None


def test_a_stream_that_owes_nothing_between_events_is_not_timed():
    c = LearntTimeout(cap_s=5, floor_s=1)
    c.start(now=0.0)
    c.tick(now=1.0, again=False)  # sync mode: delivered, nothing more asked for
    assert c.overdue_s(now=100.0) is None
    c.start(now=100.0)
    assert c.overdue_s(now=100.5) is None and c.overdue_s(now=125.0) == 25.0  # limit 5 (cap): 20 × 1 s

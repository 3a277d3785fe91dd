"""Sessions: calls recorded in order, prefix extension, the bounds."""

import pytest

from tba.serve.protocol import APIError
from tba.serve.sessions import Call, Sample, Sessions, extends


def _call(prompt, response):
    return Call("chat", prompt, [Sample(response, [-0.1] * len(response), [0] * len(response), "stop")])


def test_calls_are_kept_per_session_in_order_and_stitch_by_prefix():
    s = Sessions()
    first, second, other = _call([1, 2], [3, 4]), _call([1, 2, 3, 4, 9], [5]), _call([1, 7], [8])
    s.record("ep", first)
    s.record(None, other)  # no session: not recorded
    s.record("ep", second)
    assert s.get("ep") == [first, second] and len(s) == 1
    assert extends(first, second) and not extends(first, other)
    assert s.pop("ep") == [first, second] and s.get("ep") is None


def test_sessions_are_bounded():
    s = Sessions(max_sessions=2, max_calls=1)
    for name in ("a", "b", "c"):
        s.record(name, _call([1], [2]))
    assert s.get("a") is None and s.get("c") is not None
    with pytest.raises(APIError, match="limit") as e:
        s.room("c")
    assert e.value.status == 400
    with pytest.raises(APIError):
        Sessions.check("no spaces allowed")

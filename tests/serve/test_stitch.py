"""Stitching a session's calls (tba.serve.stitch): extension appends the harness's ids (mask 0) and the sampled ids
(mask 1, their log-probs and versions); a call that does not extend starts a new trajectory or is dropped."""

from tba.serve.sessions import Call, Sample
from tba.serve.stitch import stitch


def _call(prompt, *responses):
    return Call("chat", prompt, [Sample(r, [-0.5] * len(r), [len(prompt)] * len(r), "stop") for r in responses])


def test_calls_that_extend_are_one_trajectory():
    (t,), = [stitch([_call([1, 2], [3, 4]), _call([1, 2, 3, 4, 9, 9], [5]), _call([1, 2, 3, 4, 9, 9, 5], [6])])
             .trajectories]
    assert t.prompt == [1, 2] and t.tokens == [3, 4, 9, 9, 5, 6] and t.mask == [1, 1, 0, 0, 1, 1]
    assert t.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5] and t.versions == [2, 2, 2, 2, 6, 7] and t.calls == 3


def test_a_call_that_does_not_extend_starts_a_sample_or_is_dropped():
    calls = [_call([1, 2], [3]), _call([1, 2, 7], [8]), _call([1, 2, 3, 5], [6], [9])]
    new = stitch(calls, "new_sample")
    assert [t.ids for t in new.trajectories] == [[1, 2, 3], [1, 2, 7, 8], [1, 2, 3, 5, 6]] and new.breaks == 2
    assert new.dropped == 1  # the last call's second sample: an alternative, not a continuation
    dropped = stitch(calls, "drop")
    assert [t.ids for t in dropped.trajectories] == [[1, 2, 3, 5, 6]] and dropped.dropped == 2
    assert dropped.trajectories[0].mask == [1, 0, 1]

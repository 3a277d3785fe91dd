"""One session's calls → token-exact trajectories, by prefix extension.

Why: a harness on chat completions sends the whole conversation every call, and the server renders it again with
the chat template. Where that rendering starts with everything the session had so far — the previous prompt and the
ids the policy sampled — the call continues the same trajectory: the new ids between are the harness's (a tool
result, the next user turn: mask 0) and the response is the policy's (mask 1). Where it does not (the harness edited
the history, the template re-tokenized a sampled turn differently, a sub-agent started afresh), no single sequence
holds both calls, so the call either starts a new trajectory or is dropped (`on_break`), and counted. ART's
`tokenize_vllm_trajectory_histories` and OpenEnv's capture proxy use the same rule; nothing is re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.rollout.outside import Trajectory
from tba.serve.sessions import Call
from tba.tasks.agent import ON_BREAK


@dataclass
class Stitched:
    trajectories: list[Trajectory]
    dropped: int = 0
    """Calls (or extra samples of a call with n > 1) that are in no trajectory."""
    breaks: int = 0
    """Calls that did not extend the trajectory before them."""


def stitch(calls: list[Call], on_break: str = "new_sample") -> Stitched:
    """The session's calls, in the order served, as trajectories. A call extends the last trajectory when its
    prompt starts with that trajectory's ids; otherwise it starts a new one (`on_break="new_sample"`) or is dropped
    (`"drop"`; later calls are then compared with the trajectory kept). Only a call's first sample is stitched: its
    other samples (n > 1) are alternatives, not a continuation, and are counted as dropped."""
    if on_break not in ON_BREAK:
        raise ValueError(f"on_break: one of {ON_BREAK}, not {on_break!r}")
    out = Stitched([])
    for call in calls:
        if not call.samples:
            continue
        sample = call.samples[0]
        out.dropped += len(call.samples) - 1
        last = out.trajectories[-1] if out.trajectories else None
        done = last.ids if last is not None else None
        if done is not None and call.prompt_token_ids[:len(done)] == done:
            last.add(call.prompt_token_ids[len(done):], sample.token_ids, sample.logprobs, sample.versions)
            continue
        if last is not None:
            out.breaks += 1
            if on_break == "drop":
                out.dropped += 1
                continue
        t = Trajectory(list(call.prompt_token_ids))
        t.add([], sample.token_ids, sample.logprobs, sample.versions)
        out.trajectories.append(t)
    return out

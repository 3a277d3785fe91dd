"""Episodes from outside (the `agent` task kind): what the searcher receives from them, and how they become groups.

The episodes themselves run elsewhere: the user's code drives the policy through an endpoint over the searcher's
sampler (tba.serve.agents, built by the runtime, which may import the server: this folder may not). What comes back
per episode is token-exact trajectories (tba.serve.stitch): the ids the server rendered and sampled, which of them
the policy sampled, their behaviour log-probs and versions, and the episode's reward.

Grouping: a TB group is one dataset row, whatever ids its episodes have, so VarGrad's log Ẑ is estimated over the
episodes of one task. The buffer keeps one prompt per row, so every sample of a row is split at the same point: the
row's prompt is the first prompt its first episode sent (a harness with a fixed system prompt sends the same one
every time); everything after it — the rest of a later sample's prompt included — is the response, the harness's
tokens masked out. A sample whose ids do not start with its row's prompt (a harness whose first prompt changes from
episode to episode) cannot share the group and is dropped, counted as `agent/off_prompt`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tba.algorithm.types import Group, Sample
from tba.models.logprobs import grouped_logprobs
from tba.rollout.episodes import policy_logprobs
from tba.rollout.stream import WeightSync
from tba.tasks.base import Prompt


@dataclass
class Trajectory:
    """Calls stitched into one sequence: `prompt` is the first call's prompt, `tokens` everything after it."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    """1: a token the policy sampled; 0: the harness's (rendered from its messages)."""
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-probs of the sampled tokens, 0.0 at the harness's."""
    versions: list[int] = field(default_factory=list)
    """The policy version of each sampled token; a harness token carries the version before it."""
    calls: int = 0

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.tokens

    def add(self, between: list[int], sampled: list[int], logprobs: list[float], versions: list[int]) -> None:
        """Append one call: the ids its prompt adds (the harness's), then the ids the policy sampled."""
        last = self.versions[-1] if self.versions else (versions[0] if versions else 0)
        self.tokens += between + sampled
        self.mask += [0] * len(between) + [1] * len(sampled)
        self.logprobs += [0.0] * len(between) + list(logprobs)
        self.versions += [last] * len(between) + list(versions)
        self.calls += 1


@dataclass
class OutsideEpisode:
    prompt: Prompt
    trajectories: list[Trajectory]
    end: str
    """"done" (the function returned), "error" (it or a reward function raised), "timeout" (it ran too long)."""
    reward: float | None = None
    error: str | None = None
    calls: int = 0
    dropped: int = 0
    """Calls left out: not extending their session with on_break="drop", or extra samples of an n > 1 call."""
    breaks: int = 0
    """Calls that did not extend the ids before them."""


@dataclass
class OutsideGroup:
    """A row's episodes, all ended."""

    prompt: Prompt
    walk: int
    """Its position in the searcher's prompt walk."""
    episodes: list[OutsideEpisode]


class OutsideStream(Protocol):
    """What a searcher drives when its task's episodes come from outside (tba.serve.agents.AgentStream)."""

    def run(self, want: int, feed: Callable[[], tuple[Prompt, list[int], int]], version: Callable[[], int],
            sync: WeightSync | None) -> list[OutsideGroup]:
        """Run episodes of the rows `feed()` gives until `want` rows have all theirs ended; weights load through
        `sync` between decode steps."""

    def oldest(self) -> int | None:
        """The walk position of the oldest row with an episode still running."""

    def close(self) -> None:
        """End the endpoint and the harness threads."""


class RowPrompts:
    """Each row's prompt ids (the first prompt its first kept episode sent), and samples split at it."""

    def __init__(self):
        self.ids: dict[int, list[int]] = {}

    def split(self, prompt: Prompt, t: Trajectory) -> tuple[list[int], list[int], list[float], list[int]] | None:
        """(response, mask, behaviour log-probs, versions) of `t` after its row's prompt; None: it does not start
        with it."""
        head = self.ids.setdefault(prompt.id, list(t.prompt))
        if t.ids[:len(head)] != head or len(t.ids) == len(head):
            return None
        extra = len(t.prompt) - len(head)
        if extra < 0:  # a shorter first prompt than the row's: the row's prompt reaches into its tokens
            cut = -extra
            if 1 in t.mask[:cut]:
                return None
            return t.tokens[cut:], t.mask[cut:], t.logprobs[cut:], t.versions[cut:]
        first = t.versions[0] if t.versions else 0
        return (t.prompt[len(head):] + t.tokens, [0] * extra + t.mask, [0.0] * extra + t.logprobs,
                [first] * extra + t.versions)


def outside_groups(done: list[OutsideGroup], rows: RowPrompts, reference, *, temperature: float, pad_id: int,
                   source: str) -> tuple[list[Group], int]:
    """The kept samples of `done` as one Group per row, with π_ref's log-probs of the policy's tokens (the harness's
    zeroed); and how many samples were off their row's prompt."""
    prompts, responses, counts, parts, off = [], [], [], [], 0
    for g in done:
        mine = []
        for e in g.episodes:
            if e.reward is None:
                continue
            for t in e.trajectories:
                if 1 not in t.mask:
                    continue
                split = rows.split(g.prompt, t)
                if split is None:
                    off += 1
                    continue
                mine.append((e.reward, *split))
        if mine:
            prompts.append(rows.ids[g.prompt.id])
            responses += [m[1] for m in mine]
            counts.append(len(mine))
            parts.append((g.prompt, mine))
    if not parts:
        return [], off
    ref_logp, _ = grouped_logprobs(reference, prompts, responses, counts, temperature, pad_id)
    groups, j = [], 0
    for (prompt, mine), head in zip(parts, prompts, strict=True):
        samples = []
        for reward, response, mask, behaviour, versions in mine:
            ref = policy_logprobs(ref_logp[j, :len(response)].tolist(), mask)
            samples.append(Sample(response=response, ref_logprobs=ref, reward=reward, version=versions[0],
                                  behaviour_logprobs=behaviour, source=source, policy_mask=mask,
                                  versions=versions if len(set(versions)) > 1 else []))
            j += 1
        groups.append(Group(prompt_id=prompt.id, prompt_tokens=head, samples=samples, source=source))
    return groups, off

"""The sampling rule (paper §1.3 and §3): which prompts and samples one update draws from the replay buffer.

Per prompt slot, independently:

  with probability m (online):  a prompt refreshed since the last sync, uniformly without replacement
                                (the pool refills when exhausted); K of its n_online newest items, without
                                replacement if n_online ≥ K, else with replacement (buffer.online_draw=spread:
                                one item of each reward value first, `draw_spread`).
  otherwise (offline):          any seen prompt, uniformly without replacement (refill when exhausted);
                                K of its whole history with probabilities softmax(ι · reward), without
                                replacement unless the history holds fewer than K items.

Two additions, each off unless configured. A data slot (completions from elsewhere: tba.rollout.demonstrations):
with probability 2·data_share a slot holds K/2 of its prompt's data items and K/2 of its searcher samples, so that
VarGrad's log Ẑ is estimated over both (a group of one demonstration alone would have δ ≡ 0). And an age cap
(`buffer.max_sample_age`): a sample of a source that loads the trainer's weights is not drawn once it is more than
that many versions old; a slot whose prompt has none young enough is drawn again elsewhere (`REPICKS` times at
random, then among the prompts that hold a young sample), and with nothing young enough anywhere the draw raises
`NothingYoungEnough` (the loop then waits for fresh samples).

Functions of the buffer's contents, the rule's settings and a seeded generator only: the buffer (tba.algorithm.buffer)
holds the contents and the generator, and calls `draw_slot` once per slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tba.algorithm.types import Draw, Sample

REPICKS = 8
"""With an age cap: a slot whose prompt holds nothing young enough is drawn again this many times at random
before the prompts that do hold a young sample are looked for."""


class NothingYoungEnough(RuntimeError):
    """Every sample the buffer holds is older than buffer.max_sample_age: fresh samples are needed first."""


@dataclass(frozen=True)
class Rule:
    """The rule's settings (the `buffer` section's, and the sources the age cap applies to)."""

    online_prob: float
    """m: the probability that a slot is drawn from the prompts refreshed since the last sync."""
    inverse_temperature: float
    """ι: offline slots draw softmax(ι · reward) over a prompt's history (0: uniformly)."""
    max_sample_age: int | None = None
    aging: frozenset[str] | None = None
    """The sources whose samples age (they load the trainer's weights; None = every source): the cap's."""
    data_share: float = 0.0
    online_draw: str = "uniform"
    """How an online slot takes its K items: uniform, or spread (`draw_spread`)."""


@dataclass
class Pools:
    """The prompts already drawn in the current pass of each pool (a pass ends when a pool is exhausted)."""

    online: set[int] = field(default_factory=set)
    offline: set[int] = field(default_factory=set)


def pick_prompt(rng: np.random.Generator, candidates: list[int], used: set[int]) -> int:
    """One of `candidates` not in `used` (all of them again once every one is), uniformly; it joins `used`."""
    free = [p for p in candidates if p not in used]
    if not free:  # pool exhausted: refill with the prompts already used
        used.clear()
        free = candidates
    pid = free[rng.integers(len(free))]
    used.add(pid)
    return pid


def draw_items(rng: np.random.Generator, items: list[Sample], k: int, probs: np.ndarray | None) -> list[Sample]:
    """K of `items` with probabilities `probs` (None: uniform), without replacement unless there are fewer than K."""
    idx = rng.choice(len(items), size=k, replace=len(items) < k, p=probs)
    return [items[i] for i in idx]


def draw_spread(rng: np.random.Generator, items: list[Sample], k: int) -> list[Sample]:
    """K of `items` with one item of each reward value first (in random order), the rest uniformly without
    replacement; with fewer than K items, every item once and the rest drawn uniformly from them again.

    Why: a group whose K samples share one reward carries no reward contrast — VarGrad's log Ẑ absorbs the
    common reward and the update learns only the spread of log π_θ/π_ref — and when the searcher generated
    more per prompt than the trainer draws (search.generations_per_prompt > trainer.samples_per_prompt), a
    uniform K can leave out the one right (or the one wrong) answer it found. TB's fixed point does not depend
    on how its samples were chosen, as long as every one can be (each residual is zero at π*), so this changes
    what an update learns from, not where training ends; for the ratio objectives it biases the gradient
    (docs/algorithm.md). With all rewards distinct (a continuous score) it is the uniform draw."""
    order = [items[i] for i in rng.permutation(len(items))]
    if len(items) < k:
        return order + draw_items(rng, items, k - len(items), None)
    seen, first, rest = set(), [], []
    for x in order:
        (rest if x.reward in seen else first).append(x)
        seen.add(x.reward)
    return (first + rest)[:k]  # with more reward values than slots, a uniform K of the values


def priorities(items: list[Sample], inverse_temperature: float) -> np.ndarray | None:
    """softmax(ι · reward) over `items` (None: ι = 0, uniform)."""
    if inverse_temperature == 0.0:
        return None
    logits = inverse_temperature * np.array([s.reward for s in items], dtype=np.float64)
    probs = np.exp(logits - logits.max())
    return probs / probs.sum()


def young(items: list[Sample], version: int | None, rule: Rule) -> list[Sample]:
    """`items` without the samples the age cap excludes (those of sources that age, more than the cap old)."""
    cap = rule.max_sample_age
    if cap is None or version is None:
        return items
    return [s for s in items if version - s.version <= cap or (rule.aging is not None and s.source not in rule.aging)]


def draw_slot(rng: np.random.Generator, rule: Rule, histories: dict, window: list[int], data: dict[int, list],
              with_data: list[int], pools: Pools, k: int, version: int | None) -> tuple[Draw, int]:
    """One slot of an update: (its Draw, how many samples the age cap kept out of it). `histories`: prompt →
    PromptHistory (items oldest first, `n_online` newest of the latest version); `window`: the prompts refreshed
    since the last sync; `data`: prompt → its data items; `with_data`: the prompts that have both."""
    too_old = 0

    def young_counted(items):
        nonlocal too_old
        kept = young(items, version, rule)
        too_old += len(items) - len(kept)
        return kept

    if with_data and rng.random() < 2 * rule.data_share:  # a data slot: K/2 data, K/2 searcher samples
        pid = with_data[rng.integers(len(with_data))]
        searched = young_counted(histories[pid].items)
        if searched:
            half = k // 2
            samples = draw_items(rng, data[pid], half, None) + draw_items(rng, searched, k - half, None)
            return Draw(pid, histories[pid].prompt_tokens, samples, online=False, data=True), too_old
    for attempt in range(REPICKS + 1):
        online = attempt < REPICKS and bool(window) and rng.random() < rule.online_prob
        if online:
            pid = pick_prompt(rng, window, pools.online)
            h = histories[pid]
            items = young_counted(h.items[len(h.items) - max(h.n_online, 1):])
        else:
            candidates = list(histories) if attempt < REPICKS else [
                p for p, h in histories.items() if young(h.items, version, rule)]
            if not candidates:
                raise NothingYoungEnough(f"no sample in the buffer is within buffer.max_sample_age="
                                         f"{rule.max_sample_age} versions of the trainer's {version}")
            pid = pick_prompt(rng, candidates, pools.offline)
            h = histories[pid]
            items = young_counted(h.items)
        if items:
            if online and rule.online_draw == "spread":
                return Draw(pid, h.prompt_tokens, draw_spread(rng, items, k), online), too_old
            probs = None if online else priorities(items, rule.inverse_temperature)
            return Draw(pid, h.prompt_tokens, draw_items(rng, items, k, probs), online), too_old
    raise NothingYoungEnough("unreachable: the last attempt draws among prompts with a young sample")

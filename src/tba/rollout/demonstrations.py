"""Completions from elsewhere — demonstrations, logged data — made into replay-buffer groups (the `data` section).

Why TB can train on them as they are: its fixed point π* ∝ π_ref·exp(r/β) holds whatever policy produced the
samples, provided the behaviour as a whole gives every response a chance (the searchers do). A demonstration is a
sample of some fixed, unknown behaviour policy; TB needs no behaviour log-prob for it — and there is none, so the
ratio objectives (Dr. GRPO, TBA′) cannot use this data (config validation says so).

Each row is a prompt the task knows (matched on its text), a completion, and optionally a reward (else the task's
reward scores it). It is tokenized with the run's tokenizer as the searchers' samples are (the prompt in the
chat template when the run uses one; the completion (each turn of a multi-turn one) followed by EOS — or, at
exactly search.max_new_tokens tokens, without one, as a searcher's response cut there),
scored under π_ref at the run's temperature, and stored in the durable buffer as one group per prompt, tagged
with its source name, in one transaction: all of it or nothing. A row that does not fit — an unknown prompt, an
empty or too long completion, a reward that is not a number — stops the run naming the file and line
(`data.bad_rows: error`), or is skipped and counted (`skip`).

How it is drawn (tba.algorithm.buffer): VarGrad's log Ẑ(x) is the mean of r/β − log π_θ + log π_ref over the prompt's
group, so a group holding only one demonstration has δ ≡ 0 and teaches nothing. A data slot of a batch therefore
holds K/2 items of this data and K/2 searcher samples of the same prompt, and is drawn with probability
2·`data.share` per slot: `data.share` of the drawn samples, in expectation, come from the data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from tba.algorithm.types import Group, Sample
from tba.config.schema import DataConfig
from tba.models.logprobs import response_logprobs
from tba.rollout.episodes import Limits, policy_logprobs, replay_episodes
from tba.tasks.base import Prompt, Task, TaskAdapter
from tba.tasks.data import DataLoadError


@dataclass
class Row:
    where: str
    """Where the row came from, for messages: `file.jsonl line 3`, `task.demonstrations() #12`."""
    prompt: str
    completion: str | list[str]
    """The response; for a multi-turn task, the policy's turns (one text is one turn)."""
    reward: float | None = None
    prompt_id: int | None = None
    """The task's own demonstrations name their prompt by id (its text may be in the chat template by now)."""


def read_rows(cfg: DataConfig, task: Task, seed: int) -> list[Row]:
    """The rows of `cfg.source`: `task` (the task's own demonstrations(), one per train prompt), a local
    .jsonl/.json/.parquet file, or a `datasets` Hub name."""
    if cfg.source == "task":
        task = TaskAdapter.of(task)
        if not task.has("demonstrations"):
            raise DataLoadError(f"data.source: task: task {task.name} has no demonstrations()")
        completions = task.demonstrations(task.train, seed=seed)
        return [Row(f"task.demonstrations() #{i}", p.text, c, prompt_id=p.id)
                for i, (p, c) in enumerate(zip(task.train, completions, strict=True))]
    path = Path(cfg.source).expanduser()
    if path.suffix == ".jsonl" or (path.suffix == ".json" and path.is_file()):
        return _json_rows(path, cfg)
    return _dataset_rows(cfg)


def _field(row: dict, name: str | None, where: str, kind: str):
    value = row.get(name)
    if kind == "turns" and isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value  # a multi-turn task's policy turns
    if kind in ("text", "turns"):
        if not isinstance(value, str):
            wanted = "a string or a list of strings (the policy's turns)" if kind == "turns" else "a string"
            raise DataLoadError(f"{where}: field {name!r} must be {wanted}, got {type(value).__name__}")
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataLoadError(f"{where}: field {name!r} must be a finite number, got {value!r}")
    return float(value)


def _row(data: dict, cfg: DataConfig, where: str) -> Row:
    if not isinstance(data, dict):
        raise DataLoadError(f"{where}: not a JSON object")
    for name in (cfg.prompt_column, cfg.completion_column):
        if name not in data:
            raise DataLoadError(f"{where}: no field {name!r} (fields: {', '.join(map(str, data))})")
    reward = _field(data, cfg.reward_column, where, "number") if cfg.reward_column else None
    if cfg.reward_column and reward is None:
        raise DataLoadError(f"{where}: no value in field {cfg.reward_column!r} (data.reward_column)")
    return Row(where, _field(data, cfg.prompt_column, where, "text"),
               _field(data, cfg.completion_column, where, "turns"), reward)


def _json_rows(path: Path, cfg: DataConfig) -> list[Row]:
    if not path.is_file():
        raise DataLoadError(f"data.source: no file {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataLoadError(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
        return [_row(item, cfg, f"{path} item {i}") for i, item in enumerate(items)]
    rows = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataLoadError(f"{path} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
        rows.append(_row(data, cfg, f"{path} line {n}"))
    return rows


def _dataset_rows(cfg: DataConfig) -> list[Row]:
    """A parquet file or directory, or a Hub dataset, read with `datasets` (rows named by their index)."""
    import datasets  # deferred: ≈ 1 s, only runs that read such data need it

    path = Path(cfg.source).expanduser()
    try:
        if path.exists():
            files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
            ds = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
        else:
            ds = datasets.load_dataset(cfg.source, split=cfg.split)
    except Exception as e:
        raise DataLoadError(f"data.source: could not read {cfg.source!r} ({type(e).__name__}: {e}); give a local "
                            ".jsonl, .json or .parquet file (offline machines cannot reach the Hub)") from e
    return [_row(row, cfg, f"{cfg.source} row {i}") for i, row in enumerate(ds.to_list())]


@dataclass
class DataReport:
    """What became of the rows, for the log and the run's summary."""

    rows: int = 0
    kept: int = 0
    skipped: dict[str, int] | None = None
    """Why rows were skipped (data.bad_rows: skip), with counts."""
    below_min_reward: int = 0
    duplicates: int = 0

    def line(self, name: str) -> str:
        skipped = sum((self.skipped or {}).values())
        why = "; ".join(f"{n} {k}" for k, n in (self.skipped or {}).items())
        return (f"data {name!r}: {self.kept} of {self.rows} rows kept" + (f", {skipped} skipped ({why})" if skipped
                else "") + (f", {self.below_min_reward} below data.min_reward" if self.below_min_reward else "")
                + (f", {self.duplicates} duplicates" if self.duplicates else ""))


def make_groups(rows: list[Row], cfg: DataConfig, *, task: Task, prompt_ids: dict[str, int], tokenizer, reference,
                temperature: float, max_new_tokens: int, limits: Limits | None = None,
                batch_size: int = 64) -> tuple[list[Group], DataReport]:
    """Checked, tokenized, rewarded and π_ref-scored rows, one Group per prompt (source `cfg.name`).

    `prompt_ids`: the task's train prompts by their text as the task wrote it (before any chat template), so a
    row names its prompt as the task does; the prompt's text in `task.train` now is what the searchers tokenize.
    A multi-turn task's (one with `environment`, tba.rollout.episodes) completion is its policy turns — a list of texts,
    or one text for one turn — played through a fresh environment under `limits` (the searchers' episode limits):
    the environment's answers fill the turns between, as in a sampled episode, and a row the environment does
    not follow (it asks for more turns, or ends before the last) is a bad row."""
    task = TaskAdapter.of(task)
    by_id = {p.id: p for p in task.train}
    multi_turn = task.episodic
    report, problems = DataReport(rows=len(rows), skipped={}), []
    kept: list[tuple[Prompt, list[int], list[list[int]], Row]] = []
    seen: set[tuple[int, tuple]] = set()
    for row in rows:
        pid = row.prompt_id if row.prompt_id is not None else prompt_ids.get(row.prompt.strip())
        pid = pid if pid in by_id else None
        texts = row.completion if isinstance(row.completion, list) else [row.completion]
        turns = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        for tokens in turns:  # a turn ends with EOS; one at exactly the turn's budget is kept cut, as a
            if len(tokens) < max_new_tokens:  # searcher's response (or episode turn) cut there would be
                tokens.append(tokenizer.eos_token_id)
        longest = max(range(len(turns)), key=lambda i: len(turns[i]))
        why = ("prompt not among the task's train prompts" if pid is None
               else f"a list of {len(texts)} turns, but task {task.name} is single-turn (it has no environment)"
               if len(texts) > 1 and not multi_turn
               else "empty completion" if not all(t.strip() for t in texts)
               else f"completion of {len(turns[longest])} tokens > search.max_new_tokens={max_new_tokens}"
               + (f" (turn {longest + 1})" if len(texts) > 1 else "")
               if len(turns[longest]) > max_new_tokens else None)
        if why is not None:
            problems.append((row, why))
            continue
        if (pid, key := tuple(map(tuple, turns))) in seen:
            report.duplicates += 1
            continue
        seen.add((pid, key))
        if not multi_turn:
            row.completion = texts[0]  # a one-turn list is the completion itself (the task's reward reads text)
        kept.append((by_id[pid], tokenizer(by_id[pid].text)["input_ids"], turns, row))
    _settle(problems, cfg, report)
    if multi_turn:
        episodes = _replay(kept, cfg, report, task=task, tokenizer=tokenizer, max_new_tokens=max_new_tokens,
                           limits=limits or Limits())
    else:
        episodes = _score(kept, cfg, report, task, tokenizer)
    if cfg.min_reward is not None:
        report.below_min_reward = sum(e[3].reward < cfg.min_reward for e in episodes)
        episodes = [e for e in episodes if e[3].reward >= cfg.min_reward]
    report.kept = len(episodes)
    groups: dict[int, Group] = {}
    for start in range(0, len(episodes), batch_size):
        chunk = episodes[start:start + batch_size]
        with torch.no_grad():
            ref, _ = response_logprobs(reference, [k[1] for k in chunk], [k[2] for k in chunk], temperature,
                                       tokenizer.pad_token_id)  # [N, R]
        for j, (prompt, prompt_tokens, tokens, row, mask) in enumerate(chunk):
            logprobs = policy_logprobs(ref[j, :len(tokens)].tolist(), mask)
            sample = Sample(tokens, logprobs, row.reward, 0, [], source=cfg.name, policy_mask=mask)
            groups.setdefault(prompt.id, Group(prompt.id, prompt_tokens, [], source=cfg.name)).samples.append(sample)
    return list(groups.values()), report


def target_weight_warning(groups: list[Group], beta: float) -> str | None:
    """A warning when TB's target would weigh most rewarded rows below π_ref's unrewarded answers, else None.

    π*(y) ∝ π_ref(y)·exp(r/β), and π_ref puts at most mass 1 on unrewarded answers, so a row of reward r > 0
    outweighs all of them together once log π_ref(y) + r/β > 0, i.e. once β < r / −log π_ref(y). Rows π_ref finds
    unlikely — a format the model never writes, a tool call — need a β that small, or the target itself prefers what
    π_ref already does and TB moves away from the data as it converges (β is the final one of an annealed run)."""
    bounds = sorted(s.reward / -sum(s.ref_logprobs) for g in groups for s in g.samples
                    if s.reward > 0 and sum(s.ref_logprobs) < 0)
    below = sum(b < beta for b in bounds)
    if not bounds or 2 * below <= len(bounds):
        return None
    return (f"tb.beta_final={beta} is above r / −log π_ref for {below} of {len(bounds)} rewarded data rows (median "
            f"{bounds[len(bounds) // 2]:.3g}, the least likely row {bounds[0]:.3g}): TB's target π* ∝ "
            f"π_ref·exp(r/β) weighs those rows below π_ref's unrewarded answers. A β below {bounds[0]:.3g} makes it "
            "prefer every rewarded row (docs/sources.md, 'How small β must be')")


def _score(kept, cfg: DataConfig, report: DataReport, task: Task, tokenizer) -> list[tuple]:
    """Single-turn rows as (prompt, prompt tokens, tokens, row, []) with a reward: the row's, else the task's."""
    unscored = [i for i, (*_, row) in enumerate(kept) if row.reward is None]
    if unscored:
        rewards, _ = task.batch_rewards([kept[i][0] for i in unscored], [kept[i][3].completion for i in unscored],
                                        [kept[i][2][0][-1] == tokenizer.eos_token_id for i in unscored])
        bad = [(kept[i][3], "the task's reward raised or was not finite") for i, r in zip(unscored, rewards,
                                                                                         strict=True) if r is None]
        for i, r in zip(unscored, rewards, strict=True):
            kept[i][3].reward = r
        _settle(bad, cfg, report)
    return [(p, pt, turns[0], row, []) for p, pt, turns, row in kept if row.reward is not None]


def _replay(kept, cfg: DataConfig, report: DataReport, *, task: Task, tokenizer, max_new_tokens: int,
            limits: Limits) -> list[tuple]:
    """Multi-turn rows played through their environments: (prompt, prompt tokens, episode tokens, row, policy
    mask), the reward the row's, else the environment's."""
    episodes = replay_episodes(tokenizer, task, [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept],
                               max_new_tokens=max_new_tokens, limits=limits)
    bad = [(row, f"the task's environment: {e.error}") for (*_, row), e in zip(kept, episodes, strict=True)
           if e.reward is None]
    _settle(bad, cfg, report)
    out = []
    for (prompt, prompt_tokens, _, row), e in zip(kept, episodes, strict=True):
        if e.reward is not None:
            row.reward = e.reward if row.reward is None else row.reward
            out.append((prompt, prompt_tokens, e.tokens, row, e.mask))
    return out


def _settle(problems: list[tuple[Row, str]], cfg: DataConfig, report: DataReport) -> None:
    """data.bad_rows: error — stop at the first bad row, naming it; skip — count them by reason."""
    if problems and cfg.bad_rows == "error":
        row, why = problems[0]
        more = f" (and {len(problems) - 1} more bad rows; data.bad_rows=skip skips them)" if len(problems) > 1 else ""
        raise DataLoadError(f"{row.where}: {why}{more}")
    for _, why in problems:
        reason = why.split(" of ")[0] if why.startswith("completion of") else why
        report.skipped[reason] = report.skipped.get(reason, 0) + 1

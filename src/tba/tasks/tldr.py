"""TL;DR summarisation with a learned reward, the TBA paper's preference fine-tuning task (§4.2, Table 3).

Data: `vwxyzjn/summarize_from_feedback_tldr_3_filtered_oai_preprocessing_1706381144` (OpenAI's filtered
Reddit TL;DR, preprocessed by cleanrl). Of its columns two are used:

- `query`: the prompt, already formatted as "SUBREDDIT: r/...\\n\\nTITLE: ...\\n\\nPOST: ...\\n\\nTL;DR:" and
  cut to ≤ 512 Pythia tokens by trimming the post at a newline;
- `reference_response`: the human summary as " {summary}<|endoftext|>" (leading space, EOS *string* at
  the end). The EOS string is stripped here (a policy's decoded text never contains it either); the
  reward models re-append the EOS token id to both, so policy and reference summaries are scored alike.

Reward (searchers and the `score` metric): the training RM's scalar at the EOS, −1 without EOS
(`RewardModel`). Win rate (evaluation only, as async_rlhf computes it): the fraction of evaluation
completions that the gold RM scores strictly higher than the reference summary of their prompt. The gold
RM (6.9B) is loaded on the first evaluation, so searcher processes, which never evaluate, never load it.
"""

from __future__ import annotations

from tba.errors import ConfigError
from tba.tasks.base import Prompt
from tba.tasks.data import DataLoadError, load_split
from tba.tasks.reward_model import RewardModel

DEFAULT_SOURCE = "vwxyzjn/summarize_from_feedback_tldr_3_filtered_oai_preprocessing_1706381144"
EOS_TEXT = "<|endoftext|>"
_FIELDS = ("query", "reference_response")


def strip_eos(text: str) -> str:
    """The reference summary without its trailing "<|endoftext|>" string(s)."""
    while text.endswith(EOS_TEXT):
        text = text[: -len(EOS_TEXT)]
    return text


def load_rows(source: str, split: str, size: int | None = None) -> list[dict]:
    """The first `size` rows (all if None) of `split`, only the `query` and `reference_response` columns,
    from a local file/directory or the Hub. Column selection matters: the Hub dataset also holds token
    columns, ~1.6 GB for train, that this task never reads."""
    rows, where = load_split(source, split, task="tldr", fields=_FIELDS, size=size, local_hint=(
        "task.options.source=/path/to/dir holding train.jsonl and validation.jsonl (or .parquet, or a Hub snapshot's "
        "data/*.parquet shards)"))
    for i, row in enumerate(rows):
        if not strip_eos(row["reference_response"]).strip():
            raise DataLoadError(f"tldr row {i} of {where}: field 'reference_response' is only an EOS marker")
    return rows


class TLDRTask:
    """The TL;DR `Task`. `device`/`batch_size` apply to both reward models; `dtype` to the training RM,
    `gold_dtype` (None = `dtype`) to the gold one (async_rlhf evaluated it in float16)."""

    name = "tldr"

    def __init__(self, source: str = DEFAULT_SOURCE, train_size: int | None = None, test_size: int | None = None,
                 reward_model: str = "mnoukhov/pythia410m-rm-tldr6.9b", reward_tokenizer: str | None = None,
                 gold_reward_model: str | None = None, gold_tokenizer: str | None = None,
                 non_eos_penalty: float = -1.0, device: str = "cpu", batch_size: int = 16,
                 test_split: str = "validation", dtype: str = "float32", gold_dtype: str | None = None) -> None:
        self.source = source
        self.train = self._prompts(load_rows(source, "train", train_size))
        self.test = self._prompts(load_rows(source, test_split, test_size))
        # loaded now: every searcher scores from its first batch on
        self.reward_model = RewardModel(reward_model, tokenizer=reward_tokenizer, device=device, dtype=dtype,
                                        batch_size=batch_size, non_eos_penalty=non_eos_penalty)
        self._gold_spec = {"name_or_path": gold_reward_model, "tokenizer": gold_tokenizer, "device": device,
                           "dtype": gold_dtype or dtype, "batch_size": batch_size}
        self._gold: RewardModel | None = None
        self._gold_reference: dict[tuple[int, ...], float] = {}  # reference token ids → gold score

    @staticmethod
    def _prompts(rows: list[dict]) -> list[Prompt]:
        return [Prompt(id=i, text=row["query"], answer=strip_eos(row["reference_response"]), meta={})
                for i, row in enumerate(rows)]

    def rewards(self, prompts: list[Prompt], completions: list[str], finished: list[bool]) -> list[float]:
        """Training-RM score at the EOS of each finished completion, `non_eos_penalty` for the others."""
        return self.reward_model.score([p.text for p in prompts], completions, finished)

    def reward(self, prompt: Prompt, completion: str) -> float:
        """One completion, treated as finished (this signature carries no EOS flag; searchers and evaluation
        call `rewards`, which has it)."""
        return self.rewards([prompt], [completion], [True])[0]

    def gold(self) -> RewardModel:
        if self._gold_spec["name_or_path"] is None:
            raise ConfigError("task.options.gold_reward_model: tldr's win rate needs a gold reward model")
        if self._gold is None:
            self._gold = RewardModel(**self._gold_spec)
        return self._gold

    def eval_metrics(self, prompts: list[Prompt], completions: list[str], finished: list[bool]) -> dict:
        """{win_rate, gold_score, gold_score_reference} under the gold RM, or {} without one.

        win_rate = mean_i 1[gold(x_i, y_i) > gold(x_i, y_ref(x_i))]  (strict, as async_rlhf). The gold RM
        reads each completion as generated: EOS re-appended where the policy emitted it, no −1 penalty
        otherwise (the paper's evaluation scores text, not the training reward). Reference scores are
        cached by token sequence, since every evaluation compares against the same summaries; a completion
        whose tokens equal its reference's takes the cached score, so it ties (a loss) exactly rather than
        winning or losing by float noise between differently composed batches.
        """
        if self._gold_spec["name_or_path"] is None or not prompts:
            return {}
        gold = self.gold()
        refs = [tuple(gold.encode(p.text, p.answer, append_eos=True)) for p in prompts]
        mine = [tuple(gold.encode(p.text, c, append_eos=f)) for p, c, f in zip(prompts, completions, finished,
                                                                                  strict=True)]
        new = [s for s in dict.fromkeys(refs) if s not in self._gold_reference]
        self._gold_reference.update(zip(new, gold.score_ids([list(s) for s in new]), strict=True))
        todo = [s for s in dict.fromkeys(mine) if s not in self._gold_reference]
        fresh = dict(zip(todo, gold.score_ids([list(s) for s in todo]), strict=True))
        policy = [self._gold_reference[s] if s in self._gold_reference else fresh[s] for s in mine]
        reference = [self._gold_reference[s] for s in refs]
        n = len(prompts)
        return {"win_rate": sum(s > r for s, r in zip(policy, reference, strict=True)) / n,
                "gold_score": sum(policy) / n, "gold_score_reference": sum(reference) / n}

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        """The human reference summaries (leading space kept, EOS string stripped); `seed` is unused."""
        return [p.answer for p in prompts]

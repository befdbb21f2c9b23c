#!/usr/bin/env bash
# The GPU check (docs/devices.md, "Checking on a GPU"): run on a machine with an NVIDIA GPU, from the repository
# root, after scripts/gpu_bundle.sh packed gpu_bundle/ on a build machine. That machine needs the CUDA driver and
# toolkit (CUDA 13) and, for the comparison step, python3 with PyTorch; none of our Debian packages, no network.
#   scripts/gpu_check.sh LOG_DIR
# The device tool carries gpu_bundle/ and data/moby (both ignored by git) beside the working tree.
# Runs each step below under its own time limit (470 s together: the check ends within 8 minutes), writes each step's output
# to LOG_DIR/<step>.log, and prints one summary table (also LOG_DIR/summary.txt). Exit status 1 if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:?usage: scripts/gpu_check.sh LOG_DIR}
mkdir -p "$logs"
bundle=$PWD/gpu_bundle
if [ ! -x "$bundle/bin/h2" ]; then
  echo "gpu_check: no $bundle/bin/h2; run scripts/gpu_bundle.sh on a build machine first" >&2
  exit 2
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH="$bundle/lib:$cuda/lib64:$cuda/lib:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$bundle/lib/ucx"
# GPT-2 124M, B = 4, T = 1024: the shape issue #18's step comparison names.
gpt=(--layers 12 --embd 768 --heads 12 --batch 4 --seq 1024 --steps 5)
h200_bf16_tflops=989  # NVIDIA H200 SXM datasheet, dense BF16 tensor (1,979 with sparsity)

summary="$logs/summary.txt"
printf "%-22s %-8s %8s  %s\n" step result seconds "key line (log: $logs/<step>.log)" >"$summary"
failed=0
# step NAME LIMIT_S KEY_PATTERN COMMAND...: runs it and records pass/FAIL/TIMEOUT with the last line matching KEY
# (on a failure, the log's last line).
step() {
  local name=$1 limit=$2 key=$3
  shift 3
  local start end rc line result
  start=$(date +%s.%N)
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  case $rc in
    0) result=pass ;;
    124) result=TIMEOUT failed=1 ;;
    *) result="FAIL($rc)" failed=1 ;;
  esac
  if [ "$result" = pass ]; then
    line=$(grep -E "$key" "$logs/$name.log" | tail -1)
  else
    line=$(grep -v '^\s*$' "$logs/$name.log" | tail -1)  # what it said last, usually the error
  fi
  printf "%-22s %-8s %8.1f  %s\n" "$name" "$result" "$(awk "BEGIN {print $end - $start}")" "${line:0:110}" |
    tee -a "$summary"
}

step nvidia-smi 15 "H200|H100|A100|NVIDIA" nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
step devices 15 "^  cuda" "$bundle/bin/h2" devices
step check-ops 60 "PASS|FAIL" "$bundle/bin/h2" check ops --backend cuda
step cuda-tests 60 "PASSED|FAILED|SKIPPED" "$bundle/bin/cuda_test" --gtest_brief=1
step matmul-vs-cublas 45 "worst" "$bundle/bin/bench_cuda_matmul"
step gpt2-step-h2 75 "MFU" "$bundle/bin/bench_train_step" --backend cuda --peak-tflops "$h200_bf16_tflops" "${gpt[@]}"
step gpt2-step-pytorch 75 "tokens_per_s" python3 bench/train_step_torch.py 12 768 12 4 1024 5 cuda bf16
python3 - "$logs" <<'PY' | tee -a "$summary"
import json, sys
def last_json(path):
    try:
        lines = [l for l in open(path) if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except OSError:
        return None
h2 = last_json(f"{sys.argv[1]}/gpt2-step-h2.log")
pt = last_json(f"{sys.argv[1]}/gpt2-step-pytorch.log")
if h2 and pt:
    print(f"GPT-2 124M bf16 step: h2 {h2['bf16_tokens_per_s']:.0f} tok/s, PyTorch eager {pt['tokens_per_s']:.0f} tok/s: "
          f"{h2['bf16_tokens_per_s'] / pt['tokens_per_s']:.2f}x (goal >= 1.0); h2 MFU {100 * h2['bf16_mfu']:.1f}% (goal >= 35%)")
else:
    print("GPT-2 124M bf16 step: no comparison (a step above failed)")
PY
# The mixed job: the GPU and this host's cores as two chip types (examples/cluster_gpu_cpu.yaml), each profiled on
# its backend, the layout of examples/layout_gpu_cpu.yaml (a CPU stage, then a GPU stage) costed on those figures,
# then trained for 20 steps; its last line is the measured step beside the simulated one.
export H2=$bundle/bin/h2 LOGS=$logs
step mixed-gpu-cpu 125 "measured / simulated" bash -c '
  set -e
  [ -e data/moby/train_000.bin ] || { echo "no data/moby: carry it along (scripts/fetch_data.sh prepares it)"; exit 1; }
  "$H2" profile --cluster examples/cluster_gpu_cpu.yaml --model examples/model_small.yaml --precision bf16 \
    --out "$LOGS/cluster_profiled.yaml"
  "$H2" plan --cluster "$LOGS/cluster_profiled.yaml" --model examples/model_small.yaml \
    --train examples/train_local.yaml --layout examples/layout_gpu_cpu.yaml --out "$LOGS/mixed_plan.json"
  "$H2" train --config examples/train_cluster.yaml --cluster "$LOGS/cluster_profiled.yaml" \
    --plan "$LOGS/mixed_plan.json" --model examples/model_small.yaml --train examples/train_local.yaml \
    --set train.steps=20 --set train.out_dir="$LOGS/mixed"'
exit $failed

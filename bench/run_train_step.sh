#!/usr/bin/env bash
# Tokens/s of one GPT training step: H2's cpu backend beside PyTorch (Debian's python3-torch), same model,
# batch, precision and thread count, in one run. Installs python3-torch when missing (large: ~240 packages).
#   bench/run_train_step.sh [LAYERS EMBD HEADS BATCH SEQ STEPS]   (default: GPT-2 124M, B=4, T=256, 5 steps)
# Both run with OpenBLAS free to choose its kernel (the development machines pin a slower one).
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-12} embd=${2:-768} heads=${3:-12} batch=${4:-4} seq=${5:-256} steps=${6:-5}
threads=${OMP_NUM_THREADS:-$(nproc)}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "installing python3-torch (Debian) for the comparison" >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
build=${BUILD_DIR:-build}
cmake --build "$build" --target bench_train_step -j"$(nproc)" >/dev/null
run() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" "$@"; }
h2=$(run "$build/bench/bench_train_step" --layers "$layers" --embd "$embd" --heads "$heads" --batch "$batch" \
  --seq "$seq" --steps "$steps")
torch=$(run /usr/bin/python3 bench/train_step_torch.py "$layers" "$embd" "$heads" "$batch" "$seq" "$steps")
/usr/bin/python3 - "$h2" "$torch" <<'PY'
import json, sys
h2, pt = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'system':<22}{'s/step':>10}{'tokens/s':>12}")
for r in (h2, pt):
    print(f"{r['system']:<22}{r['seconds_per_step']:>10.3f}{r['tokens_per_s']:>12.0f}")
print(f"{'h2 bf16':<22}{h2['bf16_seconds_per_step']:>10.3f}{h2['bf16_tokens_per_s']:>12.0f}")
print(f"h2 / pytorch throughput: {h2['tokens_per_s'] / pt['tokens_per_s']:.2f}x (goal >= 1.2x)")
print(f"h2 bf16 / h2 f32 throughput: {h2['bf16_tokens_per_s'] / h2['tokens_per_s']:.2f}x (goal >= 1.3x)")
print(f"h2 MFU vs bare sgemm measured in this run: {100 * h2['gflops'] / h2['sgemm_gflops']:.1f}% "
      f"({h2['gflops']:.0f} of {h2['sgemm_gflops']:.0f} GFLOP/s)")
PY

#!/bin/bash
# Emulated clusters tell the truth (docs/pipeline.md, "Measured against simulated"): on emulated clusters of 4, 8
# and 16 devices with models of 0.5M, 5M and 20M parameters, (1) h2 train --cluster --profile plans on the
# profiled figures and runs; (2) h2 calibrate fits the figures to that run, and h2 train --cluster plans on the
# calibrated file (its own search, as with the profile) and runs. Each run's measured step beside its simulated one (goal: within 10%).
# Writes random token shards (vocabulary 1,024) so that the small models need no tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
H2=${H2:-build/h2}
OUT=${OUT:-runs/emulated_bench}
STEPS=${STEPS:-12}
mkdir -p "$OUT/data"
python3 - "$OUT/data" <<'PY'
import random, struct, sys
random.seed(1)
for name, n in (("train_000.bin", 400000), ("val_000.bin", 20000)):
    tokens = [random.randrange(1024) for _ in range(n)]
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *tokens))
PY
# devices cluster layers hidden heads seq batch
configs=(
  "4 examples/cluster_local.yaml 4 96 4 128 8"
  "8 bench/emulated/cluster_8.yaml 6 256 4 256 8"
  "16 bench/emulated/cluster_16.yaml 11 384 6 256 16"
)
echo "devices  params  figures     stages                                     measured s  simulated s  ratio"
for c in "${configs[@]}"; do
  read -r devices cluster layers hidden heads seq batch <<< "$c"
  dir="$OUT/d$devices"
  mkdir -p "$dir"
  printf 'name: emu-%s\nlayers: %s\nhidden: %s\nheads: %s\nvocab: 1024\nseq_len: %s\n' \
    "$devices" "$layers" "$hidden" "$heads" "$seq" > "$dir/model.yaml"
  printf 'global_batch: %s\nprecision: f32\nzero1: false\nmicro_batches: [1, 2, 4]\n' "$batch" > "$dir/setup.yaml"
  cat > "$dir/train.yaml" <<YAML
model: {n_layer: $layers, n_head: $heads, n_embd: $hidden, vocab_size: 1024, seq_len: $seq}
data: {train: $OUT/data/train_*.bin, val: $OUT/data/val_*.bin}
optim: {lr: 1.0e-3, warmup_steps: 2}
train: {batch_size: $batch, seq_len: $seq, steps: $STEPS, log_every: 100, eval_every: 0, checkpoint_every: 0,
        out_dir: $dir/run}
YAML
  files=(--model "$dir/model.yaml" --train "$dir/setup.yaml" --config "$dir/train.yaml" --quiet)
  "$H2" train --cluster "$cluster" "${files[@]}" --profile --set "train.out_dir=$dir/profiled" > "$dir/profiled.txt" 2>&1
  "$H2" calibrate "$dir/profiled" --out "$dir/calibrated.yaml" > "$dir/calibrate.txt"
  "$H2" train --cluster "$dir/calibrated.yaml" "${files[@]}" --set "train.out_dir=$dir/calibrated" \
    > "$dir/calibrated.txt" 2>&1
  for run in profiled calibrated; do
    python3 - "$dir/$run" "$devices" "$run" <<'PY'
import json, sys
d, devices, figures = sys.argv[1:4]
s = json.load(open(f"{d}/summary.json"))
p = json.load(open(f"{d}/plan.json"))
m = p["model"]
params = 12 * m["hidden"] ** 2 * m["layers"] + m["vocab"] * m["hidden"] + m["seq_len"] * m["hidden"]
stages = " | ".join(f'{x["chip"]} TP{x["tp"]}x{x["dp"]} {x["layers"]}L' for x in p["stages"])
if p["chunks"] > 1:
    stages += f', {p["chunks"]} chunks'
print(f'{devices:>7}  {params / 1e6:5.2f}M  {figures:<10}  {stages:<42} {s["measured_step_s"]:9.3f}  '
      f'{s["simulated_step_s"]:11.3f}  {s["measured_over_simulated"]:.3f}')
PY
  done
done

#!/bin/bash
# h2 calibrate's round trip on the local emulated cluster (docs/planner.md, "Calibration"): profile the chips once,
# then ROUNDS times: train the planner's plan (A), calibrate the profiled figures from that run, check that the
# calibrated file predicts run A, train another layout (B: examples/layout_local.yaml, selective recomputation and
# another split) and check that the calibrated file predicts it too. Prints one line per round and the min-max of
# measured / predicted; the host is shared, so runs differ by 5-15 % from one another (docs/pipeline.md).
set -euo pipefail
cd "$(dirname "$0")/.."
H2=${H2:-build/h2}
OUT=${OUT:-runs/calibrate_bench}
STEPS=${STEPS:-16}
ROUNDS=${ROUNDS:-2}
cluster=examples/cluster_local.yaml model=examples/model_small.yaml train=examples/train_local.yaml
files=(--cluster "$cluster" --model "$model" --train "$train")
precision=$(sed -n 's/^precision: *\([a-z0-9]*\).*/\1/p' "$train")  # the runs train in the setup's precision
run=(--config examples/train_cluster.yaml --set "train.steps=$STEPS" --set train.eval_every=0
  --set train.checkpoint_every=0 --quiet)
mkdir -p "$OUT"
"$H2" profile --cluster "$cluster" --model "$model" --precision "${precision:-f32}" --out "$OUT/profiled.yaml" \
  > /dev/null 2>&1
"$H2" plan --cluster "$OUT/profiled.yaml" --model "$model" --train "$train" --out "$OUT/A.json" > /dev/null 2>&1
"$H2" plan --cluster "$OUT/profiled.yaml" --model "$model" --train "$train" --layout examples/layout_local.yaml \
  --out "$OUT/B.json" > /dev/null 2>&1
step() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['measured_step_s'])" "$1/summary.json"; }
predicted() { "$H2" simulate "$1" --cluster "$2" | sed -n 's/.*: step \([0-9.]*\) \(m\?s\).*/\1 \2/p' |
  awk '{ print ($2 == "ms") ? $1 / 1000 : $1 }'; }
echo "round  A measured  A predicted (calibrated on A)  ratio   B measured  B predicted  ratio"
for r in $(seq 1 "$ROUNDS"); do
  rm -rf "$OUT/A_$r" "$OUT/B_$r"
  "$H2" train "${files[@]}" --plan "$OUT/A.json" "${run[@]}" --set "train.out_dir=$OUT/A_$r" > /dev/null 2>&1
  "$H2" calibrate "$OUT/A_$r" --cluster "$OUT/profiled.yaml" --out "$OUT/calibrated_$r.yaml" > "$OUT/calibrate_$r.txt"
  "$H2" train "${files[@]}" --plan "$OUT/B.json" "${run[@]}" --set "train.out_dir=$OUT/B_$r" > /dev/null 2>&1
  a=$(step "$OUT/A_$r") pa=$(predicted "$OUT/A.json" "$OUT/calibrated_$r.yaml")
  b=$(step "$OUT/B_$r") pb=$(predicted "$OUT/B.json" "$OUT/calibrated_$r.yaml")
  awk -v r="$r" -v a="$a" -v pa="$pa" -v b="$b" -v pb="$pb" \
    'BEGIN { printf "%5d  %8.3f s  %8.3f s                     %5.3f   %8.3f s  %8.3f s   %5.3f\n", r, a, pa, a / pa, b, pb, b / pb }'
done

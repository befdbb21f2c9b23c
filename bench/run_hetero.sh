#!/bin/bash
# HeteroPP on the built-in emulated cluster, measured: the HeteroAuto plan, the uniform layer split of the same
# devices, and each chip type alone, each trained for a few steps by `h2 train --cluster --plan`, against what
# the simulator predicts for the same plan. Writes docs/pipeline_bench.md.
# Needs the sample data (scripts/setup.sh fetches it). STEPS (default 12) sets the steps per run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/bench_hetero
steps=${STEPS:-12}
rm -rf "$out" && mkdir -p "$out"
model=examples/model_small.yaml setup=examples/train_local.yaml cluster=examples/cluster_local.yaml
build/h2 profile --cluster $cluster --model $model --out $out/cluster.yaml
rows=()
for run in plan uniform fast slow; do
  baseline=()
  [ $run = plan ] || baseline=(--baseline $run)
  if ! build/h2 plan --cluster $out/cluster.yaml --model $model --train $setup "${baseline[@]}" --out $out/$run.json \
    > $out/$run.plan.txt 2>&1; then
    echo "$run: does not fit: $(grep -o 'error: .*' $out/$run.plan.txt | head -1)"
    rows+=("$run|does not fit")
    continue
  fi
  build/h2 train --config examples/train_cluster.yaml --cluster $cluster --model $model --train $setup \
    --plan $out/$run.json --set train.steps="$steps" --set train.out_dir=$out/$run --quiet 2>&1 | grep -v "h2 warn"
  rows+=("$run|$out/$run")
done
python3 - "$out" "$steps" "${rows[@]}" > docs/pipeline_bench.md.tmp << 'PY'
import json, sys
out, steps, rows = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"Measured by bench/run_hetero.sh: {steps} steps per run (step time = mean after 2 warm-up steps), on the")
print("cluster examples/cluster_local.yaml as profiled by h2 profile (runs/bench_hetero/cluster.yaml).\n")
print("| run | devices | stages (chip: layers) | measured tokens/s | simulated tokens/s | measured step s | simulated step s | measured / simulated |")
print("|---|---|---|---|---|---|---|---|")
measured = {}
for row in rows:
    name, where = row.split("|")
    if where == "does not fit":
        print(f"| {name} | | | does not fit | | | | |")
        continue
    plan = json.load(open(f"{where}/plan.json"))
    s = json.load(open(f"{where}/summary.json"))
    stages = ", ".join(f"{st['chip']}: {st['layers']}" + ("+E" if st['embedding'] else "") + ("+H" if st['head'] else "") for st in plan["stages"])
    tok = s["measured_tokens_per_s"]; measured[name] = tok
    sim_tok = plan["global_batch"] * plan["model"]["seq_len"] / s["simulated_step_s"]
    print(f"| {name} | {plan['prediction']['devices_used']} | {stages} x DP {plan['dp']} | {tok:.0f} | {sim_tok:.0f} | {s['measured_step_s']:.3f} | {s['simulated_step_s']:.3f} | {s['measured_over_simulated']:.2f} |")
alone = sum(measured.get(k, 0) for k in ("fast", "slow"))
print()
if "uniform" in measured:
    print(f"HeteroAuto plan / uniform split, measured: {measured['plan'] / measured['uniform']:.2f}x.  ")
if alone > 0:
    print(f"Heterogeneous speed-up ratio, measured: {measured['plan']:.0f} / {alone:.0f} = {measured['plan'] / alone:.2f} "
          "(mixed throughput / sum of each chip type alone; a type that cannot hold the model counts 0).")
PY
mv docs/pipeline_bench.md.tmp docs/pipeline_bench.md
cat docs/pipeline_bench.md

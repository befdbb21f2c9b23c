#!/bin/bash
# HeteroPP on the built-in emulated cluster, measured: the HeteroAuto plan, the uniform layer split of the same
# devices, and each chip type alone (planned as h2 train --cluster plans emulated chips: without interleaving),
# each trained for a few steps by `h2 train --cluster --plan`, against what the simulator predicts for the same
# plan. First h2 profile measures the chips (and their kernels' work, which the emulated chips of every run then
# pace to: device/emu/device.h); one run of the uniform split on the profiled figures calibrates them (h2 calibrate),
# and all four are planned on the calibrated figures; two more runs cost layouts written by hand on them with
# h2 plan --layout: examples/layout_local_halves.yaml (two stages meeting inside a block) and its whole-block twin
# examples/layout_local.yaml. ROUNDS (default 3) alternating rounds of all six, so that the host's load falls on each
# alike; the table gives each figure's mean and min-max. Writes docs/pipeline_bench.md.
# Needs the sample data (scripts/setup.sh fetches it). STEPS (default 12) sets the steps per run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/bench_hetero
steps=${STEPS:-12}
rounds=${ROUNDS:-3}
rm -rf "$out" && mkdir -p "$out"
model=examples/model_small.yaml setup=examples/train_local.yaml cluster=examples/cluster_local.yaml
# Profile in the precision the runs train in: the setup's (h2 train --cluster trains in it, docs/pipeline.md).
precision=$(sed -n 's/^precision: *\([a-z0-9]*\).*/\1/p' $setup)
# And up to the global batch's rows a replica: the emulated chips pace the kernels of every plan's replicas as
# profiled (the slow chips alone run 4 or 8 rows a replica).
global_batch=$(sed -n 's/^global_batch: *\([0-9]*\).*/\1/p' $setup)
build/h2 profile --cluster $cluster --model $model --precision "${precision:-f32}" --max-rows "${global_batch:-0}" \
  --out $out/profiled.yaml
build/h2 plan --no-interleave --cluster $out/profiled.yaml --model $model --train $setup --baseline uniform \
  --out $out/calibration.json > $out/calibration.plan.txt
echo "calibration run: the uniform split on the profiled figures"
build/h2 train --config examples/train_cluster.yaml --cluster $out/profiled.yaml --model $model --train $setup \
  --plan $out/calibration.json --set train.steps="$steps" --set train.out_dir=$out/calibration --quiet 2>&1 |
  grep -v "h2 warn"
build/h2 calibrate $out/calibration --out $out/cluster.yaml | sed -n '/^fitted/,/^action/p' | grep -v '^action'
runs=()
for run in plan uniform fast slow; do
  baseline=()
  [ $run = plan ] || baseline=(--baseline $run)
  if build/h2 plan --no-interleave --cluster $out/cluster.yaml --model $model --train $setup "${baseline[@]}" \
    --out $out/$run.json > $out/$run.plan.txt 2>&1; then
    runs+=("$run")
  else
    echo "$run: does not fit: $(grep -o 'error: .*' $out/$run.plan.txt | head -1)"
  fi
done
for run in halves whole; do
  layout=examples/layout_local.yaml
  [ $run = whole ] || layout=examples/layout_local_$run.yaml
  build/h2 plan --cluster $out/cluster.yaml --model $model --train $setup --layout $layout --out $out/$run.json \
    > $out/$run.plan.txt
  runs+=("$run")
done
for round in $(seq 1 "$rounds"); do
  for run in "${runs[@]}"; do
    echo "round $round/$rounds: $run"
    build/h2 train --config examples/train_cluster.yaml --cluster $out/cluster.yaml --model $model --train $setup \
      --plan $out/$run.json --set train.steps="$steps" --set train.out_dir=$out/$run.$round --quiet 2>&1 |
      grep -v "h2 warn"
  done
done
python3 - "$out" "$steps" "$rounds" "${runs[@]}" > docs/pipeline_bench.md.tmp << 'PY'
import json, sys
out, steps, rounds, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def spread(xs, f="{:.0f}"):
    return f"{f.format(sum(xs) / len(xs))} ({f.format(min(xs))}–{f.format(max(xs))})"
print(f"Measured by bench/run_hetero.sh: {rounds} alternating rounds of {steps} steps per run (step time = mean after")
print("2 warm-up steps), on the cluster examples/cluster_local.yaml as profiled by h2 profile and calibrated by")
print("h2 calibrate on one earlier run of the uniform split (runs/bench_hetero/cluster.yaml); each figure the mean")
print("over the rounds, (min–max). The last two rows are not planned: layouts written by hand, costed by h2 plan")
print("--layout on the same calibrated figures — layout_local_halves.yaml, whose slow stages meet inside block 1, and")
print("its twin in whole blocks, layout_local.yaml.\n")
print("| run | devices | stages (chip: layers) | measured tokens/s | simulated tokens/s | measured / simulated |")
print("|---|---|---|---|---|---|")
tokens, ratios = {}, {}
for name in ("plan", "uniform", "fast", "slow", "halves", "whole"):
    if name not in runs:
        print(f"| {name} alone | | | does not fit | | |" if name in ("fast", "slow") else f"| {name} | | | does not fit | | |")
        continue
    plan = json.load(open(f"{out}/{name}.json"))
    summaries = [json.load(open(f"{out}/{name}.{r}/summary.json")) for r in range(1, rounds + 1)]
    def stage(st):
        # in blocks: a stage that starts at a block's MLP half or ends after its attention half holds half of it
        held = st['layers'] - 0.5 * (st.get('starts_at_mlp', False) + st.get('ends_at_attention', False))
        what = f"{st['chip']}: {held:g}" + ("+E" if st['embedding'] else "") + ("+H" if st['head'] else "")
        return what + "".join(f" [{g['chip']} x{g['replicas']}: {g['rows']} rows]" for g in st.get("groups", []))
    stages = ", ".join(stage(st) for st in plan["stages"])
    tokens[name] = [s["measured_tokens_per_s"] for s in summaries]
    sim_tok = plan["global_batch"] * plan["model"]["seq_len"] / summaries[0]["simulated_step_s"]
    ratio = ratios[name] = [s["measured_over_simulated"] for s in summaries]
    label = {"plan": "plan", "uniform": "uniform", "halves": "layout_local_halves.yaml",
             "whole": "layout_local.yaml"}.get(name, f"{name} alone")
    print(f"| {label} | {plan['prediction']['devices_used']} | {stages} | {spread(tokens[name])} | {sim_tok:.0f} | "
          f"{spread(ratio, '{:.2f}')} |")
print()
for what, names in (("Runs within 5% of their simulated step (#15's bar: the plan, the uniform split, each type alone)",
                     ("plan", "uniform", "fast", "slow")), ("The layouts written by hand", ("halves", "whole"))):
    counted = {name: xs for name, xs in ratios.items() if name in names}
    misses = [f"{name} round {r + 1}: {x:.3f}"
              for name, xs in counted.items() for r, x in enumerate(xs) if abs(x - 1) > 0.05]
    total = sum(map(len, counted.values()))
    print(f"{what}: {total - len(misses)} of {total} within 5%" + (f" (outside: {', '.join(misses)})" if misses else "")
          + ".  ")
drifts = [m["emulation_drift"] for name in ratios for r in range(1, rounds + 1)
          for m in json.load(open(f"{out}/{name}.{r}/summary.json"))["memory"] if "emulation_drift" in m]
if drifts:
    print(f"The host against the profile (each emulated rank's drift, docs/devices.md): {min(drifts):.3f}–"
          f"{max(drifts):.3f}.  ")
rounds_of = lambda f: [f(r) for r in range(rounds)]
if "uniform" in tokens:
    print(f"HeteroAuto plan / uniform split, measured (per round): "
          f"{spread(rounds_of(lambda r: tokens['plan'][r] / tokens['uniform'][r]), '{:.2f}')}x.  ")
alone = rounds_of(lambda r: sum(tokens[k][r] for k in ("fast", "slow") if k in tokens))
if all(a > 0 for a in alone):
    print(f"Heterogeneous speed-up ratio, measured (per round): "
          f"{spread(rounds_of(lambda r: tokens['plan'][r] / alone[r]), '{:.2f}')} (mixed throughput / sum of each "
          "chip type alone; a type that cannot hold the model counts 0).")
PY
mv docs/pipeline_bench.md.tmp docs/pipeline_bench.md
cat docs/pipeline_bench.md

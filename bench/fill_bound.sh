#!/bin/bash
# What no schedule can beat on the 1,024-chip example (docs/planner.md, "Where the step goes now"): each plan's
# fill and drain taken out of its 1F1B closed form — sum(f + b) - max(f + b) + 2 sum(sends), from its plan.json —
# for the mixed plan and each chip type alone (h2 plan --baseline TYPE), and the heterogeneous speed-up ratio of
# what is left. Usage: bench/fill_bound.sh [build dir]  (a few seconds; writes only under a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
h2="${1:-build}/h2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--cluster examples/cluster_hetero1024.yaml --model examples/model_100b.yaml --train examples/train_100b.yaml)
"$h2" plan "${args[@]}" --out "$out/mix.json" > /dev/null
for t in A B C D; do "$h2" plan "${args[@]}" --baseline "$t" --out "$out/$t.json" > /dev/null; done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def bound(name):
    p = json.load(open(f"{out}/{name}.json"))
    fb = [s["forward_s"] + s["backward_s"] for s in p["stages"]]
    fill = sum(fb) - max(fb) + 2 * sum(s["send_s"] for s in p["stages"])
    tokens = p["prediction"]["tokens_per_s"] * p["prediction"]["step_s"]
    step = p["prediction"]["step_s"]
    print(f"{name:4} step {step:7.2f} s, fill and drain {fill:5.2f} s: {tokens / step:7.0f} tokens/s, "
          f"without it {step - fill:7.2f} s, {tokens / (step - fill):7.0f} tokens/s")
    return tokens / step, tokens / (step - fill)
mix, mix_bound = bound("mix")
alone = [bound(t) for t in "ABCD"]
print(f"ratio now {mix / sum(a for a, _ in alone):.3f}; with no fill and drain in any plan "
      f"{mix_bound / sum(b for _, b in alone):.3f} (the mix alone without it: {mix_bound / sum(a for a, _ in alone):.3f})")
PY

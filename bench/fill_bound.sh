#!/bin/bash
# What no schedule can beat on the 1,024-chip example (docs/planner.md, "Where the step goes now"): each plan's
# fill and drain taken out of its 1F1B closed form — sum(f + b) - max(f + b) + 2 sum(sends), from its plan.json —
# for the mixed plan and each chip type alone (h2 plan --baseline TYPE), and the heterogeneous speed-up ratio of
# what is left. Then what balance alone would give: every stage's f + b at their mean (the work kept, boundaries
# anywhere, memory not checked), so that the m - 1 micro-batches after the first pass at the mean instead of the
# slowest stage's pace; and both. Estimates from the closed form, each plan's other terms as they are.
# Usage: bench/fill_bound.sh [build dir]  (a few seconds; writes only under a temporary directory)
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
    sends = 2 * sum(s["send_s"] for s in p["stages"])
    m, mean = p["num_micro_batches"], sum(fb) / len(fb)
    step = p["prediction"]["step_s"]
    tokens = p["prediction"]["tokens_per_s"] * step
    fill = sum(fb) - max(fb) + sends
    balanced = step - (m - 1) * (max(fb) - mean)  # the slowest stage's pace at the mean
    both = balanced - (sum(fb) - mean + sends)  # ... and its fill and drain out too
    print(f"{name:4} step {step:7.2f} s, fill and drain {fill:5.2f} s: {tokens / step:7.0f} tokens/s, "
          f"without it {step - fill:7.2f} s, {tokens / (step - fill):7.0f} tokens/s; stages at their mean "
          f"{1e3 * mean:6.1f} ms (slowest {1e3 * max(fb):6.1f}): {balanced:7.2f} s, {tokens / balanced:7.0f} "
          f"tokens/s; both {both:7.2f} s, {tokens / both:7.0f} tokens/s")
    return tokens / step, tokens / (step - fill), tokens / balanced, tokens / both
mix = bound("mix")
alone = [bound(t) for t in "ABCD"]
def ratio(i, j=None):
    return mix[i] / sum(a[i if j is None else j] for a in alone)
print(f"ratio now {ratio(0):.3f}; with no fill and drain in any plan {ratio(1):.3f} (the mix alone without it: "
      f"{ratio(1, 0):.3f}); with every plan's stages at their mean {ratio(2):.3f} (the mix alone: {ratio(2, 0):.3f}); "
      f"both in every plan {ratio(3):.3f}")
PY

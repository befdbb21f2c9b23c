#!/bin/bash
# What ZB-H1 would give the 1,024-chip examples (docs/planner.md, "A zero-bubble schedule, simulated"): each plan —
# the mixed one and each chip type alone (h2 plan --baseline TYPE) — replayed by h2 simulate with its own schedule
# and with zb-h1 (each stage deferring the W's its memory holds beside 1F1B's), the faster kept, and the
# heterogeneous speed-up ratio (mixed throughput / the sum of each type alone's) before and after. The plans are
# the search's for 1F1B and interleaving: a search that costed zb-h1 could place the stages otherwise.
# Usage: bench/zero_bubble.sh [build dir]  (seconds; writes only under a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
h2="${1:-build}/h2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # cluster, then its chip types
  local cluster=$1
  shift
  local args=(--cluster "$cluster" --model examples/model_100b.yaml --train examples/train_100b.yaml)
  echo "== $cluster"
  "$h2" plan "${args[@]}" --out "$out/mix.json" > /dev/null
  for t in "$@"; do "$h2" plan "${args[@]}" --baseline "$t" --out "$out/$t.json" > /dev/null; done
  for name in mix "$@"; do
    "$h2" simulate "$out/$name.json" > "$out/$name.own" || true
    "$h2" simulate "$out/$name.json" --schedule zb-h1 > "$out/$name.zb" || true
  done
  python3 - "$out" mix "$@" <<'PY'
import re, sys
out, names = sys.argv[1], sys.argv[2:]
def read(path):
    text = open(path).read()
    m = re.search(r"simulated (\S+): step ([0-9.]+) s", text)
    deferred = re.search(r"has no room\):([-0-9 ]*)", text)
    return m.group(1), float(m.group(2)), "OVER CAPACITY" not in text, deferred.group(1).strip() if deferred else ""
steps = {}
for n in names:
    own_kind, own, own_fits, _ = read(f"{out}/{n}.own")
    _, zb, zb_fits, deferred = read(f"{out}/{n}.zb")
    best = min(own, zb) if zb_fits else own
    steps[n] = (own, best)
    print(f"{n:7} {own_kind:11} {own:8.2f} s   zb-h1 {zb:8.2f} s ({100 * (zb / own - 1):+5.1f}%, "
          f"{'fits' if zb_fits else 'OVER CAPACITY'})   W's deferred: {deferred}")
alone = names[1:]
for i, what in ((0, "as planned"), (1, "each plan's faster of its own and zb-h1")):
    ratio = (1 / steps["mix"][i]) / sum(1 / steps[n][i] for n in alone)
    print(f"ratio {what}: {ratio:.3f}")
ratio = (1 / steps["mix"][1]) / sum(1 / steps[n][0] for n in alone)
print(f"ratio with zb-h1 in the mix alone: {ratio:.3f}")
PY
}
run examples/cluster_hetero1024.yaml A B C D
run examples/cluster_catalog1024.yaml H100 MI300X 910B A100

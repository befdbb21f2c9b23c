#!/bin/bash
# ZB-H1 (backwards split into B and W, Qi et al. 2024) in the search, predicted and measured (docs/planner.md, "A
# zero-bubble schedule"; docs/pipeline.md, the built-in example):
#  - predicted (seconds): the 1,024-chip examples planned by h2 plan --compare with the 100B training setup as shipped
#    (zero_bubble: true, the default: the search keeps ZB-H1 where a finalist's replay is faster) and with
#    zero_bubble: false — the mixed plan, each chip type alone, and the heterogeneous speed-up ratio of each;
#  - measured (with --measure ROUNDS): the built-in example (h2 train with no arguments: profile, plan, train) in
#    alternating rounds with its training setup as shipped (examples/train_local.yaml: zero_bubble false, 1F1B) and
#    with zero_bubble: true, each run's measured step beside its simulated one.
# Usage: bench/zero_bubble.sh [--measure ROUNDS] [build dir]  (writes only under a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=0
if [ "${1:-}" = --measure ]; then
  rounds=$2
  shift 2
fi
h2="${1:-build}/h2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# A training file as shipped, with zero_bubble set.
with_zero_bubble() {  # file, true|false, copy
  grep -v '^zero_bubble:' "$1" > "$3"
  echo "zero_bubble: $2" >> "$3"
}
with_zero_bubble examples/train_100b.yaml false "$out/train_100b_1f1b.yaml"
for cluster in examples/cluster_hetero1024.yaml examples/cluster_catalog1024.yaml; do
  for setup in examples/train_100b.yaml "$out/train_100b_1f1b.yaml"; do
    echo "== $cluster, $(basename "$setup")"
    "$h2" plan --cluster "$cluster" --model examples/model_100b.yaml --train "$setup" --compare |
      grep -E '^(plan:|predicted:|why:.*ZB-H1|search:|[A-Za-z0-9]+ +alone|heterogeneous)' | sed 's/^why:.*; ZB-H1/ZB-H1/'
  done
done
[ "$rounds" -gt 0 ] || exit 0
with_zero_bubble examples/train_local.yaml true "$out/train_local_zb.yaml"
for round in $(seq 1 "$rounds"); do
  for setup in examples/train_local.yaml "$out/train_local_zb.yaml"; do
    "$h2" train --config examples/train_cluster.yaml --cluster examples/cluster_local.yaml \
      --model examples/model_small.yaml --train "$setup" --profile --set train.out_dir="$out/run" > "$out/log" 2>&1
    echo "round $round, $(grep -o 'per pipeline, [a-z0-9-]*' "$out/log"): $(grep '^done:' "$out/log")"
  done
done

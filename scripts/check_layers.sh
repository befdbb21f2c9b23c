#!/usr/bin/env bash
# Fails when a source file includes a part above its own (docs/architecture.md, "Layers"). Reads every
# #include "part/..." line under SRC (default: src/) and checks the included part against the table below.
#   scripts/check_layers.sh [SRC]
set -euo pipefail
src=${1:-"$(dirname "$0")/../src"}

# What each part may include (besides itself): the layer table of docs/architecture.md, core (1), device and ops
# (2: a backend is a device and its kernels), model (3), comm and schedule (4), planner and train (5), sim (6),
# pipeline (7), cli (8).
declare -A allowed=(
  [core]=""
  [device]="core ops"
  [ops]="core device"
  [model]="core device ops"
  [comm]="core device"
  [schedule]="core"
  [planner]="core model schedule"
  [train]="core device ops model"
  [sim]="core model schedule planner"
  [pipeline]="core device ops model comm schedule planner train sim"
  [cli]="core device ops model comm schedule planner train sim pipeline"
)

bad=0
while IFS= read -r file; do
  part=${file#"$src"/}
  part=${part%%/*}
  if [ -z "${allowed[$part]+x}" ]; then
    echo "check_layers: $file: folder '$part' is not in the layer table (scripts/check_layers.sh)" >&2
    bad=1
    continue
  fi
  while IFS=: read -r line included; do
    target=${included%%/*}
    [ "$target" = "$part" ] && continue
    [ -z "${allowed[$target]+x}" ] && continue  # not one of ours (e.g. a system header in quotes)
    if [[ " ${allowed[$part]} " != *" $target "* ]]; then
      echo "check_layers: $file:$line: '$part' includes \"$included\" from '$target', a layer it may not use" >&2
      bad=1
    fi
  done < <(grep -n '^#include "' "$file" | sed -E 's/^([0-9]+):#include "([^"]+)".*/\1:\2/')
done < <(find "$src" -type f \( -name '*.h' -o -name '*.cc' \) | sort)

if [ "$bad" -ne 0 ]; then
  echo "check_layers: upward includes found; move the code down a layer or the include up (docs/architecture.md)" >&2
  exit 1
fi
echo "check_layers: no upward include in $src"

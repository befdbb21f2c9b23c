#!/usr/bin/env bash
# The layering check passes on the real tree and fails on a copy of it with one upward include planted
# (a planner file including the pipeline runtime), naming the file and line.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
check="$root/scripts/check_layers.sh"
"$check" "$root/src" >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/src" "$tmp/src"
printf '#include "pipeline/runtime.h"\n' >>"$tmp/src/planner/plan.h"
if out=$("$check" "$tmp/src" 2>&1); then
  echo "FAIL: an upward include passed the check" >&2
  exit 1
fi
grep -q "src/planner/plan.h:.*'planner' includes \"pipeline/runtime.h\"" <<<"$out" || {
  echo "FAIL: the message does not name the file and the include: $out" >&2
  exit 1
}
echo "ok: the check passes on src/ and names a planted upward include"

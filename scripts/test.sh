#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds and runs the whole test suite under CTest; exits non-zero if a test fails.
#   scripts/test.sh           the Release build
#   scripts/test.sh --asan    the ASan + UBSan build
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" "$@"
build_dir=build
[ "${1:-}" = --asan ] && build_dir=build-asan
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 300

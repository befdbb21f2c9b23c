#!/usr/bin/env bash
# Runs bench_ops with OpenBLAS free to choose its kernel for this CPU: the environment of the development
# machines pins OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE to a slower kernel, which tests keep but a benchmark drops.
# The table's first line names the kernel that ran.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake --build "$build" --target bench_ops -j"$(nproc)" >/dev/null
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$build/bench/bench_ops" "$@"

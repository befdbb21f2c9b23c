#!/bin/bash
# `h2 bench comm` with Open MPI beside it: installs Open MPI (Debian openmpi-bin, libopenmpi-dev) when missing,
# re-runs cmake so bench_comm_mpi is built, and writes the table to docs/comm_bench.md.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if ! command -v mpirun > /dev/null || ! dpkg -s libopenmpi-dev > /dev/null 2>&1; then
  $sudo apt-get update -qq > /dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev > /dev/null
fi
cmake --preset release > /dev/null
cmake --build build -j"$(nproc)" --target h2 bench_comm_h2 bench_comm_mpi > /dev/null
{
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores; $(mpirun --version | head -1); UCX $(pkg-config --modversion ucx)."
  echo
  build/h2 bench comm --repeats "${REPEATS:-3}"
} > docs/comm_bench.md.tmp
mv docs/comm_bench.md.tmp docs/comm_bench.md
cat docs/comm_bench.md

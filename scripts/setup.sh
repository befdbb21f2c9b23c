#!/usr/bin/env bash
# Installs the Debian packages H2 needs (only those missing; quiet when all are present) and builds it.
#   scripts/setup.sh           Release build in build/
#   scripts/setup.sh --asan    AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/
#   scripts/setup.sh --deps-only   the packages alone (scripts/gpu_bundle.sh builds its own way)
set -euo pipefail
cd "$(dirname "$0")/.."

preset=release
case "${1:-}" in
  "") ;;
  --asan) preset=asan ;;
  --deps-only) preset="" ;;
  *) echo "usage: scripts/setup.sh [--asan | --deps-only]" >&2; exit 2 ;;
esac

# Why each package: compiler and build tools; OpenBLAS in its OpenMP flavour (one thread pool shared with our
# kernels); yaml-cpp for cluster/model/train files; CLI11 for the h2 command; nlohmann-json for JSON files
# (tokenizer, checkpoints, plans); UCX for DiComm's transport between processes and hosts; GoogleTest/GoogleMock
# for tests; iproute2 for the two-host test (network namespaces and a veth pair); zlib for the checkpoints' CRC-32.
packages=(g++ cmake make pkg-config libopenblas-openmp-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libucx-dev
  libgtest-dev libgmock-dev iproute2 zlib1g-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -z "$preset" ] && exit 0
cmake --preset "$preset" >/dev/null
build_dir=build
[ "$preset" = asan ] && build_dir=build-asan
log=$(mktemp)
if ! cmake --build "$build_dir" -j"$(nproc)" >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "setup: the build failed (full log above)" >&2
  exit 1
fi
grep -E "warning:" "$log" >&2 || true  # the build is meant to be warning-free: show any that appear
rm -f "$log"
echo "setup: built $build_dir/h2" >&2
# The sample data of the built-in example (cached under data/ after the first time).
[ "$preset" = release ] && scripts/fetch_data.sh
exit 0

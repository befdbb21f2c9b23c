#!/usr/bin/env bash
# Builds H2 with the cuda backend for a GPU machine and packs what that machine lacks into gpu_bundle/ (ignored by
# git; docs/devices.md, "Checking on a GPU"): the programs scripts/gpu_check.sh runs, and the shared libraries of
# our Debian packages (yaml-cpp, UCX and its transport modules, OpenBLAS, libgomp, ...). The CUDA libraries are
# not packed: the GPU machine has its own toolkit (the same major version is assumed: CUDA 13).
#   scripts/gpu_bundle.sh            then, on the GPU machine, from the repository root: scripts/gpu_check.sh LOGS
# The build is generic x86-64 (H2_NATIVE=OFF): the GPU machine's processor is not this one.
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/setup.sh" --deps-only
out=gpu_bundle build=build-gpu
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DH2_NATIVE=OFF -DH2_CUDA=ON >/dev/null
programs=(h2 cuda_test bench_train_step bench_cuda_matmul)
cmake --build "$build" -j"$(nproc)" --target "${programs[@]}" >/dev/null
rm -rf "$out.tmp"
mkdir -p "$out.tmp/bin" "$out.tmp/lib"
cp "$build/h2" "$build/tests/cuda_test" "$build/bench/bench_train_step" "$build/bench/bench_cuda_matmul" "$out.tmp/bin/"
# Every library the programs load, except the C runtime's and CUDA's (the GPU machine has both).
for lib in $(ldd "$out.tmp"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) ;;
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so*) ;;
    *) cp -L "$lib" "$out.tmp/lib/" ;;
  esac
done
# UCX loads its transports from the ucx/ folder beside libucs.
ucx_modules=$(dirname "$(ldd "$out.tmp/bin/h2" | awk '$1 ~ /^libucs/ {print $3}')")/ucx
if [ -d "$ucx_modules" ]; then
  mkdir -p "$out.tmp/lib/ucx"
  find "$ucx_modules" -maxdepth 1 -name '*.so*' -exec cp -P {} "$out.tmp/lib/ucx/" \;
fi
rm -rf "$out"
mv "$out.tmp" "$out"
size_mib=$(du -sm "$out" | cut -f1)
echo "gpu_bundle: $out/ holds ${#programs[@]} programs and $(ls "$out/lib" | wc -l) libraries, ${size_mib} MiB" >&2
if [ "$size_mib" -ge 60 ]; then
  echo "gpu_bundle: $out/ is ${size_mib} MiB, over the 60 MiB a GPU check may carry" >&2
  exit 1
fi

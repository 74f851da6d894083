#!/usr/bin/env bash
# Builds and runs benchmarks/matmul_check.cu (tensor-core kernels vs cuBLAS, no torch) on a GPU machine.
#   OUT=out bash benchmarks/run_matmul_check.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
# cuBLAS from the toolkit, or from the nvidia-cublas wheel that torch depends on.
CUBLAS_FLAGS="-lcublas"
if ! ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libcublas.so >/dev/null 2>&1; then
  whl=$(python3 -c "import nvidia, os; print([os.path.join(p, d) for p in nvidia.__path__ for d in os.listdir(p) if os.path.exists(os.path.join(p, d, 'include', 'cublas_v2.h'))][0])" 2>/dev/null)
  lib=$(ls "$whl"/lib/libcublas.so* | head -1)
  CUBLAS_FLAGS="-I$whl/include $lib ${lib/libcublas./libcublasLt.} -Xlinker -rpath=$whl/lib"
fi
nvcc -std=c++17 -O3 --expt-relaxed-constexpr -DTORCHEXT_BUILT_SM90A -gencode=arch=compute_90a,code=sm_90a \
  -Xptxas -v -I cuda_ops benchmarks/matmul_check.cu cuda_ops/matmul_wgmma.cu cuda_ops/common.cu $CUBLAS_FLAGS \
  -o "$OUT/matmul_check" > "$OUT/matmul_check_build.log" 2>&1 || { tail -30 "$OUT/matmul_check_build.log"; exit 1; }
grep -E "spill|Used" "$OUT/matmul_check_build.log" | sort | uniq -c | head
timeout 300 "$OUT/matmul_check" "$@" 2>&1 | tee "$OUT/matmul_check.txt"

#!/usr/bin/env bash
# One call on a GPU machine: build torchext for the local torch, run the whole test suite (GPU tests included),
# run the GPU tests again under compute-sanitizer memcheck (racecheck and synccheck on request), and run the op
# benchmark. Everything lands in $OUT. The property-based tests run their larger profile here
# (TORCHEXT_HYPOTHESIS_PROFILE=gpu unless set).
#
#   OUT=out bash benchmarks/run_on_gpu.sh [build] [test] [memcheck] [racecheck] [synccheck] [bench] [matmul] [memory]
#                                         [host] [conv2d] [batch_norm] [pooling] [optim] [loop] [resnet18_imagenet] [compare]
#                                         [ddp] [notebooks] [cpp]
#   (default: the first four)
# ONLY_TESTS (e.g. "tests/test_matmul.py tests/test_conv2d.py") narrows the test stage to those files, GPU tests only.
#
# matmul runs benchmarks/bench_matmul.py (ladder, Linear, CPU GEMM; ~2 min on an H200, MATMUL_ARGS=--quick ~1 min).
# host runs benchmarks/bench_host.py on CUDA tensors (host time per module call, ~30 s).
# conv2d runs benchmarks/bench_conv2d.py (every ResNet-18 convolution against cuDNN; CONV2D_ARGS e.g. --dtypes bfloat16).
# batch_norm runs benchmarks/bench_batch_norm.py (BN + ReLU and BN + add + ReLU fwd+bwd against eager and torch.compile
# at ResNet's shapes, batch 512 bf16; ~2 min, most of it torch.compile's; BATCH_NORM_ARGS e.g. --no-compile).
# pooling runs benchmarks/bench_pooling.py (ResNet-18's pools against torch, bf16 channels-last and fp32 NCHW, ~20 s).
# optim runs benchmarks/bench_optim.py (torchext.optim.SGD's step against torch.optim.SGD's foreach and fused forms, ~20 s).
# loop runs benchmarks/bench_loop.py: torchext-compare's training loop against a bare loop of the same step, both
# models, stock and torchext (~1 min on an H100; LOOP_ARGS e.g. "--models resnet18_cifar --rounds 3").
# step_variants runs benchmarks/bench_step_variants.py: the fully swapped ResNet-18 step against stock's, with and
# without autocast copies and forks, in rounds (~1 min).
# resnet18_imagenet runs benchmarks/bench_resnet18_imagenet.py: torchvision's ResNet-18 at 224x224, batch 128, bf16,
# channels-last, synthetic data on the GPU, 50 steps x 5 alternated rounds per provider: stock, every layer torchext's
# (swap_modules, torch.fx fusions) and stock under torch.compile (~2-3 min, most of it compiling; RESNET18_IMAGENET_ARGS
# e.g. --no-compile or "--rounds 3").
# compare runs the CIFAR-10 comparisons named in COMPARE_RUNS (default: the first five of the table below; about 15
# min on an H100, so name a few per call where calls are limited to 10 min). The *_full runs swap every layer
# (--swap-conv: torchext's convolutions too; BatchNorm, pools, activations, Linear and the loss are swapped by default).
# ddp runs the 2-GPU NCCL tests (tests/test_compare.py, tests/test_ddp.py: DDP on a fully swapped small ResNet and
# SyncBatchNorm, against stock), then the runs named in DDP_RUNS under torchrun --nproc_per_node=2 (default
# resnet18_cifar_b512_ddp2_full: every layer swapped; resnet18_cifar_b512_ddp2: the default recipe;
# resnet18_cifar_b512_ddp2_full_1gpu_gloo: the fully swapped one with both ranks on one GPU over gloo, DDP's accuracy
# where no 2-GPU machine is lent, its times not DDP's). Each run is written to /tmp/torchext-compare/<run>/ (results,
# plots and its console log) and packed into $OUT/cifar10-<run>.tar.gz: one file per run comes back. COMPARE_DATA:
# the CIFAR-10 source (default .data/cifar10-train-jpg.tar.gz).
# cpp (after build; `build cpp` is one call of about 8 minutes on an H100 with 16 cores) is torchext from C++
# (docs/cpp.md): the C++ tests (tests/test_cpp.py: the GoogleTest suite with its CUDA rows and the pool made
# PyTorch's allocator, through CTest, and a fresh CMake project), then examples/cpp built in Release: the CIFAR-10
# export (python -m torchext.data export-binary COMPARE_DATA, the hold-out torchext-compare validates on as
# test_batch.bin), train_cifar on cnn_cifar (CPP_SEEDS, default 0,1,2; CPP_EPOCHS, default 20: the Python tool's
# recipe; CPP_DEVICE, CPP_TRAIN_ARGS e.g. "--max-batches 5" for a smoke run) and gemm_bench (the ladder at 1024-4096
# in float32 and bfloat16, CPP_GEMM_ARGS to change, e.g. "--dtypes float32,tf32,bfloat16,float16"). Logs:
# $OUT/cpp_tests.log, cpp_train_cnn_cifar.log (+ .jsonl), cpp_gemm.md. CPP_PARTS (default "tests examples") runs one
# of the two halves, where a call's time limit does not hold both. It needs cmake and GoogleTest; a machine
# without them and without network takes them from the checkout: a cmake wheel in .whl/ (pip download cmake
# --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl; with cpack deleted from it and its
# RECORD, 22 MB, the carry of .whl, .deps and .data stays under the device's 64 MiB) and GoogleTest's sources in
# .deps/googletest (cp -r /usr/src/googletest .deps/ on a Debian machine with the googletest package); carry both.
# notebooks executes notebooks/*.ipynb with the machine's settings into $OUT/notebooks/ (02 trains the ResNet-18
# recipe on .data/cifar10-train-jpg.tar.gz, ~3 min on an H100). The device machines have no Jupyter: fetch the
# wheels here once (Python 3.12, x86-64), and carry .data and .whl:
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 -d .whl \
#     nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 jupyter_client==8.10.0 ipython==8.12.3
# then delete from .whl what the machine has already (attrs, packaging, pygments, python_dateutil, typing_extensions,
# tzdata), so that no second copy shadows it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)}
export TORCHEXT_HYPOTHESIS_PROFILE=${TORCHEXT_HYPOTHESIS_PROFILE:-gpu}
stages=${*:-build test memcheck bench}
# The extension must share the process's libstdc++ (as torch does). Some images put a GCC wrapper first (seen:
# /opt/gcc/bin/g++ via $CXX on the device machines) that links libstdc++ statically into the module; formatting a
# number into an error message then crashes. Build with the system compiler where there is one.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared"; fi
status=0

has() { [[ " $stages " == *" $1 "* ]]; }

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  nvcc --version | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if has build; then
  echo "== build"
  if ! TORCHEXT_CUDA=1 python setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
    grep -E "error|Error" "$OUT/build.log" | head -30
    exit 1
  fi
  grep -E "spill|warning" "$OUT/build.log" | sort | uniq -c | head -20
fi

if has test; then
  echo "== tests ${ONLY_TESTS:-}"
  # shellcheck disable=SC2086
  python -m pytest ${ONLY_TESTS:-tests} ${ONLY_TESTS:+-m gpu} -q -p no:cacheprovider -ra > "$OUT/pytest.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -40
  tail -1 "$OUT/pytest.log"
fi

# sanitize TOOL FILTER: the GPU tests matching FILTER (pytest -k) under compute-sanitizer --tool TOOL; its log to
# $OUT/TOOL.log. memcheck covers every kernel path in float32 and bfloat16 (float16 and float64 run the same code
# paths); racecheck (shared-memory hazards) and synccheck (barriers in divergent code) are slow, so by default they
# run float32 only.
sanitize() {
  local tool=$1 filter=$2
  echo "== compute-sanitizer $tool on the GPU tests (-k \"$filter\")"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    python -m pytest tests -q -p no:cacheprovider -m "gpu and not slow" -k "$filter" -x > "$OUT/$tool.log" 2>&1
  local rc=$?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|out of bounds|hazard|Barrier|^FAILED" "$OUT/$tool.log" | head -20
  tail -1 "$OUT/$tool.log"
  echo "$tool exit code $rc"
  [ $rc -eq 0 ] || status=1
}
has memcheck && sanitize memcheck "${MEMCHECK_K:-not float64 and not float16}"
has racecheck && sanitize racecheck "${RACECHECK_K:-not float64 and not float16 and not bfloat16}"
has synccheck && sanitize synccheck "${SYNCCHECK_K:-not float64 and not float16 and not bfloat16}"

# bench_stage TITLE SCRIPT NAME [ARGS...]: runs benchmarks/SCRIPT, the CSV to $OUT/NAME.csv, the tables to NAME.md.
bench_stage() {
  local title=$1 script=$2 name=$3
  shift 3
  echo "== $title"
  python "benchmarks/$script" "$@" --out "$OUT/$name.csv" > "$OUT/$name.md" 2> "$OUT/$name.err" || status=1
  tail -5 "$OUT/$name.err"
  cat "$OUT/$name.md"
}
has bench && bench_stage "op benchmark" bench_ops.py ops_gpu
# MEMORY_ARGS e.g. "--parts loop,empty,replay" or "--data .data/cifar10-train-jpg.tar.gz" for the epoch part.
# shellcheck disable=SC2086
has memory && bench_stage "memory pool benchmark" bench_memory.py memory_gpu ${MEMORY_ARGS:-}
# shellcheck disable=SC2086
has matmul && bench_stage "matmul benchmark" bench_matmul.py matmul_gpu ${MATMUL_ARGS:-}
has host && bench_stage "host time per call" bench_host.py host_gpu --device cuda
# shellcheck disable=SC2086
has conv2d && bench_stage "conv2d against cuDNN" bench_conv2d.py conv2d_gpu ${CONV2D_ARGS:-}
# shellcheck disable=SC2086
has batch_norm && bench_stage "batch norm against eager and torch.compile" bench_batch_norm.py batch_norm_gpu ${BATCH_NORM_ARGS:-}
# shellcheck disable=SC2086
has pooling && bench_stage "pooling against torch" bench_pooling.py pooling_gpu ${POOLING_ARGS:-}
has optim && bench_stage "SGD step against torch" bench_optim.py optim_gpu ${OPTIM_ARGS:-}
has loop && bench_stage "training loop against a bare loop" bench_loop.py loop_gpu --device cuda ${LOOP_ARGS:-}
has step_variants && bench_stage "ResNet-18 step with and without autocast copies and forks" bench_step_variants.py \
  step_variants_gpu
# shellcheck disable=SC2086
has resnet18_imagenet && bench_stage "torchvision ResNet-18 at 224x224: stock, torchext, stock torch.compile" \
  bench_resnet18_imagenet.py resnet18_imagenet_gpu ${RESNET18_IMAGENET_ARGS:-}
# compare_run NAME LIMIT_S [torchext-compare args...]
compare_run() {
  local name=$1 limit=$2
  shift 2
  local dir="/tmp/torchext-compare/$name"
  mkdir -p "$dir"
  echo "== compare $name: $*"
  # shellcheck disable=SC2086
  "${COMPARE_LAUNCH[@]}" --data "${COMPARE_DATA:-.data/cifar10-train-jpg.tar.gz}" --out "$dir" "$@" ${COMPARE_ARGS:-} \
    > "$dir/run.log" 2>&1 &
  local pid=$! first=USR1
  # At the limit: SIGUSR1 to the run alone (torchext-compare prints its Python stacks to run.log and goes on), TERM
  # 15 s later, KILL 10 s after that. torchrun dies of USR1 and leaves its workers (in sessions of their own) running,
  # so a DDP run gets TERM first, which torchrun passes on to its workers.
  [ "${COMPARE_LAUNCH[0]}" = torchrun ] && first=TERM
  (sleep "$limit" && kill -"$first" "$pid" && sleep 15 && kill -TERM "$pid" && sleep 10 && kill -KILL "$pid") \
    2> /dev/null &
  local watcher=$!
  wait "$pid" || { echo "exit code $?"; status=1; }
  pkill -P "$watcher" 2> /dev/null
  kill "$watcher" 2> /dev/null
  wait "$watcher" 2> /dev/null
  sed -n '/^| final val acc/,/^| peak reserved/p;/GPU-time share/p' "$dir/summary.md" 2> /dev/null
  tar czf "$OUT/cifar10-$name.tar.gz" -C /tmp/torchext-compare "$name"
}
if has compare; then
  COMPARE_LAUNCH=(python -m torchext.compare)
  for run in ${COMPARE_RUNS:-resnet18_cifar_b512 resnet18_cifar_b128 cnn_cifar resnet18_cifar_b512_pool cnn_cifar_pool}; do
    case $run in
      resnet18_cifar_b512) compare_run "$run" 300 --model resnet18_cifar ;;
      resnet18_cifar_b128) compare_run "$run" 590 --model resnet18_cifar --batch-size 128 ;;
      cnn_cifar) compare_run "$run" 480 --model cnn_cifar ;;
      # Every layer torchext's (issue 19): eager, and cnn_cifar under CUDA graphs; 3 seeds each.
      resnet18_cifar_b512_full) compare_run "$run" 590 --model resnet18_cifar --swap-conv ;;
      # The same without the forks (autograd sums the residual inputs' gradients with ATen's add): their host cost.
      resnet18_cifar_b512_full_noforks) compare_run "$run" 590 --model resnet18_cifar --swap-conv --no-forks ;;
      resnet18_cifar_b512_full_nocopies)
        compare_run "$run" 590 --model resnet18_cifar --swap-conv --no-autocast-copies ;;
      cnn_cifar_full) compare_run "$run" 590 --model cnn_cifar --swap-conv ;;
      cnn_cifar_full_graphs) compare_run "$run" 590 --model cnn_cifar --swap-conv --cuda-graphs ;;
      # The fully swapped ResNet-18 against stock under CUDA graphs (both captured) and torch.compile (both compiled,
      # torchext's ops opaque); the compile run takes one seed by default (each seed compiles both models).
      resnet18_cifar_b512_full_graphs) compare_run "$run" 590 --model resnet18_cifar --swap-conv --cuda-graphs ;;
      resnet18_cifar_b512_full_compile)
        compare_run "$run" 590 --model resnet18_cifar --swap-conv --compile --seeds "${COMPILE_SEEDS:-0}"
        ;;
      # Peak memory on torchext's pool: one seed, a few epochs (the peaks are reached in every epoch).
      resnet18_cifar_b512_pool) compare_run "$run" 200 --model resnet18_cifar --allocator pool --seeds 0 --epochs 4 ;;
      cnn_cifar_pool) compare_run "$run" 200 --model cnn_cifar --allocator pool --seeds 0 --epochs 4 ;;
      # Under torch.compile (torchext's one-pass ops as opaque kernels, or decomposed for inductor to fuse) and
      # CUDA graphs (docs/compile.md). COMPARE_ARGS (e.g. "--seeds 0") is appended to every run.
      cnn_cifar_compile) compare_run "$run" 590 --model cnn_cifar --compile ;;
      cnn_cifar_compile_decompose) compare_run "$run" 590 --model cnn_cifar --compile --torchext-compile decompose ;;
      cnn_cifar_graphs) compare_run "$run" 300 --model cnn_cifar --cuda-graphs ;;
      resnet18_cifar_b512_compile) compare_run "$run" 590 --model resnet18_cifar --compile ;;
      resnet18_cifar_b512_compile_decompose)
        compare_run "$run" 590 --model resnet18_cifar --compile --torchext-compile decompose
        ;;
      resnet18_cifar_b512_graphs) compare_run "$run" 300 --model resnet18_cifar --cuda-graphs ;;
      resnet18_cifar_b512_graphs_pool) compare_run "$run" 300 --model resnet18_cifar --cuda-graphs --allocator pool ;;
      *) echo "unknown comparison run $run"; status=1 ;;
    esac
  done
fi
if has ddp; then
  echo "== the 2-GPU NCCL tests, and 2 ranks on one GPU over gloo"
  python -m pytest tests/test_compare.py tests/test_ddp.py -q -p no:cacheprovider -k "nccl or share_one_gpu" -rs \
    > "$OUT/ddp_test.log" 2>&1 \
    || status=1
  tail -3 "$OUT/ddp_test.log"
  COMPARE_LAUNCH=(torchrun --standalone --nproc_per_node=2 -m torchext.compare)
  for run in ${DDP_RUNS:-resnet18_cifar_b512_ddp2_full}; do
    case $run in
      resnet18_cifar_b512_ddp2) compare_run "$run" 400 --model resnet18_cifar ;;
      resnet18_cifar_b512_ddp2_full) compare_run "$run" 500 --model resnet18_cifar --swap-conv ;;
      resnet18_cifar_b512_ddp2_full_1gpu_gloo)
        compare_run "$run" "${DDP_LIMIT_S:-590}" --model resnet18_cifar --swap-conv --dist-backend gloo
        ;;
      *) echo "unknown DDP run $run"; status=1 ;;
    esac
  done
fi
if has notebooks; then
  echo "== notebooks"
  if ! python -c "import nbclient, nbformat, ipykernel" 2> /dev/null; then
    python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "no Jupyter wheels in .whl/ (see the header)"; status=1; }
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  python benchmarks/run_notebooks.py notebooks/*.ipynb --out "$OUT/notebooks" 2>&1 | grep -v "WARNING\|_validate(" || status=1
fi
if has cpp; then
  echo "== torchext from C++"
  if ! command -v cmake > /dev/null; then
    python -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/cmake-site .whl/cmake*.whl \
      && export PATH="/tmp/cmake-site/cmake/data/bin:$PATH" || echo "no cmake, and no cmake wheel in .whl/ (see the header)"
  fi
  if [ -z "${TORCHEXT_GTEST_SOURCE:-}" ] && [ -d .deps/googletest ]; then export TORCHEXT_GTEST_SOURCE=$PWD/.deps/googletest; fi
  if [[ " ${CPP_PARTS:-tests examples} " == *" tests "* ]]; then
    python -m pytest tests/test_cpp.py -q -p no:cacheprovider -rs > "$OUT/cpp_tests.log" 2>&1 || status=1
    grep -E "FAILED|SKIPPED|passed|failed" "$OUT/cpp_tests.log" | tail -5
  fi
  # The toolkit folder for LibTorch's CMake package (FindCUDA guesses wrong where nvcc on PATH is a wrapper script).
  cuda_home=${CUDA_HOME:-$(python -c "import importlib.util as u; s = u.spec_from_file_location('s', 'setup.py'); \
m = u.module_from_spec(s); s.loader.exec_module(m); print(m.find_cuda_home() or '')")}
  prefix=$(python -c "import torch, torchext; print(torch.utils.cmake_prefix_path + ';' + torchext.cmake_prefix_path)")
  generator=(); command -v ninja > /dev/null && generator=(-G Ninja)
  if [[ " ${CPP_PARTS:-tests examples} " != *" examples "* ]]; then
    :
  elif cmake -S examples/cpp -B build/examples "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" ${cuda_home:+-DCUDA_TOOLKIT_ROOT_DIR=$cuda_home} > "$OUT/cpp_examples_build.log" 2>&1 \
      && cmake --build build/examples --parallel "$MAX_JOBS" >> "$OUT/cpp_examples_build.log" 2>&1; then
    bin=/tmp/torchext-cifar10-bin
    python -m torchext.data export-binary "${COMPARE_DATA:-.data/cifar10-train-jpg.tar.gz}" "$bin" > "$OUT/cpp_export.log" 2>&1 \
      || { cat "$OUT/cpp_export.log"; status=1; }
    cat "$bin/split.txt"
    echo "-- train_cifar cnn_cifar, seeds ${CPP_SEEDS:-0,1,2}"
    # shellcheck disable=SC2086
    build/examples/train_cifar --data "$bin" --model cnn_cifar --seeds "${CPP_SEEDS:-0,1,2}" --epochs "${CPP_EPOCHS:-20}" \
      --device "${CPP_DEVICE:-cuda}" --out "$OUT/cpp_train_cnn_cifar.jsonl" ${CPP_TRAIN_ARGS:-} \
      > "$OUT/cpp_train_cnn_cifar.log" 2>&1 || { tail -5 "$OUT/cpp_train_cnn_cifar.log"; status=1; }
    sed -n '/^| cnn_cifar/,$p' "$OUT/cpp_train_cnn_cifar.log"
    echo "-- gemm_bench"
    # shellcheck disable=SC2086
    build/examples/gemm_bench ${CPP_GEMM_ARGS:-} > "$OUT/cpp_gemm.md" 2> "$OUT/cpp_gemm.err" || status=1
    cat "$OUT/cpp_gemm.md"
  else
    grep -E "error|Error" "$OUT/cpp_examples_build.log" | head -20
    status=1
  fi
fi
exit $status

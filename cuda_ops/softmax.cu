// Softmax and log-softmax over the last dimension, forward and backward.
//
// Math (row by row; m = max(x), s = sum(exp(x - m)), subtracting m keeps exp from overflowing):
//   forward      y = exp(x - m) / s                      log: y = (x - m) - log(s)
//   backward     g_x = y * (g - sum(g * y))              log: g_x = g - exp(y) * sum(g)
// Like PyTorch, a row of all -inf, or a row holding +inf or NaN, gives NaN everywhere in that row.
//
// Shapes: x, y, g, g_x are row-major (rows, cols), rows = product of the leading dimensions, cols = last dimension.
// __half and __nv_bfloat16 load and store in their own type and compute in float32; float64 computes in float64.
//
// Paths (SoftmaxPath in softmax.cuh; kAuto picks the first that holds the row):
//   v1 tile      cols <= 32. A block takes a tile of ROWS consecutive rows (one contiguous span of memory), loads it
//                with coalesced element loads into shared memory, row stride padded to an odd number of words so
//                that one-thread-per-row access is bank-conflict free. Each thread copies its row into registers
//                (MAXC = 4..32 slots, compile-time buckets), computes it, writes it back, and the tile is stored
//                coalesced. Blocks are persistent: the next tile's loads are in flight while the current one is
//                computed and stored. Rows of 10 classes waste no lanes and need no vector alignment.
//   v2 warp      cols <= 1024. A group of 8, 16 or 32 lanes per row (narrow groups for short rows, so a warp has
//                several rows' loads in flight), 8..32 elements per lane in registers, 16-byte loads when cols is a
//                multiple of the vector width and the pointers are aligned, shuffle reductions, 128-thread blocks.
//   v3 block     cols <= 32768 (16384 in float64). One block of 128..1024 threads per row, the row in registers
//                (up to 32 elements per thread), block reductions; backward keeps g in registers and, for the
//                largest bucket, y in shared memory (up to 128 KB). One read of each input, one write.
//   v4 two-pass  any cols. One block per row; pass 1 reads the row once keeping a running (max, sum) per thread
//                (rescaled when the max grows), pass 2 reads it again and writes. The second read usually hits L2.
// Every path handles widths that are not a multiple of the vector width (element loads) and misaligned pointers;
// row offsets are 64-bit.
//
// Napkin math (bench/ measures against it): forward moves 2 * rows * cols * sizeof(T) bytes (read x, write y),
// backward 3 * rows * cols * sizeof(T) (read g and y, write g_x). At 2^28 float32 elements that is 2 GiB forward,
// 3 GiB backward: about 0.7 ms and 1.1 ms at the ~3 TB/s an H100 copies device to device. Compute is a few flops
// and one exp per element: far below what the SMs can do, so the goal is copy bandwidth. v4 moves 3 (forward) or
// 5 (backward) element-streams per element when L2 misses the second read.
#include <climits>

#include "common.cuh"
#include "softmax.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kTileMaxCols = 32;
constexpr int kWarpMaxCols = 1024;
constexpr int kWarpBlockThreads = 128;
constexpr int kTwoPassThreads = 512;
constexpr int kTwoPassIlp = 4;  // vectors in flight per thread in the two-pass kernel (half that per input backward)

__device__ __forceinline__ float acc_exp(float v) { return __expf(v); }  // 2 ulp near 0, where it matters
__device__ __forceinline__ double acc_exp(double v) { return exp(v); }
__device__ __forceinline__ float acc_log(float v) { return logf(v); }
__device__ __forceinline__ double acc_log(double v) { return log(v); }

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return A(-INFINITY);
}

// Max and sum over a group of GROUP threads: 8, 16 or 32 lanes of a warp, or the whole block (scratch holds 32
// values).
template <int GROUP, typename A>
__device__ __forceinline__ A group_max(A v, A* scratch) {
  if constexpr (GROUP <= 32) {
    return warp_max(v, GROUP);
  } else {
    return block_max(v, scratch);
  }
}
template <int GROUP, typename A>
__device__ __forceinline__ A group_sum(A v, A* scratch) {
  if constexpr (GROUP <= 32) {
    return warp_sum(v, GROUP);
  } else {
    return block_sum(v, scratch);
  }
}

// The row math on values held in registers, shared by every path. `a` holds the row (x forward, g backward), slots
// past the row end holding -inf forward and 0 backward (they add nothing to the max or the sums); the result
// replaces `a`. The reductions combine the partial values of the threads that share the row.
template <int E, typename A, typename MaxOp, typename SumOp>
__device__ __forceinline__ void forward_regs(A (&a)[E], bool log, MaxOp reduce_max, SumOp reduce_sum) {
  A m = a[0];
#pragma unroll
  for (int i = 1; i < E; ++i) m = max(m, a[i]);
  m = reduce_max(m);
  A s = 0;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const A e = acc_exp(a[i] - m);
    s += e;
    a[i] = log ? a[i] - m : e;
  }
  s = reduce_sum(s);
  if (log) {
    const A ls = acc_log(s);
#pragma unroll
    for (int i = 0; i < E; ++i) a[i] -= ls;
  } else {
    const A inv = A(1) / s;
#pragma unroll
    for (int i = 0; i < E; ++i) a[i] *= inv;
  }
}

// y_at(i) gives the saved output for slot i (0 past the row end).
template <int E, typename A, typename YAt, typename SumOp>
__device__ __forceinline__ void backward_regs(A (&a)[E], YAt y_at, bool log, SumOp reduce_sum) {
  A s = 0;
#pragma unroll
  for (int i = 0; i < E; ++i) s += log ? a[i] : a[i] * y_at(i);
  s = reduce_sum(s);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const A y = y_at(i);
    a[i] = log ? a[i] - acc_exp(y) * s : y * (a[i] - s);
  }
}

inline unsigned grid_cap(int64_t blocks) {
  return static_cast<unsigned>(blocks < INT_MAX ? (blocks > 0 ? blocks : 1) : INT_MAX);
}

// ---------------------------------------------------------------------------------------------------------------
// v1 tile: ROWS rows per block, one thread per row, the tile staged in shared memory in the accumulation type.
// Blocks are persistent and fetch their next tile into registers while they compute and store the current one.
// Two ways to move a tile between global and shared memory (VECIO):
//  - scalar: thread t moves elements t, t + ROWS, ... (at most MAXC of them); element e (row e / cols, column
//    e % cols) sits at e + pad * (e / cols), rows padded to an odd stride so that the per-row reads are free of
//    bank conflicts. div_magic = ceil(2^32 / cols) makes e / cols one __umulhi (exact for e < 2^13, cols <= 32).
//  - vector: 16-byte loads and stores, thread t moving vectors t, t + ROWS, ..., and the tile kept unpadded in
//    shared memory (element e at e). Used for 16- and 32-bit types when every pointer is 16-byte aligned and cols
//    is odd or 2 mod 4, where
//    unpadded per-row reads conflict at most 2 ways (tile starts are 16-byte aligned: ROWS * sizeof(T) is a
//    multiple of 16). Fewer, wider memory instructions and no index division: measured on an H200 at 10 float
//    columns, the scalar form reached 88% of copy bandwidth.

__device__ __forceinline__ int tile_slot(int e, int pad, uint32_t div_magic) {
  return pad ? e + static_cast<int>(__umulhi(static_cast<uint32_t>(e), div_magic)) : e;
}

// A tile in flight, in registers: MAXC scalars per thread, or the vectors (and one tail element) of the vector form.
template <typename T, int ROWS, int MAXC, bool VECIO>
struct TileRegs {
  static constexpr int V = VECIO ? kVec16<T> : 1;
  static constexpr int K = (MAXC + V - 1) / V;
  Vec<T, V> buf[K];
  T tail;

  __device__ __forceinline__ void fetch(const T* __restrict__ src, int n) {
    const int nv = n / V;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = threadIdx.x + k * ROWS;
      if (v < nv) buf[k] = reinterpret_cast<const Vec<T, V>*>(src)[v];
    }
    if (VECIO && static_cast<int>(threadIdx.x) < n - nv * V) tail = src[nv * V + threadIdx.x];
  }

  template <typename A>
  __device__ __forceinline__ void put(A* dst, int n, int pad, uint32_t div_magic) const {
    const int nv = n / V;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = threadIdx.x + k * ROWS;
      if (v < nv) {
#pragma unroll
        for (int j = 0; j < V; ++j) dst[tile_slot(v * V + j, pad, div_magic)] = to_acc(buf[k].v[j]);
      }
    }
    if (VECIO && static_cast<int>(threadIdx.x) < n - nv * V) dst[nv * V + threadIdx.x] = to_acc(tail);
  }
};

// Stores the computed tile (in shared memory, accumulation type) to out.
template <typename T, int ROWS, int MAXC, bool VECIO, typename A>
__device__ __forceinline__ void tile_store(const A* src, T* __restrict__ out, int n, int pad, uint32_t div_magic) {
  constexpr int V = TileRegs<T, ROWS, MAXC, VECIO>::V;
  constexpr int K = TileRegs<T, ROWS, MAXC, VECIO>::K;
  const int nv = n / V;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int v = threadIdx.x + k * ROWS;
    if (v < nv) {
      Vec<T, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = from_acc<T>(src[tile_slot(v * V + j, pad, div_magic)]);
      reinterpret_cast<Vec<T, V>*>(out)[v] = o;
    }
  }
  if (VECIO && static_cast<int>(threadIdx.x) < n - nv * V) out[nv * V + threadIdx.x] = from_acc<T>(src[nv * V + threadIdx.x]);
}

template <typename T, int ROWS, int MAXC, bool BWD, bool VECIO>
__global__ void __launch_bounds__(ROWS)
    softmax_tile_kernel(const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out, int64_t rows,
                        int cols, uint32_t div_magic, bool log) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char tile_smem[];
  const int pad = VECIO ? 0 : (cols & 1) ^ 1;
  const int stride = cols + pad;
  A* t0 = reinterpret_cast<A*>(tile_smem);  // x forward, g backward; then the result
  A* t1 = t0 + ROWS * stride;               // y backward
  const A fill = BWD ? A(0) : neg_inf<A>();
  const int64_t ntiles = (rows + ROWS - 1) / ROWS;
  auto tile_rows = [&](int64_t tile) {
    return static_cast<int>(rows - tile * ROWS < ROWS ? rows - tile * ROWS : ROWS);
  };
  TileRegs<T, ROWS, MAXC, VECIO> b0;                        // the fetched tile of x forward, g backward
  TileRegs<T, ROWS, BWD ? MAXC : 1, VECIO && BWD> b1;  // y backward
  int64_t tile = blockIdx.x;
  if (tile < ntiles) {
    b0.fetch(in0 + tile * ROWS * cols, tile_rows(tile) * cols);
    if constexpr (BWD) b1.fetch(in1 + tile * ROWS * cols, tile_rows(tile) * cols);
  }
  for (; tile < ntiles; tile += gridDim.x) {
    const int nrows = tile_rows(tile);
    const int n = nrows * cols;
    const int64_t base = tile * ROWS * cols;
    b0.put(t0, n, pad, div_magic);
    if constexpr (BWD) b1.put(t1, n, pad, div_magic);
    __syncthreads();
    const int64_t next = tile + gridDim.x;
    if (next < ntiles) {
      b0.fetch(in0 + next * ROWS * cols, tile_rows(next) * cols);
      if constexpr (BWD) b1.fetch(in1 + next * ROWS * cols, tile_rows(next) * cols);
    }
    if (static_cast<int>(threadIdx.x) < nrows) {
      // The row into registers (MAXC slots, a compile-time bound, so every loop unrolls), the math, and back.
      A* p = t0 + threadIdx.x * stride;
      A a[MAXC];
#pragma unroll
      for (int j = 0; j < MAXC; ++j) a[j] = j < cols ? p[j] : fill;
      auto same = [](A v) { return v; };
      if constexpr (!BWD) {
        forward_regs(a, log, same, same);
      } else {
        const A* yp = t1 + threadIdx.x * stride;
        A y[MAXC];
#pragma unroll
        for (int j = 0; j < MAXC; ++j) y[j] = j < cols ? yp[j] : A(0);
        backward_regs(a, [&](int j) { return y[j]; }, log, same);
      }
#pragma unroll
      for (int j = 0; j < MAXC; ++j) {
        if (j < cols) p[j] = a[j];
      }
    }
    __syncthreads();
    tile_store<T, ROWS, MAXC, VECIO>(t0, out + base, n, pad, div_magic);
    __syncthreads();  // the next tile overwrites shared memory
  }
}

template <typename T, int MAXC, bool BWD, bool VECIO>
cudaError_t launch_tile_io(const T* in0, const T* in1, T* out, int64_t rows, int cols, bool log,
                           cudaStream_t stream) {
  using A = acc_t<T>;
  // At most about 34 KB of shared memory per block (cols = 32): 256 float rows forward, fewer otherwise.
  constexpr int kRows = 256 * 4 / static_cast<int>(sizeof(A)) / (BWD ? 2 : 1);
  const int stride = cols + (VECIO ? 0 : (cols & 1) ^ 1);
  const size_t smem = static_cast<size_t>(kRows) * stride * sizeof(A) * (BWD ? 2 : 1);
  const uint32_t div_magic = cols > 1 ? static_cast<uint32_t>(((uint64_t{1} << 32) + cols - 1) / cols) : 0;
  auto kernel = softmax_tile_kernel<T, kRows, MAXC, BWD, VECIO>;
  int per_sm = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kRows, smem);
  if (err != cudaSuccess) return err;
  const int64_t ntiles = (rows + kRows - 1) / kRows;
  const int64_t resident = int64_t{sm_count()} * (per_sm > 0 ? per_sm : 1);
  kernel<<<grid_cap(ntiles < resident ? ntiles : resident), kRows, smem, stream>>>(in0, in1, out, rows, cols, div_magic,
                                                                                   log);
  return cudaGetLastError();
}

template <typename T, int MAXC, bool BWD>
cudaError_t launch_tile_bucket(const T* in0, const T* in1, T* out, int64_t rows, int cols, bool log,
                               cudaStream_t stream) {
  if constexpr (sizeof(T) <= 4) {  // float64 keeps the scalar form: its vector form would spill
    const bool aligned = aligned_to(in0, 16) && aligned_to(out, 16) && (!BWD || aligned_to(in1, 16));
    const bool few_conflicts = (cols % 2 == 1) || (cols % 4 == 2);
    if (aligned && few_conflicts) return launch_tile_io<T, MAXC, BWD, true>(in0, in1, out, rows, cols, log, stream);
  }
  return launch_tile_io<T, MAXC, BWD, false>(in0, in1, out, rows, cols, log, stream);
}

template <typename T, bool BWD>
cudaError_t launch_tile(const T* in0, const T* in1, T* out, int64_t rows, int cols, bool log, cudaStream_t stream) {
  if (cols <= 4) return launch_tile_bucket<T, 4, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 8) return launch_tile_bucket<T, 8, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 12) return launch_tile_bucket<T, 12, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 16) return launch_tile_bucket<T, 16, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 24) return launch_tile_bucket<T, 24, BWD>(in0, in1, out, rows, cols, log, stream);
  return launch_tile_bucket<T, 32, BWD>(in0, in1, out, rows, cols, log, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// v2 warp and v3 block: a GROUP of threads per row (8, 16 or 32 lanes of a warp, or the whole block), the row in
// registers: each thread holds E elements as E / V vectors, vector k of thread `lane` being elements
// (lane + k * GROUP) * V ... + V - 1. V > 1 needs cols % V == 0 (a vector is wholly inside the row or wholly past it)
// and V-aligned pointers. Y_SMEM (backward, largest bucket) keeps y in shared memory instead of registers, in the
// same per-thread layout, so a row twice the register budget still makes one pass over memory.

template <typename T, int THREADS, int GROUP, int E, int V, bool BWD, bool Y_SMEM>
__global__ void __launch_bounds__(THREADS) softmax_rows_kernel(const T* __restrict__ in0, const T* __restrict__ in1,
                                                               T* __restrict__ out, int64_t rows, int cols, bool log) {
  using A = acc_t<T>;
  using Vt = Vec<T, V>;
  constexpr int NV = E / V;
  constexpr int GROUPS = THREADS / GROUP;
  static_assert(!Y_SMEM || (BWD && GROUP == THREADS), "Y_SMEM is for the one-block-per-row backward");
  __shared__ A scratch[GROUP <= 32 ? 1 : 32];
  extern __shared__ __align__(16) unsigned char y_smem_raw[];
  Vt* y_smem = reinterpret_cast<Vt*>(y_smem_raw);
  const int lane = threadIdx.x % GROUP;
  const A fill = BWD ? A(0) : neg_inf<A>();
  auto reduce_max = [&](A v) { return group_max<GROUP>(v, scratch); };
  auto reduce_sum = [&](A v) { return group_sum<GROUP>(v, scratch); };
  // The loop is uniform over the block (shuffles and barriers need every thread); a group past the last row
  // computes on fill values and stores nothing.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * GROUPS; first < rows;
       first += static_cast<int64_t>(gridDim.x) * GROUPS) {
    const int64_t row = first + threadIdx.x / GROUP;
    const int len = row < rows ? cols : 0;
    const int64_t off = row * cols;
    if constexpr (Y_SMEM) {
      // y straight to shared memory first, then a barrier, so that its loads and g's never all wait in registers.
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c = (lane + k * GROUP) * V;
        Vt vb;
        if (c < len) {
          vb = *reinterpret_cast<const Vt*>(in1 + off + c);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) vb.v[j] = from_acc<T>(A(0));
        }
        y_smem[k * THREADS + threadIdx.x] = vb;
      }
      __syncthreads();
    }
    A a[E];                       // x forward, g backward; then the result
    A b[BWD && !Y_SMEM ? E : 1];  // y backward
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = (lane + k * GROUP) * V;
      if (c < len) {
        const Vt va = *reinterpret_cast<const Vt*>(in0 + off + c);
#pragma unroll
        for (int j = 0; j < V; ++j) a[k * V + j] = to_acc(va.v[j]);
        if constexpr (BWD && !Y_SMEM) {
          const Vt vb = *reinterpret_cast<const Vt*>(in1 + off + c);
#pragma unroll
          for (int j = 0; j < V; ++j) b[k * V + j] = to_acc(vb.v[j]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          a[k * V + j] = fill;
          if constexpr (BWD && !Y_SMEM) b[k * V + j] = A(0);
        }
      }
    }
    if constexpr (!BWD) {
      forward_regs(a, log, reduce_max, reduce_sum);
    } else if constexpr (Y_SMEM) {  // each thread reads back the slots it wrote
      backward_regs(
          a, [&](int i) { return to_acc(y_smem[(i / V) * THREADS + threadIdx.x].v[i % V]); }, log, reduce_sum);
    } else {
      backward_regs(a, [&](int i) { return b[i]; }, log, reduce_sum);
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = (lane + k * GROUP) * V;
      if (c < len) {
        Vt vo;
#pragma unroll
        for (int j = 0; j < V; ++j) vo.v[j] = from_acc<T>(a[k * V + j]);
        *reinterpret_cast<Vt*>(out + off + c) = vo;
      }
    }
  }
}

template <typename T, int THREADS, int GROUP, int E, bool BWD, bool Y_SMEM = false>
cudaError_t launch_rows(const T* in0, const T* in1, T* out, int64_t rows, int cols, bool log, cudaStream_t stream) {
  constexpr int V = kVec16<T> < E ? kVec16<T> : E;
  constexpr size_t bytes = V * sizeof(T);
  const bool vec =
      cols % V == 0 && aligned_to(in0, bytes) && aligned_to(out, bytes) && (!BWD || aligned_to(in1, bytes));
  const unsigned grid = grid_cap((rows + THREADS / GROUP - 1) / (THREADS / GROUP));
  const size_t smem = Y_SMEM ? size_t{THREADS} * E * sizeof(T) : 0;
  auto run = [&](auto kernel) {
    if (smem > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (err != cudaSuccess) return err;
    }
    kernel<<<grid, THREADS, smem, stream>>>(in0, in1, out, rows, cols, log);
    return cudaGetLastError();
  };
  if (vec) return run(softmax_rows_kernel<T, THREADS, GROUP, E, V, BWD, Y_SMEM>);
  return run(softmax_rows_kernel<T, THREADS, GROUP, E, 1, BWD, Y_SMEM>);
}

// v2: GROUP lanes x E elements >= cols; groups narrower than a warp for short rows, so that a warp keeps several
// rows' loads in flight.
template <typename T, bool BWD>
cudaError_t launch_warp(const T* in0, const T* in1, T* out, int64_t rows, int cols, bool log, cudaStream_t stream) {
  constexpr int TH = kWarpBlockThreads;
  if (cols <= 64) return launch_rows<T, TH, 8, 8, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 128) return launch_rows<T, TH, 16, 8, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 256) return launch_rows<T, TH, 32, 8, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 512) return launch_rows<T, TH, 32, 16, BWD>(in0, in1, out, rows, cols, log, stream);
  return launch_rows<T, TH, 32, 32, BWD>(in0, in1, out, rows, cols, log, stream);
}

// Elements per thread of the largest v3 bucket: 32 registers of row data per thread at 1024 threads (the most
// __launch_bounds__(1024) leaves room for). Backward holds g there and y in shared memory.
template <typename T>
constexpr int kBlockMaxElems = 32 * 4 / static_cast<int>(sizeof(acc_t<T>));

template <typename T>
constexpr int64_t block_capacity() {
  return int64_t{1024} * kBlockMaxElems<T>;
}

template <typename T, bool BWD>
cudaError_t launch_block(const T* in0, const T* in1, T* out, int64_t rows, int cols, bool log, cudaStream_t stream) {
  // Backward holds both inputs in registers, at half the elements per thread, below the largest bucket.
  constexpr int EF = kBlockMaxElems<T>, EH = EF / 2, EB = BWD ? EH / 2 : EH;
  if (cols <= 128 * EB) return launch_rows<T, 128, 128, EB, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 256 * EB) return launch_rows<T, 256, 256, EB, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 512 * EB) return launch_rows<T, 512, 512, EB, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 1024 * EB) return launch_rows<T, 1024, 1024, EB, BWD>(in0, in1, out, rows, cols, log, stream);
  if (cols <= 1024 * EH) return launch_rows<T, 1024, 1024, EH, BWD>(in0, in1, out, rows, cols, log, stream);
  return launch_rows<T, 1024, 1024, EF, BWD, BWD>(in0, in1, out, rows, cols, log, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// v4 two-pass: one block per row, any width. Forward pass 1 keeps a running (m, s) per thread: when the max grows
// from m to m', s is rescaled by exp(m - m'). -inf elements add 0 explicitly (exp(-inf - -inf) would be NaN while
// the running max is still -inf); a NaN element makes s NaN, as it should.

template <typename A>
__device__ __forceinline__ void online_add(A& m, A& s, const A* v, int n) {
  A cm = v[0];
  for (int j = 1; j < n; ++j) cm = max(cm, v[j]);
  const A mn = max(m, cm);
  s *= (m == mn) ? A(1) : acc_exp(m - mn);
  for (int j = 0; j < n; ++j) s += v[j] == neg_inf<A>() ? A(0) : acc_exp(v[j] - mn);
  m = mn;
}

template <typename T, int V, bool BWD>
__global__ void __launch_bounds__(kTwoPassThreads)
    softmax_two_pass_kernel(const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out, int64_t rows,
                            int64_t cols, bool log) {
  using A = acc_t<T>;
  using Vt = Vec<T, V>;
  constexpr int TH = kTwoPassThreads, U = BWD ? kTwoPassIlp / 2 : kTwoPassIlp;
  __shared__ A scratch[32];
  const int64_t nvec = cols / V;  // the launcher picks V dividing cols
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const Vt* p0 = reinterpret_cast<const Vt*>(in0 + row * cols);
    const Vt* p1 = reinterpret_cast<const Vt*>(in1 + row * cols);  // unused forward
    Vt* po = reinterpret_cast<Vt*>(out + row * cols);
    // U vectors per thread, TH apart, of x (forward) or g and y (backward): both passes read the row this way.
    auto load_chunk = [&](int64_t base, Vt (&va)[U], Vt (&vb)[U]) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t{u} * TH;
        if (i < nvec) {
          va[u] = p0[i];
          if constexpr (BWD) vb[u] = p1[i];
        }
      }
    };

    A m = neg_inf<A>(), s = 0;
    for (int64_t base = threadIdx.x; base < nvec; base += TH * U) {
      Vt va[U], vb[U];
      load_chunk(base, va, vb);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (base + int64_t{u} * TH < nvec) {
          A v[V];
#pragma unroll
          for (int j = 0; j < V; ++j) v[j] = to_acc(va[u].v[j]);
          if constexpr (BWD) {
#pragma unroll
            for (int j = 0; j < V; ++j) s += log ? v[j] : v[j] * to_acc(vb[u].v[j]);
          } else {
            online_add(m, s, v, V);
          }
        }
      }
    }
    if constexpr (!BWD) {
      const A mb = block_max(m, scratch);
      s = (m == mb) ? s : s * acc_exp(m - mb);
      m = mb;
    }
    s = block_sum(s, scratch);
    const A ls = (!BWD && log) ? acc_log(s) : A(0);
    const A inv = A(1) / s;

    for (int64_t base = threadIdx.x; base < nvec; base += TH * U) {
      Vt va[U], vb[U];
      load_chunk(base, va, vb);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t{u} * TH;
        if (i < nvec) {
          Vt vo;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A x = to_acc(va[u].v[j]);
            A r;
            if constexpr (BWD) {
              const A y = to_acc(vb[u].v[j]);
              r = log ? x - acc_exp(y) * s : y * (x - s);
            } else {
              r = log ? (x - m) - ls : acc_exp(x - m) * inv;
            }
            vo.v[j] = from_acc<T>(r);
          }
          po[i] = vo;
        }
      }
    }
  }
}

template <typename T, bool BWD>
cudaError_t launch_two_pass(const T* in0, const T* in1, T* out, int64_t rows, int64_t cols, bool log,
                            cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  const bool vec = cols % V == 0 && aligned_to(in0, 16) && aligned_to(out, 16) && (!BWD || aligned_to(in1, 16));
  const unsigned grid = grid_cap(rows);
  if (vec) {
    softmax_two_pass_kernel<T, V, BWD><<<grid, kTwoPassThreads, 0, stream>>>(in0, in1, out, rows, cols, log);
  } else {
    softmax_two_pass_kernel<T, 1, BWD><<<grid, kTwoPassThreads, 0, stream>>>(in0, in1, out, rows, cols, log);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------------------

template <typename T, bool BWD>
cudaError_t launch(const T* in0, const T* in1, T* out, int64_t rows, int64_t cols, bool log, cudaStream_t stream,
                   SoftmaxPath path) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (path == SoftmaxPath::kAuto) {
    path = cols <= kTileMaxCols          ? SoftmaxPath::kTile
           : cols <= kWarpMaxCols        ? SoftmaxPath::kWarp
           : cols <= block_capacity<T>() ? SoftmaxPath::kBlock
                                         : SoftmaxPath::kTwoPass;
  }
  const int c = static_cast<int>(cols < INT_MAX ? cols : INT_MAX);
  switch (path) {
    case SoftmaxPath::kTile:
      if (cols > kTileMaxCols) return cudaErrorInvalidValue;
      return launch_tile<T, BWD>(in0, in1, out, rows, c, log, stream);
    case SoftmaxPath::kWarp:
      if (cols > kWarpMaxCols) return cudaErrorInvalidValue;
      return launch_warp<T, BWD>(in0, in1, out, rows, c, log, stream);
    case SoftmaxPath::kBlock:
      if (cols > block_capacity<T>()) return cudaErrorInvalidValue;
      return launch_block<T, BWD>(in0, in1, out, rows, c, log, stream);
    default:
      return launch_two_pass<T, BWD>(in0, in1, out, rows, cols, log, stream);
  }
}

}  // namespace

template <typename T>
cudaError_t softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log, cudaStream_t stream,
                            SoftmaxPath path) {
  return launch<T, false>(x, nullptr, y, rows, cols, log, stream, path);
}

template <typename T>
cudaError_t softmax_backward(const T* grad_y, const T* y, T* grad_x, int64_t rows, int64_t cols, bool log,
                             cudaStream_t stream, SoftmaxPath path) {
  return launch<T, true>(grad_y, y, grad_x, rows, cols, log, stream, path);
}

#define TORCHEXT_INSTANTIATE_SOFTMAX(T)                                                                     \
  template cudaError_t softmax_forward<T>(const T*, T*, int64_t, int64_t, bool, cudaStream_t, SoftmaxPath); \
  template cudaError_t softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, bool, cudaStream_t, SoftmaxPath);

TORCHEXT_INSTANTIATE_SOFTMAX(float)
TORCHEXT_INSTANTIATE_SOFTMAX(double)
TORCHEXT_INSTANTIATE_SOFTMAX(__half)
TORCHEXT_INSTANTIATE_SOFTMAX(__nv_bfloat16)

}  // namespace torchext::cuda_ops

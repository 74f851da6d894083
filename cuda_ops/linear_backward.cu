// Linear backward's elementwise half (cuda_ops/matmul.cuh): one pass over grad_out (m, n) that applies the
// activation's derivative and, when asked, reduces the result over the rows into the bias gradient.
//
//   grad_z[i, j]  = grad_out[i, j] * act'(saved[i, j])     saved = y for relu, z for gelu / gelu_tanh / silu
//   grad_bias[j]  = sum_i grad_z[i, j]                      summed as stored (rounded to T), in acc_t<T>
//
// grad_out, saved and grad_z are contiguous (m, n) row-major arrays; grad_z may alias grad_out or saved (every
// element is read and then written by the same thread). The math is apply_activation_backward from
// cuda_ops/matmul_epilogue.cuh, computed in acc_t<T> (float for half types, double for double).
//
// Kernels:
//   linear_backward_epilogue_kernel      2-D grid: blockIdx.x picks a strip of columns, blockIdx.y a chunk of rows.
//                                        A block is (TX, TY) threads; thread (tx, ty) owns VEC adjacent columns
//                                        (one 16-byte vector where n and the pointers allow) and walks the rows
//                                        ty, ty + TY, ... of its chunk, four rows' loads in flight at a time,
//                                        keeping VEC column sums in registers. The block then adds its TY row
//                                        groups in shared memory in a fixed order and writes one partial sum per
//                                        column and chunk to the workspace (or grad_bias itself when there is one
//                                        chunk).
//   linear_bias_grad_finalize_kernel     Adds the chunks' partial sums per column, in a fixed order, and writes
//                                        grad_bias in T.
//   linear_backward_epilogue_map_kernel  No bias gradient: a flat grid-stride map over the m * n elements.
//
// Determinism: the summation order depends on (m, n, T) only -- not on the device, the alignment of the
// pointers (which picks VEC), or timing -- so the bias gradient is the same bits on every run.
//
// Napkin math: bf16 8192 x 4096 with relu reads grad_out and y and writes grad_z, 3 x 64 MiB = 201 MB, ~48 us at
// 4.2 TB/s; the partial sums add 2 x (chunks x n x 4 bytes) = 2 x 2 MiB, ~2%.
#include "common.cuh"
#include "matmul.cuh"
#include "matmul_epilogue.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 256;
// Rows (map: vectors) whose loads each thread issues before using any: 4 for the cheap derivatives; 2 where the
// derivative needs erf / exp / tanh, whose registers would otherwise halve the resident blocks.
template <Activation ACT>
constexpr int kRowsInFlight = ACT == Activation::none || ACT == Activation::relu ? 4 : 2;
constexpr int kRowsPerThreadOne = 16;  // up to this many rows per thread, one chunk: no workspace, one launch
constexpr int64_t kRowsMin = 32;       // fewest rows per chunk: the partial sums stay <= ~2% of the traffic
constexpr int64_t kNominalCols = 256;  // columns per block assumed when sizing the chunks (32 x 8 bf16)
constexpr int64_t kTargetBlocks = 2048;
constexpr int64_t kMaxChunks = 4096;
constexpr int kFinalizeCols = 32, kFinalizeRows = 8;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Row chunks of the general case, a function of (m, n) only, so the workspace size needs no dtype.
int64_t general_chunks(int64_t m, int64_t n) {
  int64_t g = ceil_div(kTargetBlocks * kNominalCols, n);
  g = g < ceil_div(m, kRowsMin) ? g : ceil_div(m, kRowsMin);
  g = g < kMaxChunks ? g : kMaxChunks;
  g = g > 1 ? g : 1;
  return ceil_div(m, ceil_div(m, g));  // no empty chunk
}

struct Plan {
  int tx, ty;
  int64_t chunks, rows_per_chunk;
};

// Block shape from n and T's 16-byte vector width (not from the VEC actually used), chunks from (m, n).
Plan make_plan(int64_t m, int64_t n, int vec16) {
  Plan p;
  const int64_t want = ceil_div(n, vec16);
  p.tx = 1;
  while (p.tx < 32 && p.tx < want) p.tx *= 2;
  p.ty = kThreads / p.tx;
  p.chunks = m <= static_cast<int64_t>(kRowsPerThreadOne) * p.ty ? 1 : general_chunks(m, n);
  p.rows_per_chunk = ceil_div(m, p.chunks);
  return p;
}

template <typename T, Activation ACT>
__device__ __forceinline__ acc_t<T> grad_z_at(T g, T s) {
  return apply_activation_backward(to_acc(g), ACT == Activation::none ? acc_t<T>(0) : to_acc(s), ACT);
}

template <typename T, int VEC, Activation ACT>
__global__ void __launch_bounds__(kThreads)
    linear_backward_epilogue_kernel(const T* grad_out, const T* saved, T* grad_z, int64_t m, int64_t n,
                                    int64_t rows_per_chunk, acc_t<T>* __restrict__ partials, T* grad_bias) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A red[kThreads * VEC];
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * TX + tx;  // this thread's vector of columns
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t row_end = row0 + rows_per_chunk < m ? row0 + rows_per_chunk : m;

  A acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = A(0);

  if (v < n / VEC) {
    const int64_t col = v * VEC;
#pragma unroll 1
    for (int64_t i = row0 + ty; i < row_end; i += static_cast<int64_t>(kRowsInFlight<ACT>) * TY) {
      V g[kRowsInFlight<ACT>], s[kRowsInFlight<ACT>];
#pragma unroll
      for (int u = 0; u < kRowsInFlight<ACT>; ++u) {
        const int64_t r = i + static_cast<int64_t>(u) * TY;
        if (r < row_end) {
          g[u] = *reinterpret_cast<const V*>(grad_out + r * n + col);
          if constexpr (ACT != Activation::none) s[u] = *reinterpret_cast<const V*>(saved + r * n + col);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight<ACT>; ++u) {
        const int64_t r = i + static_cast<int64_t>(u) * TY;
        if (r < row_end) {
          V o;
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            o.v[k] = from_acc<T>(grad_z_at<T, ACT>(g[u].v[k], s[u].v[k]));
            acc[k] += to_acc(o.v[k]);
          }
          if (grad_z != nullptr) *reinterpret_cast<V*>(grad_z + r * n + col) = o;
        }
      }
    }
  }

  // The block's TY row groups, added per column in the order ty = 0, 1, ...
  const int cols = TX * VEC;
#pragma unroll
  for (int k = 0; k < VEC; ++k) red[ty * cols + tx * VEC + k] = acc[k];
  __syncthreads();
  const int t = ty * TX + tx;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * cols + t;
  if (t < cols && j < n) {
    A sum = A(0);
    for (int y = 0; y < TY; ++y) sum += red[y * cols + t];
    if (gridDim.y == 1) {
      grad_bias[j] = from_acc<T>(sum);
    } else {
      partials[static_cast<int64_t>(blockIdx.y) * n + j] = sum;
    }
  }
}

// grad_bias[j] = sum over chunks c of partials[c, j]: row group ry adds the chunks ry, ry + 8, ... in order, then
// the 8 groups are added in order.
template <typename T>
__global__ void __launch_bounds__(kFinalizeCols* kFinalizeRows)
    linear_bias_grad_finalize_kernel(const acc_t<T>* __restrict__ partials, int64_t chunks, int64_t n,
                                     T* __restrict__ grad_bias) {
  using A = acc_t<T>;
  __shared__ A red[kFinalizeRows][kFinalizeCols];
  const int cx = threadIdx.x, ry = threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kFinalizeCols + cx;
  A sum = A(0);
  if (j < n) {
#pragma unroll 4
    for (int64_t c = ry; c < chunks; c += kFinalizeRows) sum += partials[c * n + j];
  }
  red[ry][cx] = sum;
  __syncthreads();
  if (ry == 0 && j < n) {
    A total = A(0);
#pragma unroll
    for (int y = 0; y < kFinalizeRows; ++y) total += red[y][cx];
    grad_bias[j] = from_acc<T>(total);
  }
}

// grad_z over `total` elements as one flat array: VEC-wide vectors, then the last total % VEC elements.
template <typename T, int VEC, Activation ACT>
__global__ void __launch_bounds__(kThreads)
    linear_backward_epilogue_map_kernel(const T* grad_out, const T* saved, T* grad_z, int64_t total) {
  using V = Vec<T, VEC>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = total / VEC;
#pragma unroll 1
  for (int64_t v = tid; v < nvec; v += kRowsInFlight<ACT> * stride) {
    V g[kRowsInFlight<ACT>], s[kRowsInFlight<ACT>];
#pragma unroll
    for (int u = 0; u < kRowsInFlight<ACT>; ++u) {
      const int64_t w = v + u * stride;
      if (w < nvec) {
        g[u] = reinterpret_cast<const V*>(grad_out)[w];
        if constexpr (ACT != Activation::none) s[u] = reinterpret_cast<const V*>(saved)[w];
      }
    }
#pragma unroll
    for (int u = 0; u < kRowsInFlight<ACT>; ++u) {
      const int64_t w = v + u * stride;
      if (w < nvec) {
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] = from_acc<T>(grad_z_at<T, ACT>(g[u].v[k], s[u].v[k]));
        reinterpret_cast<V*>(grad_z)[w] = o;
      }
    }
  }
  for (int64_t i = nvec * VEC + tid; i < total; i += stride) {
    grad_z[i] = from_acc<T>(grad_z_at<T, ACT>(grad_out[i], ACT == Activation::none ? grad_out[i] : saved[i]));
  }
}

// The widest VEC (16 bytes down to one element) that every used pointer's alignment and, for the 2-D kernel, the
// row length allow.
template <typename T>
int pick_vec(int64_t n, bool rows, const T* grad_out, const T* saved, const T* grad_z) {
  for (int vec = kVec16<T>; vec > 1; vec /= 2) {
    const size_t bytes = static_cast<size_t>(vec) * sizeof(T);
    if (rows && n % vec != 0) continue;
    if (!aligned_to(grad_out, bytes)) continue;
    if (saved != nullptr && !aligned_to(saved, bytes)) continue;
    if (grad_z != nullptr && !aligned_to(grad_z, bytes)) continue;
    return vec;
  }
  return 1;
}

template <typename T, int VEC, Activation ACT>
void launch_rows(const T* grad_out, const T* saved, T* grad_z, T* grad_bias, int64_t m, int64_t n, const Plan& p,
                 acc_t<T>* partials, cudaStream_t stream) {
  const dim3 block(p.tx, p.ty);
  const dim3 grid(static_cast<unsigned>(ceil_div(n / VEC, p.tx)), static_cast<unsigned>(p.chunks));
  linear_backward_epilogue_kernel<T, VEC, ACT>
      <<<grid, block, 0, stream>>>(grad_out, saved, grad_z, m, n, p.rows_per_chunk, partials, grad_bias);
}

template <typename T, int VEC, Activation ACT>
void launch_map(const T* grad_out, const T* saved, T* grad_z, int64_t total, cudaStream_t stream) {
  const unsigned grid = resident_grid<linear_backward_epilogue_map_kernel<T, VEC, ACT>>(
      kThreads, total / VEC + 1, static_cast<int64_t>(kThreads) * kRowsInFlight<ACT>);
  linear_backward_epilogue_map_kernel<T, VEC, ACT><<<grid, kThreads, 0, stream>>>(grad_out, saved, grad_z, total);
}

// Runs the kernel for the VEC chosen at run time: one instantiation per power of two up to 16 bytes.
template <typename T, Activation ACT, int VEC = kVec16<T>>
void launch_vec(int vec, const T* grad_out, const T* saved, T* grad_z, T* grad_bias, int64_t m, int64_t n,
                const Plan* plan, acc_t<T>* partials, cudaStream_t stream) {
  if constexpr (VEC > 1) {
    if (vec < VEC) {
      launch_vec<T, ACT, VEC / 2>(vec, grad_out, saved, grad_z, grad_bias, m, n, plan, partials, stream);
      return;
    }
  }
  if (plan != nullptr) {
    launch_rows<T, VEC, ACT>(grad_out, saved, grad_z, grad_bias, m, n, *plan, partials, stream);
  } else {
    launch_map<T, VEC, ACT>(grad_out, saved, grad_z, m * n, stream);
  }
}

template <typename T, Activation ACT>
cudaError_t launch_all(const T* grad_out, const T* saved, T* grad_z, T* grad_bias, int64_t m, int64_t n,
                       void* workspace, cudaStream_t stream) {
  using A = acc_t<T>;
  if (grad_bias == nullptr) {
    const int vec = pick_vec<T>(n, false, grad_out, saved, grad_z);
    launch_vec<T, ACT>(vec, grad_out, saved, grad_z, nullptr, m, n, nullptr, nullptr, stream);
    return cudaGetLastError();
  }
  const Plan plan = make_plan(m, n, kVec16<T>);
  A* partials = static_cast<A*>(workspace);
  if (plan.chunks > 1 && partials == nullptr) return cudaErrorInvalidValue;
  const int vec = pick_vec<T>(n, true, grad_out, saved, grad_z);
  launch_vec<T, ACT>(vec, grad_out, saved, grad_z, grad_bias, m, n, &plan, partials, stream);
  if (plan.chunks > 1) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const dim3 block(kFinalizeCols, kFinalizeRows);
    linear_bias_grad_finalize_kernel<T>
        <<<static_cast<unsigned>(ceil_div(n, kFinalizeCols)), block, 0, stream>>>(partials, plan.chunks, n, grad_bias);
  }
  return cudaGetLastError();
}

}  // namespace

size_t linear_backward_epilogue_workspace_bytes(int64_t m, int64_t n) {
  if (m <= 0 || n <= 0) return 0;
  const int64_t chunks = general_chunks(m, n);
  // Sized for the widest accumulation type (double), so one answer serves every dtype.
  return chunks > 1 ? static_cast<size_t>(chunks * n) * sizeof(double) : 0;
}

template <typename T>
cudaError_t linear_backward_epilogue(const T* grad_out, const T* saved, T* grad_z, T* grad_bias, int64_t m, int64_t n,
                                     Activation act, void* workspace, cudaStream_t stream) {
  if (m < 0 || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (m == 0) {
    return grad_bias != nullptr ? cudaMemsetAsync(grad_bias, 0, static_cast<size_t>(n) * sizeof(T), stream)
                                : cudaSuccess;
  }
  if (grad_out == nullptr) return cudaErrorInvalidValue;
  if (act != Activation::none && (saved == nullptr || grad_z == nullptr)) return cudaErrorInvalidValue;
  if (act == Activation::none && (grad_z == grad_out || grad_z == nullptr)) {
    grad_z = nullptr;  // grad_z is grad_out: nothing to write
    if (grad_bias == nullptr) return cudaSuccess;
  }
  switch (act) {
    case Activation::relu:
      return launch_all<T, Activation::relu>(grad_out, saved, grad_z, grad_bias, m, n, workspace, stream);
    case Activation::gelu:
      return launch_all<T, Activation::gelu>(grad_out, saved, grad_z, grad_bias, m, n, workspace, stream);
    case Activation::gelu_tanh:
      return launch_all<T, Activation::gelu_tanh>(grad_out, saved, grad_z, grad_bias, m, n, workspace, stream);
    case Activation::silu:
      return launch_all<T, Activation::silu>(grad_out, saved, grad_z, grad_bias, m, n, workspace, stream);
    case Activation::none:
      return launch_all<T, Activation::none>(grad_out, nullptr, grad_z, grad_bias, m, n, workspace, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

#define TORCHEXT_INSTANTIATE_LINEAR_BACKWARD(T)                                                                     \
  template cudaError_t linear_backward_epilogue<T>(const T*, const T*, T*, T*, int64_t, int64_t, Activation, void*, \
                                                   cudaStream_t);
TORCHEXT_INSTANTIATE_LINEAR_BACKWARD(float)
TORCHEXT_INSTANTIATE_LINEAR_BACKWARD(double)
TORCHEXT_INSTANTIATE_LINEAR_BACKWARD(__half)
TORCHEXT_INSTANTIATE_LINEAR_BACKWARD(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_LINEAR_BACKWARD

}  // namespace torchext::cuda_ops

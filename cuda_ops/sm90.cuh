// Hopper (sm_90a) PTX wrappers shared by the wgmma kernels of the GEMM engine (cuda_ops/matmul_wgmma.cu) and of the
// convolution (cuda_ops/conv2d_wgmma.cu): mbarriers, TMA tile copies both ways, stmatrix (the epilogues' staging),
// the shared-memory matrix descriptor of a 128-byte-swizzled operand, wgmma's fence / commit / wait, the
// generic-to-async proxy fence; on the host, the driver's tensor-map encoder. The device functions exist only in the
// sm_90a image (TORCHEXT_WGMMA_DEVICE); elsewhere the kernels that use them compile to empty bodies.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TORCHEXT_WGMMA_DEVICE 1
#endif

// wgmma's accumulators in inline PTX: the register list "{%0, ..., %R-1}" and the operand list "+f"(d[0]), ...,
// "+f"(d[R-1]) for R = 32, 64, 96 or 128 float registers (m64nNk16 with N = 2 R); the A and B descriptors follow as
// operands %R and %R+1.
#define TORCHEXT_WGMMA_REGS_0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TORCHEXT_WGMMA_REGS_32 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TORCHEXT_WGMMA_REGS_64 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define TORCHEXT_WGMMA_REGS_96 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "  \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TORCHEXT_WGMMA_D_REGS_32 "{" TORCHEXT_WGMMA_REGS_0 "}"
#define TORCHEXT_WGMMA_D_REGS_64 "{" TORCHEXT_WGMMA_REGS_0 ", " TORCHEXT_WGMMA_REGS_32 "}"
#define TORCHEXT_WGMMA_D_REGS_96 "{" TORCHEXT_WGMMA_REGS_0 ", " TORCHEXT_WGMMA_REGS_32 ", " TORCHEXT_WGMMA_REGS_64 "}"
#define TORCHEXT_WGMMA_D_REGS_128 \
  "{" TORCHEXT_WGMMA_REGS_0 ", " TORCHEXT_WGMMA_REGS_32 ", " TORCHEXT_WGMMA_REGS_64 ", " TORCHEXT_WGMMA_REGS_96 "}"
#define TORCHEXT_WGMMA_F8(d, i)                                                                                     \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define TORCHEXT_WGMMA_F32(d, i) \
  TORCHEXT_WGMMA_F8(d, i), TORCHEXT_WGMMA_F8(d, i + 8), TORCHEXT_WGMMA_F8(d, i + 16), TORCHEXT_WGMMA_F8(d, i + 24)
#define TORCHEXT_WGMMA_D_OPERANDS_32(d) TORCHEXT_WGMMA_F32(d, 0)
#define TORCHEXT_WGMMA_D_OPERANDS_64(d) TORCHEXT_WGMMA_F32(d, 0), TORCHEXT_WGMMA_F32(d, 32)
#define TORCHEXT_WGMMA_D_OPERANDS_96(d) TORCHEXT_WGMMA_F32(d, 0), TORCHEXT_WGMMA_F32(d, 32), TORCHEXT_WGMMA_F32(d, 64)
#define TORCHEXT_WGMMA_D_OPERANDS_128(d) \
  TORCHEXT_WGMMA_F32(d, 0), TORCHEXT_WGMMA_F32(d, 32), TORCHEXT_WGMMA_F32(d, 64), TORCHEXT_WGMMA_F32(d, 96)

namespace torchext::cuda_ops::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(TORCHEXT_WGMMA_DEVICE)

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Arrive once and announce `bytes` of copies that will complete on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until the phase with the given parity has completed. A fresh barrier counts its (virtual) previous
// phase, parity 1, as complete, so a producer's first wait on an "empty" barrier returns at once.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
}

// TMA tile copies global -> shared, completing the box's bytes on `bar` (the whole box, the part outside the tensor
// zero-filled). Coordinates are in elements, innermost first, and may be negative.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// TMA tile copies shared -> global (the copy engine clips what lies outside the tensor), in this thread's bulk group;
// the buffer must hold the box in the map's swizzled layout.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until this thread's bulk stores have finished reading shared memory (the buffer may then be rewritten).
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// Waits until they are complete (written to global memory).
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// stmatrix: four 8 x 8 matrices of 16-bit values, each register of each lane holding its piece in the mma
// fragment layout (row lane / 4, columns 2 (lane % 4) and + 1), which is wgmma's accumulator layout; lane l gives
// the address of row l % 8 of matrix l / 8 (a 32-bit shared address: a generic pointer made the compiler emit
// 64-bit ST.E with 64-bit address arithmetic).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// Makes this thread's ordinary shared-memory writes visible to the copy engine.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Shared-memory matrix descriptor for a 128-byte-swizzled operand (PTX ISA, "Matrix Descriptor Format"):
// start address, leading-dimension byte offset, stride-dimension byte offset, all >> 4; swizzle mode 1 = 128B.
//   K-major:     rows of 128 bytes along k; 8-row groups `sbo` = 1024 bytes apart; lbo unused.
//   M/N-major:   rows of 128 bytes (64 values along m or n) per k; 8-k-row groups `sbo` = 1024 apart; 64-wide
//                groups along m or n `lbo` apart.
// The low word (address, lbo) changes with the stage and k-step; the high word (sbo, swizzle) is a constant.
__device__ __forceinline__ uint32_t smem_desc_lo(uint32_t addr, uint32_t lbo) {
  return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16);
}
constexpr uint32_t smem_desc_hi(uint32_t sbo) { return ((sbo >> 4) & 0x3FFF) | (1u << 30); }
__device__ __forceinline__ uint64_t smem_desc(uint32_t lo, uint32_t hi) { return (uint64_t(hi) << 32) | lo; }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

#endif  // TORCHEXT_WGMMA_DEVICE

// The driver's cuTensorMapEncodeTiled (null where the driver has none), looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 driver_encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      ptr = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// cuTensorMapEncodeTiled's arguments as one key (ranks up to 5, unused entries zero).
struct TensorMapKey {
  uint64_t w[17] = {};  // dtype and rank, address, flags, dims[5], box and element strides[5], strides[4]
  bool operator==(const TensorMapKey& o) const {
    for (int i = 0; i < 17; ++i) {
      if (w[i] != o.w[i]) return false;
    }
    return true;
  }
};

// cuTensorMapEncodeTiled, memoized per host thread. A map is a pure function of its arguments (the address, sizes,
// strides and box; not the memory's contents), and PyTorch's caching allocator hands a training step the same
// addresses step after step, so from the second step on the maps come from the cache: a key compare instead of a
// driver call per map (two or more per convolution pass, eight for a stride-2 input gradient). A direct-mapped
// table of 1024 entries (a colliding key replaces the entry); only successful encodes are kept.
inline CUresult CUDAAPI encode_tiled_cached(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank,
                                            void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                            const cuuint32_t* box, const cuuint32_t* elem_strides,
                                            CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                            CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = driver_encode_tiled();
  if (encode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (rank < 1 || rank > 5) {
    return encode(map, dtype, rank, address, dims, strides, box, elem_strides, interleave, swizzle, l2, oob);
  }
  TensorMapKey key;
  const auto u64 = [](auto v) { return static_cast<uint64_t>(v); };
  key.w[0] = (u64(dtype) << 32) | rank;
  key.w[1] = reinterpret_cast<uint64_t>(address);
  key.w[2] = (u64(interleave) << 48) | (u64(swizzle) << 32) | (u64(l2) << 16) | u64(oob);
  for (cuuint32_t i = 0; i < rank; ++i) {
    key.w[3 + i] = dims[i];
    key.w[8 + i] = (uint64_t{box[i]} << 32) | elem_strides[i];
    if (i + 1 < rank) key.w[13 + i] = strides[i];
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  for (uint64_t word : key.w) h = (h ^ word) * 1099511628211ull;
  struct Entry {
    bool used = false;
    TensorMapKey key;
    CUtensorMap map;
  };
  constexpr size_t kEntries = 1024;
  thread_local std::unique_ptr<Entry[]> table(new Entry[kEntries]);
  Entry& e = table[(h ^ (h >> 29)) % kEntries];
  if (e.used && e.key == key) {
    *map = e.map;
    return CUDA_SUCCESS;
  }
  const CUresult r = encode(map, dtype, rank, address, dims, strides, box, elem_strides, interleave, swizzle, l2, oob);
  if (r == CUDA_SUCCESS) {
    e.used = true;
    e.key = key;
    e.map = *map;
  }
  return r;
}

// The tensor-map encoder the kernels use: the memoized one above, or null where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_fn() {
  return driver_encode_tiled() != nullptr ? &encode_tiled_cached : nullptr;
}

template <typename T>
CUtensorMapDataType tma_dtype() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // float is loaded as TFLOAT32: the copy engine rounds each value to tf32 (to nearest) on its way to shared
  // memory. Loaded as FLOAT32, the tensor cores would truncate instead, with measured errors 2.6x cuBLAS's.
  return CU_TENSOR_MAP_DATA_TYPE_TFLOAT32;
}

}  // namespace torchext::cuda_ops::sm90

#include "common.cuh"

namespace torchext::cuda_ops {

int sm_count() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxDevices) return 132;
  if (cached[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) return 132;
    cached[device] = n;  // benign race: every thread writes the same value
  }
  return cached[device];
}

int compute_capability() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device < kMaxDevices && cached[device] != 0) return cached[device];
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return 0;
  }
  if (device < kMaxDevices) cached[device] = 10 * major + minor;  // benign race: every thread writes the same value
  return 10 * major + minor;
}

int smem_optin() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device < kMaxDevices && cached[device] != 0) return cached[device];
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return 0;
  if (device < kMaxDevices) cached[device] = bytes;  // benign race: every thread writes the same value
  return bytes;
}

}  // namespace torchext::cuda_ops

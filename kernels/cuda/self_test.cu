// Device-side checks the GPU tests need that no kernel exposes: the fast fp8 decode path.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace mla::cuda {
namespace {

__global__ void e4m3_table_kernel(float* out) {
  const int i = threadIdx.x;  // 128 threads, two encodings each (as the kernels decode them)
  const float2 f = e4m3x2_to_float2(static_cast<uint16_t>((2 * i) | ((2 * i + 1) << 8)));
  out[2 * i] = f.x;
  out[2 * i + 1] = f.y;
}

}  // namespace

int e4m3_table_on_device(float* host_out) {
  float* d = nullptr;
  cudaError_t e = cudaMalloc(&d, 256 * sizeof(float));
  if (e != cudaSuccess) return static_cast<int>(e);
  e4m3_table_kernel<<<1, 128>>>(d);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(host_out, d, 256 * sizeof(float), cudaMemcpyDeviceToHost);
  (void)cudaFree(d);
  return static_cast<int>(e);
}

}  // namespace mla::cuda

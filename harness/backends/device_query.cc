#include "harness/backends/device_query.h"

#include "core/json_fields.h"

#if MLAFUZZ_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mlafuzz {
namespace {

[[maybe_unused]] std::string version_text(int v) {
  // CUDA encodes versions as 1000 * major + 10 * minor.
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// The device query's child process (plan.cc) writes this object and its parent reads it back.
const fields::Table<DeviceInfo>& device_info_fields() {
  using fields::field;
  static const fields::Table<DeviceInfo> t = {
      field("count", &DeviceInfo::count),   field("names", &DeviceInfo::names),
      field("driver", &DeviceInfo::driver), field("runtime", &DeviceInfo::runtime),
      field("error", &DeviceInfo::error),
  };
  return t;
}

}  // namespace

DeviceInfo query_devices() {
  DeviceInfo d;
#if MLAFUZZ_HAVE_CUDA
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) d.driver = version_text(v);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess && v > 0) d.runtime = version_text(v);
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    d.error = cudaGetErrorString(e);
    (void)cudaGetLastError();
    return d;
  }
  d.count = n;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    d.names.push_back(cudaGetDeviceProperties(&p, i) == cudaSuccess ? p.name : "unknown");
  }
#else
  d.error = "built without CUDA";
#endif
  return d;
}

std::optional<std::string> sticky_device_error() {
#if MLAFUZZ_HAVE_CUDA
  // A sticky error is returned by every later call; a plain launch error is cleared by
  // cudaGetLastError and the synchronize then succeeds.
  (void)cudaGetLastError();
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
#endif
  return std::nullopt;
}

std::string device_info_to_json(const DeviceInfo& d) {
  return fields::write(d, device_info_fields()).dump() + "\n";
}

DeviceInfo device_info_from_json(const std::string& text) {
  DeviceInfo d;
  fields::read(fields::Json::parse(text), d, device_info_fields(), {.path = "device query"});
  return d;
}

}  // namespace mlafuzz

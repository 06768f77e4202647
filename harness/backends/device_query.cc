#include "harness/backends/device_query.h"

#include <nlohmann/json.hpp>

#if MLAFUZZ_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mlafuzz {
namespace {

[[maybe_unused]] std::string version_text(int v) {
  // CUDA encodes versions as 1000 * major + 10 * minor.
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
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
  nlohmann::ordered_json j;
  j["count"] = d.count;
  j["names"] = d.names;
  j["driver"] = d.driver;
  j["runtime"] = d.runtime;
  j["error"] = d.error;
  return j.dump() + "\n";
}

DeviceInfo device_info_from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text);
  DeviceInfo d;
  d.count = j.at("count").get<int>();
  d.names = j.at("names").get<std::vector<std::string>>();
  d.driver = j.at("driver").get<std::string>();
  d.runtime = j.at("runtime").get<std::string>();
  d.error = j.at("error").get<std::string>();
  return d;
}

}  // namespace mlafuzz

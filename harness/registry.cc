// The backend registry: the only translation unit that knows every backend. CUDA backends come
// from factories declared in a plain C++ header, so no CUDA header is included here.
#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "harness/backend.h"
#include "harness/plugin_backend.h"
#include "kernels/host/host_models.h"
#include "oracle/oracle.h"
#if MLAFUZZ_HAVE_CUDA
#include "kernels/cuda/cuda_backends.h"
#endif

namespace mlafuzz {
namespace {

// Stands in for a backend that this build cannot provide, so list-backends can say why.
class UnavailableBackend final : public Backend {
 public:
  UnavailableBackend(std::string name, Precision p, std::string reason)
      : name_(std::move(name)), precision_(p), reason_(std::move(reason)) {}
  std::string name() const override { return name_; }
  Precision precision() const override { return precision_; }
  Availability availability() const override { return {false, reason_}; }
  bool on_device() const override { return true; }
  RunResult run(const MaterializedCase&) override {
    RunResult r;
    r.status = RunStatus::kError;
    r.message = name_ + " is not available: " + reason_;
    return r;
  }

 private:
  std::string name_;
  Precision precision_;
  std::string reason_;
};

std::vector<BackendInfo> make_table() {
  std::vector<BackendInfo> t;
  t.push_back({"oracle", "CPU float64 oracle (Eigen: gathered K, all heads as one product)",
               [] { return make_oracle_backend(); }});
  t.push_back({"oracle-loop", "CPU float64 oracle written as plain loops from the formulas",
               [] { return make_oracle_loop_backend(); }});
  t.push_back({"cpu-simt", "host model of the SIMT kernel's fp32 pipeline",
               [] { return make_cpu_simt_backend(); }});
  t.push_back({"cpu-mma", "host model of the MMA kernel's bf16/fp32 pipeline (BLOCK_H 32)",
               [] { return make_cpu_mma_backend(); }});
#if MLAFUZZ_HAVE_CUDA
  t.push_back({"cuda-simt", "CUDA SIMT per-head kernel (fp32)",
               [] { return make_cuda_simt_backend(); }});
  t.push_back({"cuda-mma", "CUDA tensor-core head-tiled kernel (mma.sync bf16, BLOCK_H 32)",
               [] { return make_cuda_mma_backend(32); }});
  t.push_back({"cuda-mma-h64", "CUDA tensor-core head-tiled kernel, BLOCK_H 64",
               [] { return make_cuda_mma_backend(64); }});
#else
  const std::string why = "built without nvcc (CUDA kernels not compiled)";
  t.push_back({"cuda-simt", "CUDA SIMT per-head kernel (fp32)", [why] {
                 return std::make_unique<UnavailableBackend>("cuda-simt", Precision::kSimtFp32,
                                                             why);
               }});
  t.push_back({"cuda-mma", "CUDA tensor-core head-tiled kernel (mma.sync bf16, BLOCK_H 32)",
               [why] {
                 return std::make_unique<UnavailableBackend>("cuda-mma", Precision::kMmaBf16,
                                                             why);
               }});
  t.push_back({"cuda-mma-h64", "CUDA tensor-core head-tiled kernel, BLOCK_H 64", [why] {
                 return std::make_unique<UnavailableBackend>("cuda-mma-h64", Precision::kMmaBf16,
                                                             why);
               }});
#endif
  return t;
}

}  // namespace

const std::vector<BackendInfo>& builtin_backends() {
  static const std::vector<BackendInfo> table = make_table();
  return table;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name.rfind(kPluginPrefix, 0) == 0) {
    // "plugin:/path/lib.so", or "plugin:<name>" (harness/plugin_backend.h, resolve_plugin).
    return load_plugin_backend(resolve_plugin(name.substr(std::strlen(kPluginPrefix))));
  }
  for (const auto& info : builtin_backends()) {
    if (info.name == name) return info.make();
  }
  std::ostringstream msg;
  msg << "unknown backend '" << name << "'; known backends:";
  for (const auto& info : builtin_backends()) msg << ' ' << info.name;
  throw std::runtime_error(msg.str());
}

std::vector<std::string> parse_backend_list(const std::string& list) {
  std::vector<std::string> names;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (item == "all" || item == "available") {
      for (const auto& info : builtin_backends()) {
        if (info.make()->availability().available) names.push_back(info.name);
      }
    } else {
      names.push_back(item);
    }
  }
  if (names.empty()) throw std::runtime_error("empty backend list '" + list + "'");
  return names;
}

}  // namespace mlafuzz

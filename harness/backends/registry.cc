// The backend registry: the only translation unit that knows every backend. CUDA backends come
// from factories declared in plain C++ headers, so no CUDA header is included here.
#include "harness/backends/registry.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "harness/backends/plugin_backend.h"
#include "harness/backends/python_backend.h"
#include "kernels/host/host_models.h"
#include "mla/mutants.h"
#include "oracle/oracle.h"
#if MLAFUZZ_HAVE_CUDA
#include "kernels/cuda/cuda_backends.h"
#endif
#if MLAFUZZ_HAVE_HOST_MUTANTS
#include "kernels/host/host_mutants.h"
#endif
#if MLAFUZZ_HAVE_CUDA_MUTANTS
#include "kernels/cuda/cuda_mutants.h"
#endif

namespace mlafuzz {
namespace {

#if !MLAFUZZ_HAVE_CUDA
// Stands in for a backend that this build cannot provide, so list-backends can say why.
class UnavailableBackend final : public TraitsBackend<Backend> {
 public:
  UnavailableBackend(std::string name, Precision p, std::string partner, std::string reason) {
    traits_.name = std::move(name);
    traits_.precision = p;
    traits_.availability = {false, std::move(reason)};
    traits_.on_device = true;
    traits_.needs_worker = true;
    traits_.simt_partner = std::move(partner);
  }
  RunResult run_case(const MaterializedCase&) override {
    RunResult r;
    r.status = RunStatus::kError;
    r.message = traits_.name + " is not available: " + traits_.availability.reason;
    return r;
  }
};
#endif

// The oracles and the host models of the kernels.
void add_host_backends(std::vector<BackendSpec>& t) {
  t.push_back({"oracle", "CPU float64 oracle (Eigen: gathered K, all heads as one product)", false,
               [] { return make_oracle_backend(); }});
  t.push_back({"oracle-loop", "CPU float64 oracle written as plain loops from the formulas", false,
               [] { return make_oracle_loop_backend(); }});
  t.push_back({"cpu-simt", "host model of the SIMT kernel's fp32 pipeline", false,
               [] { return make_cpu_simt_backend(); }});
  t.push_back({"cpu-mma", "host model of the MMA kernel's bf16/fp32 pipeline (BLOCK_H 32)", false,
               [] { return make_cpu_mma_backend(); }});
  t.push_back({"cpu-mma-small",
               "host model of the sm_120-sized MMA configuration (32-token tiles, BLOCK_H 32)",
               false, [] { return make_cpu_mma_small_backend(); }});
  t.push_back({"cpu-mma-lse-merged",
               "host model of an LSE-merged production decode: main and extra lists alone in the "
               "MMA pipeline, each stored bf16, merged by LSE (SGLang's Triton path)",
               false, [] { return make_cpu_mma_lse_merged_backend(); }});
  // The split-KV pipeline: 1 split, the automatic rule, one split per tile.
  t.push_back({"cpu-mma-split1", "host model of the split-KV MMA pipeline, 1 split per row", false,
               [] { return make_cpu_mma_split_backend(1); }});
  t.push_back({"cpu-mma-split",
               "host model of the split-KV MMA pipeline, automatic split count (132 SMs)", false,
               [] { return make_cpu_mma_split_backend(0); }});
  t.push_back({"cpu-mma-split-max", "host model of the split-KV MMA pipeline, 1 split per tile",
               false, [] { return make_cpu_mma_split_backend(-1); }});
}

// The CUDA kernels, or stand-ins that say why they are missing in a build without nvcc.
void add_cuda_backends(std::vector<BackendSpec>& t) {
  const std::string simt = "CUDA SIMT per-head kernel (fp32)";
  const std::string mma =
      "CUDA tensor-core head-tiled kernel (mma.sync bf16, BLOCK_H 32; runs the 97.25 KiB "
      "cuda-mma-small configuration where the device's shared memory is below 157.5 KiB, e.g. "
      "sm_120)";
  const std::string h64 = "CUDA tensor-core head-tiled kernel, BLOCK_H 64";
  const std::string small =
      "CUDA tensor-core head-tiled kernel, sm_120-sized: 32-token tiles, BLOCK_H 32, 8 warps, "
      "97.25 KiB of shared memory";
  const std::string split1 = "CUDA split-KV MMA kernel + combine, 1 split per row (BLOCK_H 32)";
  const std::string split_auto =
      "CUDA split-KV MMA kernel + combine, automatic split count (row and SM count only)";
  const std::string split_max = "CUDA split-KV MMA kernel + combine, 1 split per tile";
#if MLAFUZZ_HAVE_CUDA
  t.push_back({"cuda-simt", simt, false, [] { return make_cuda_simt_backend(); }});
  t.push_back({"cuda-mma", mma, false, [] { return make_cuda_mma_backend(32); }});
  t.push_back({"cuda-mma-h64", h64, false, [] { return make_cuda_mma_backend(64); }});
  t.push_back({"cuda-mma-small", small, false, [] { return make_cuda_mma_small_backend(); }});
  t.push_back({"cuda-mma-split1", split1, false, [] { return make_cuda_mma_split_backend(1); }});
  t.push_back({"cuda-mma-split", split_auto, false, [] { return make_cuda_mma_split_backend(0); }});
  t.push_back(
      {"cuda-mma-split-max", split_max, false, [] { return make_cuda_mma_split_backend(-1); }});
#else
  const auto unavailable = [](const char* name, Precision p, const char* partner) {
    return [=] {
      return std::make_unique<UnavailableBackend>(name, p, partner,
                                                  "built without nvcc (CUDA kernels not compiled)");
    };
  };
  t.push_back({"cuda-simt", simt, false, unavailable("cuda-simt", Precision::kSimtFp32, "")});
  t.push_back({"cuda-mma", mma, false, unavailable("cuda-mma", Precision::kMmaBf16, "cuda-simt")});
  t.push_back(
      {"cuda-mma-h64", h64, false, unavailable("cuda-mma-h64", Precision::kMmaBf16, "cuda-simt")});
  t.push_back({"cuda-mma-small", small, false,
               unavailable("cuda-mma-small", Precision::kMmaBf16, "cuda-simt")});
  t.push_back({"cuda-mma-split1", split1, false,
               unavailable("cuda-mma-split1", Precision::kMmaBf16, "cuda-simt")});
  t.push_back({"cuda-mma-split", split_auto, false,
               unavailable("cuda-mma-split", Precision::kMmaBf16, "cuda-simt")});
  t.push_back({"cuda-mma-split-max", split_max, false,
               unavailable("cuda-mma-split-max", Precision::kMmaBf16, "cuda-simt")});
#endif
}

void add_triton_backends(std::vector<BackendSpec>& t) {
  // The story's kernels in Triton (kernels/triton, python: backends under short names; they
  // need python3 with torch, triton and a GPU, and say which is missing otherwise).
  t.push_back({"triton-simt", "Triton SIMT per-head kernel (fp32; kernels/triton/triton_simt.py)",
               false,
               [] {
                 return make_shipped_python_backend("triton-simt", "triton_simt.py", "decode",
                                                    Precision::kSimtFp32, "");
               },
               /*isolates_itself=*/true});
  t.push_back({"triton-mma",
               "Triton head-tiled kernel (tl.dot bf16, BLOCK_H 64; kernels/triton/triton_mma.py)",
               false,
               [] {
                 return make_shipped_python_backend("triton-mma", "triton_mma.py", "decode",
                                                    Precision::kMmaBf16, "triton-simt");
               },
               /*isolates_itself=*/true});
}

std::vector<BackendSpec> make_table() {
  std::vector<BackendSpec> t;
  add_host_backends(t);
  add_cuda_backends(t);
  add_triton_backends(t);
  return t;
}

// The python: kernels shipped under short names (kernels/triton): alias -> file and declared
// precision and SIMT partner, for the planted-bug variants and declared_python_mutants.
struct ShippedKernel {
  const char* alias;
  const char* file;
  Precision precision;
  const char* partner;
};
constexpr ShippedKernel kShipped[] = {
    {"triton-simt", "triton_simt.py", Precision::kSimtFp32, ""},
    {"triton-mma", "triton_mma.py", Precision::kMmaBf16, "triton-simt"},
};

const ShippedKernel* shipped_kernel(const std::string& alias) {
  for (const ShippedKernel& k : kShipped) {
    if (alias == k.alias) return &k;
  }
  return nullptr;
}

// "triton-mma~<mutant>": a planted bug of a shipped kernel, declared as any python: kernel's
// (its module's MUTANTS and mutant_<name> functions); the worker resolves "decode~<mutant>" and
// refuses an unknown mutant, listing the declared ones, when the backend is made.
BackendSpec resolve_shipped_mutant(const std::string& name, const ShippedKernel& k,
                                   const std::string& mutant) {
  return {name, "planted bug '" + mutant + "' in " + k.alias, false,
          [name, k, mutant] {
            return make_shipped_python_backend(name, k.file, "decode~" + mutant, k.precision,
                                               k.partner, /*strict=*/true);
          },
          /*isolates_itself=*/true};
}

std::string known_names() {
  std::string s;
  for (const auto& spec : builtin_backends()) s += " " + spec.name;
  s +=
      " plugin:<path or name> python:<file.py or module>:<function>[~<mutant>] triton-mma~<mutant>";
  for (const auto& n : mutant_backend_names(true)) s += " " + n;
  return s;
}

// "<base>~<mutant>": the planted-bug variants of the MMA host model and CUDA kernel.
BackendSpec resolve_mutant(const std::string& name, const std::string& base,
                           const std::string& mutant_text) {
  mla::Mutant mutant = mla::Mutant::kNone;
  for (int i = 1; i < static_cast<int>(mla::Mutant::kCount); ++i) {
    const auto m = static_cast<mla::Mutant>(i);
    if (mutant_text == mla::mutant_name(m)) mutant = m;
  }
  const std::vector<std::string> known = mutant_backend_names(true);
  if (mutant == mla::Mutant::kNone || std::find(known.begin(), known.end(), name) == known.end()) {
    std::string list;
    for (const auto& n : known) list += " " + n;
    if (base != "cpu-mma" && base != "cuda-mma") {
      throw std::runtime_error("backend '" + name +
                               "': planted-bug variants exist only for cpu-mma and cuda-mma");
    }
    if (known.empty()) {
      throw std::runtime_error("backend '" + name +
                               "': this build has no planted-bug variants (configure with "
                               "-DMLAFUZZ_MUTANTS=ON)");
    }
    throw std::runtime_error("unknown mutant in backend '" + name + "'; known:" + list);
  }
  BackendSpec spec{name, std::string("planted bug '") + mutant_text + "' in " + base, false, {}};
#if MLAFUZZ_HAVE_CUDA_MUTANTS
  if (base == "cuda-mma") spec.make = [mutant] { return make_cuda_mma_mutant_backend(mutant); };
#endif
#if MLAFUZZ_HAVE_HOST_MUTANTS
  if (base == "cpu-mma") spec.make = [mutant] { return make_cpu_mma_mutant_backend(mutant); };
#endif
  return spec;
}

}  // namespace

const std::vector<BackendSpec>& builtin_backends() {
  static const std::vector<BackendSpec> table = make_table();
  return table;
}

std::vector<std::string> mutant_backend_names(bool gpu) {
  std::vector<std::string> out;
  for (int i = 1; i < static_cast<int>(mla::Mutant::kCount); ++i) {
    const auto m = static_cast<mla::Mutant>(i);
#if MLAFUZZ_HAVE_HOST_MUTANTS
    if (host_mutant_supported(m)) out.push_back(std::string("cpu-mma~") + mla::mutant_name(m));
#endif
#if MLAFUZZ_HAVE_CUDA_MUTANTS
    if (gpu) out.push_back(std::string("cuda-mma~") + mla::mutant_name(m));
#endif
    (void)m;
  }
  (void)gpu;
  return out;
}

std::string absolute_backend_name(const std::string& name) {
  const auto absolute = [](const std::string& path) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::absolute(path, ec);
    return ec ? path : p.lexically_normal().string();
  };
  if (name.rfind(kPluginPrefix, 0) == 0) {
    const std::string target = name.substr(std::strlen(kPluginPrefix));
    // A declared name has no slash: it resolves through the loaded plugins and the search path.
    if (target.find('/') == std::string::npos) return name;
    return kPluginPrefix + absolute(target);
  }
  if (name.rfind(kPythonPrefix, 0) == 0) {
    const std::string spec = name.substr(std::strlen(kPythonPrefix));
    const size_t colon = spec.rfind(':');
    if (colon == std::string::npos) return name;
    const std::string target = spec.substr(0, colon);
    const bool file = target.size() > 3 && target.compare(target.size() - 3, 3, ".py") == 0;
    if (!file && target.find('/') == std::string::npos) return name;  // package.module
    return kPythonPrefix + absolute(target) + spec.substr(colon);
  }
  return name;
}

std::vector<std::pair<std::string, std::string>> declared_python_mutants(
    const std::string& backend) {
  std::string spec = backend;
  if (const ShippedKernel* k = shipped_kernel(backend)) {
    const std::string dir = shipped_python_kernel_dir("triton", k->file);
    if (dir.empty()) {
      throw std::runtime_error(backend + ": kernel file " + k->file +
                               " not found (looked in $MLAFUZZ_TRITON_DIR, "
                               "<executable>/../share/mlafuzz/triton and kernels/triton)");
    }
    spec = std::string(kPythonPrefix) + dir + "/" + k->file + ":decode";
  } else if (backend.rfind(kPythonPrefix, 0) != 0) {
    throw std::runtime_error("backend '" + backend +
                             "' is not a python: kernel (planted bugs of python: kernels and of "
                             "triton-mma/triton-simt are declared in their module's MUTANTS; the "
                             "built-in catalogue runs without --backends)");
  }
  const size_t colon = spec.rfind(':');
  if (colon != std::string::npos && spec.find('~', colon) != std::string::npos) {
    throw std::runtime_error("backend '" + backend +
                             "' already names a planted bug: give the kernel without ~<mutant> "
                             "(and --only to pick mutants)");
  }
  return describe_python_backend(spec).mutants;
}

BackendSpec resolve_backend(const std::string& name) {
  if (name.rfind(kPluginPrefix, 0) == 0) {
    // "plugin:/path/lib.so", or "plugin:<name>" (plugin_backend.h, resolve_plugin). Resolving
    // finds the library; only make() loads it.
    const std::string path = resolve_plugin(name.substr(std::strlen(kPluginPrefix)));
    return {name, "plugin " + path, true, [path] { return load_plugin_backend(path); }};
  }
  if (name.rfind(kPythonPrefix, 0) == 0) {
    // Isolated already: the kernel runs in its own Python worker process
    // (harness/backends/python_backend.h).
    return {name, "Python kernel " + name, false, [name] { return make_python_backend(name); },
            true};
  }
  if (const auto tilde = name.find('~'); tilde != std::string::npos) {
    if (const ShippedKernel* k = shipped_kernel(name.substr(0, tilde))) {
      return resolve_shipped_mutant(name, *k, name.substr(tilde + 1));
    }
    return resolve_mutant(name, name.substr(0, tilde), name.substr(tilde + 1));
  }
  for (const auto& spec : builtin_backends()) {
    if (spec.name == name) return spec;
  }
  throw std::runtime_error("unknown backend '" + name + "'; known backends:" + known_names());
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  return resolve_backend(name).make();
}

std::vector<std::string> parse_backend_list(const std::string& list) {
  std::vector<std::string> names;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (item == "all" || item == "available") {
      for (const auto& spec : builtin_backends()) {
        if (spec.make()->traits().availability.available) names.push_back(spec.name);
      }
    } else {
      (void)resolve_backend(item);  // throws for unknown names before anything runs
      names.push_back(item);
    }
  }
  if (names.empty()) throw std::runtime_error("empty backend list '" + list + "'");
  return names;
}

}  // namespace mlafuzz

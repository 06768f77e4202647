#include "harness/campaign/backend_lookup.h"

#include <stdexcept>

#include "kernels/common/mutants.h"
#if MLAFUZZ_HAVE_HOST_MUTANTS
#include "kernels/host/host_mutants.h"
#endif
#if MLAFUZZ_HAVE_CUDA_MUTANTS
#include "kernels/cuda/cuda_mutants.h"
#endif

namespace mlafuzz::campaign {

std::vector<std::string> campaign_mutant_names() {
  std::vector<std::string> out;
#if MLAFUZZ_HAVE_HOST_MUTANTS
  for (int i = 1; i < static_cast<int>(mla::Mutant::kCount); ++i) {
    const auto m = static_cast<mla::Mutant>(i);
    if (host_mutant_supported(m)) out.push_back(std::string("cpu-mma~") + mla::mutant_name(m));
  }
#endif
  return out;
}

std::unique_ptr<Backend> make_campaign_backend(const std::string& name) {
  const auto tilde = name.find('~');
  if (tilde == std::string::npos) return make_backend(name);
  const std::string base = name.substr(0, tilde), mutant = name.substr(tilde + 1);
#if MLAFUZZ_HAVE_CUDA_MUTANTS
  // "cuda-mma~<mutant>": the MMA kernel's variants (mlafuzz mutants --backend-kind gpu).
  if (base == "cuda-mma") {
    for (int i = 1; i < static_cast<int>(mla::Mutant::kCount); ++i) {
      const auto m = static_cast<mla::Mutant>(i);
      if (mutant == mla::mutant_name(m)) return make_cuda_mma_mutant_backend(m);
    }
    throw std::runtime_error("unknown mutant in backend '" + name + "'");
  }
#endif
  if (base != "cpu-mma") {
    throw std::runtime_error("backend '" + name + "': planted-bug variants exist only for cpu-mma");
  }
#if MLAFUZZ_HAVE_HOST_MUTANTS
  for (int i = 1; i < static_cast<int>(mla::Mutant::kCount); ++i) {
    const auto m = static_cast<mla::Mutant>(i);
    if (mutant == mla::mutant_name(m)) {
      auto b = make_cpu_mma_mutant_backend(m);
      if (!b) throw std::runtime_error("backend '" + name + "': no host model of this mutant");
      return b;
    }
  }
  std::string known;
  for (const auto& n : campaign_mutant_names()) known += " " + n;
  throw std::runtime_error("unknown mutant in backend '" + name + "'; known:" + known);
#else
  throw std::runtime_error("backend '" + name +
                           "': this build has no planted-bug variants (configure with "
                           "-DMLAFUZZ_MUTANTS=ON)");
#endif
}

std::vector<std::string> parse_campaign_backends(const std::string& list) {
  std::vector<std::string> names = parse_backend_list(list);
  for (const auto& n : names) {
    if (n.find('~') != std::string::npos) (void)make_campaign_backend(n);
  }
  return names;
}

}  // namespace mlafuzz::campaign

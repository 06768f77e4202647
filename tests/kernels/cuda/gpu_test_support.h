// Helpers of the GPU tests of the CUDA kernels (tests/kernels/cuda/*_test.cc): the device skip,
// the bound of a kernel's pipeline against the float64 oracle, the bound check with its
// tightness, the host model of each CUDA backend, and where the corpus is.
//
// MLAFUZZ_GPU_CASES=n lowers the number of random recipes (compute-sanitizer runs use a few).
// MLAFUZZ_CORPUS_DIR names the corpus folder when the tree sits elsewhere (the GPU machine).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/case.h"
#include "core/compare.h"
#include "core/materialize.h"
#include "harness/backends/registry.h"
#include "kernels/cuda/cuda_backends.h"
#include "kernels/cuda/launch.h"
#include "mla/fp_formats.h"
#include "mla/tiling.h"
#include "oracle/oracle.h"
#include "properties/generate.h"
#include "properties/properties.h"
#include "properties/tolerance.h"
#include "tests/core/build_paths.h"
#include "tests/kernels/host/host_test_support.h"

// Skips the test when no CUDA device is there (every GPU test starts with it).
#define SKIP_WITHOUT_DEVICE()                                                 \
  do {                                                                        \
    const Availability a_ = make_cuda_mma_backend(32)->traits().availability; \
    if (!a_.available) GTEST_SKIP() << "no GPU: " << a_.reason;               \
  } while (0)

namespace mlafuzz::testing {

inline constexpr uint64_t kSeed = 0x6a7e5eedull;

inline int random_cases(int dflt) {
  const char* env = std::getenv("MLAFUZZ_GPU_CASES");
  return env != nullptr ? std::max(1, std::atoi(env)) : dflt;
}

// A kernel against the oracle: the tolerance model's bound for the kernel's pipeline
// (properties/tolerance.h: MMA with u_acc = 2u, tensor cores may truncate when they accumulate).
inline Bounds kernel_bound(const MaterializedCase& m, const OracleResult& ref, bool mma) {
  return compute_bounds(m, ref, pipeline_for(mma ? Precision::kMmaBf16 : Precision::kSimtFp32));
}
// The backend's own pipeline (pipeline_of: its token tile too, 32 for cuda-mma-small and for
// cuda-mma where the device runs the small configuration).
inline Bounds kernel_bound(const MaterializedCase& m, const OracleResult& ref, const Backend& be) {
  return compute_bounds(m, ref, pipeline_of(be));
}

struct Tightness {
  double out = 0, lse = 0;
};

// Checks r (bf16 outputs) against reference values under the bound: every element within its
// bound (rounding intervals; `ref_bf16`: the reference is a bf16 output too), +inf/-inf/NaN
// positions identical, rows without a valid token exact. Returns the tightness.
inline Tightness check_within(const MaterializedCase& m, const RunResult& r,
                              const std::vector<double>& ref_out,
                              const std::vector<double>& ref_lse, const Bounds& bd, bool ref_bf16,
                              const std::string& what) {
  EXPECT_EQ(r.guard_violations, 0) << what;
  const BoundCheck c = check_bounds(Side{&r.out, &r.lse, true}, Side{&ref_out, &ref_lse, ref_bf16},
                                    bd, m.query_rows(), m.heads, m.d_v());
  if (!c.passed) ADD_FAILURE() << what << ": " << c.describe();
  return Tightness{c.out_tightness, c.lse_tightness};
}

inline std::string host_model_of(const std::string& cuda_name) {
  if (cuda_name == "cuda-simt") return "cpu-simt";
  // The split-KV kernels: the host model of the same split setting (the automatic rule there
  // assumes 132 SMs, the H200's; another device may split otherwise, still within the bound).
  if (cuda_name.rfind("cuda-mma-split", 0) == 0) return "cpu" + cuda_name.substr(4);
  // The sm_120-sized configuration, and cuda-mma where this device runs it (32-token tiles).
  if (cuda_name == "cuda-mma-small") return "cpu-mma-small";
  if (cuda_name == "cuda-mma" && mla::cuda::mma_token_tile(32) == mla::kMmaSmallTokenTile) {
    return "cpu-mma-small";
  }
  return "cpu-mma";
}

// The corpus folder: MLAFUZZ_CORPUS_DIR, else a corpus/cases above the executable (the tree
// carried to the GPU machine), else the source tree's.
inline std::filesystem::path corpus_dir() {
  if (const char* env = std::getenv("MLAFUZZ_CORPUS_DIR")) return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (std::filesystem::path p = exe.parent_path(); !p.empty() && p != p.root_path();
         p = p.parent_path()) {
      if (std::filesystem::is_directory(p / "corpus" / "cases")) return p / "corpus" / "cases";
    }
  }
  return std::filesystem::path(mlafuzz::build_paths::kSourceDir) / "corpus" / "cases";
}

}  // namespace mlafuzz::testing

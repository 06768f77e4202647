// The corpus on the CUDA kernels: every case within the bound of the oracle and of the host
// model, and the production and extra-cache cases supported. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include "tests/kernels/cuda/gpu_test_support.h"

namespace mlafuzz {
namespace {

namespace fs = std::filesystem;
using testing::check_within;
using testing::corpus_dir;
using testing::host_model_of;
using testing::kernel_bound;

TEST(CudaCorpus, EveryCaseWithinBoundOfOracle) {
  SKIP_WITHOUT_DEVICE();
  const fs::path dir = corpus_dir();
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  if (files.empty()) GTEST_SKIP() << "no corpus cases under " << dir;
  std::sort(files.begin(), files.end());
  int ran = 0, unsupported = 0;
  for (const auto& f : files) {
    MaterializedCase m;
    try {
      m = materialize(load_case(f.string()));
    } catch (const std::exception& e) {
      ADD_FAILURE() << f << ": " << e.what();
      continue;
    }
    for (const char* name :
         {"cuda-simt", "cuda-mma", "cuda-mma-h64", "cuda-mma-small", "cuda-mma-split-max"}) {
      const auto be = make_backend(name);
      const RunResult r = be->run(m);
      if (r.status == RunStatus::kUnsupported) {
        ++unsupported;
        continue;
      }
      ASSERT_TRUE(r.ok()) << f << " " << name << ": " << r.message;
      const OracleResult ref = run_oracle_eigen(m);
      const Bounds bd = kernel_bound(m, ref, *be);
      check_within(m, r, ref.out, ref.lse, bd, false, f.filename().string() + " " + name);
      const RunResult hr = make_backend(host_model_of(name))->run(m);
      if (hr.ok()) {
        check_within(m, r, hr.out, hr.lse, add_bounds(bd, bd), true,
                     f.filename().string() + " " + name + " vs host model");
      }
      ++ran;
    }
  }
  std::printf("[corpus] %zu cases from %s: %d kernel runs, %d unsupported\n", files.size(),
              dir.string().c_str(), ran, unsupported);
}

// The production corpus cases run on the CUDA kernels (not "not applicable").
TEST(CudaProductionCorpus, ProductionAndExtraCasesAreSupported) {
  SKIP_WITHOUT_DEVICE();
  const fs::path dir = corpus_dir();
  int checked = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (e.path().extension() != ".json") continue;
    if (f.find("production") == std::string::npos && f.find("extra") == std::string::npos) continue;
    const MaterializedCase m = materialize(load_case(e.path().string()));
    for (const char* name : {"cuda-simt", "cuda-mma", "cuda-mma-h64", "cuda-mma-small"}) {
      const auto why = make_backend(name)->unsupported(m);
      EXPECT_FALSE(why) << f << " " << name << ": " << *why;
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no production/extra corpus cases under " << dir;
}

}  // namespace
}  // namespace mlafuzz

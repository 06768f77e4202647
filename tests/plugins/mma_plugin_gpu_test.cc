// The example device plugin (examples/mma_plugin) on a GPU: it loads, declares the MMA pipeline,
// and gives bit for bit what the built-in cuda-mma backend gives on generated cases (both run the
// same kernel; only the staging through the plugin ABI differs). Waived without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/backend.h"
#include "core/materialize.h"
#include "harness/backends/plugin_backend.h"
#include "harness/backends/registry.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

// The build's absolute path, or MLAFUZZ_MMA_PLUGIN where the build folder has moved (the GPU
// machine runs a copy of the tree at another path).
std::string mma_plugin_path() {
  const char* env = std::getenv("MLAFUZZ_MMA_PLUGIN");
  return env != nullptr ? env : mlafuzz::build_paths::kMmaPlugin;
}

TEST(MmaPluginGpu, SameBitsAsTheBuiltInKernel) {
  const auto plugin = load_plugin_backend(mma_plugin_path());
  EXPECT_EQ(plugin->traits().name, "plugin:mma-kernel-example");
  EXPECT_EQ(plugin->traits().precision, Precision::kMmaBf16);
  if (const Availability a = plugin->traits().availability; !a.available) {
    GTEST_SKIP() << "waived: " << a.reason;
  }
  const auto builtin = make_backend("cuda-mma");
  GenConfig cfg;
  int compared = 0;
  for (uint64_t i = 0; i < 60; ++i) {
    const MaterializedCase m = materialize(generate_case(/*seed=*/66, i, cfg, nullptr));
    const RunResult a = plugin->run(m), b = builtin->run(m);
    ASSERT_EQ(a.status, b.status) << "case " << i << ": " << a.message << " | " << b.message;
    if (!a.ok()) continue;
    EXPECT_EQ(a.out_raw, b.out_raw) << "case " << i;
    ASSERT_EQ(a.lse_raw.size(), b.lse_raw.size());
    for (size_t k = 0; k < a.lse_raw.size(); ++k) {
      ASSERT_EQ(mla::float_to_bits(a.lse_raw[k]), mla::float_to_bits(b.lse_raw[k]))
          << "case " << i << " lse element " << k;
    }
    EXPECT_EQ(a.guard_violations, 0);
    ++compared;
  }
  EXPECT_GT(compared, 40);
}

TEST(MmaPluginGpu, PassesEveryProperty) {
  const auto plugin = load_plugin_backend(mma_plugin_path());
  if (const Availability a = plugin->traits().availability; !a.available) {
    GTEST_SKIP() << "waived: " << a.reason;
  }
  std::vector<Backend*> backends{plugin.get()};
  GenConfig cfg;
  for (uint64_t i = 0; i < 30; ++i) {
    const CaseEvaluation ev = evaluate_case(generate_case(67, i, cfg, nullptr), backends, {});
    for (const PropertyOutcome* o : ev.failures())
      ADD_FAILURE() << "case " << i << ": " << format_outcome(*o);
  }
}

}  // namespace
}  // namespace mlafuzz

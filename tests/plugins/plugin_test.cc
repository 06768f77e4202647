// Plugins: the example CPU plugin loads and passes every property on generated cases; broken
// plugins give clear errors. Plugin paths come from CMake (tests/core/build_paths.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/compare.h"
#include "core/materialize.h"
#include "harness/backends/plugin_backend.h"
#include "harness/backends/registry.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

const std::string kCpuPlugin = mlafuzz::build_paths::kCpuPlugin;

std::string faulty(const char* kind) {
  return std::string(mlafuzz::build_paths::kFaultyPluginDir) + "/libfaulty_" + kind + ".so";
}

// The message of the PluginError that loading `path` throws ("" if it loads).
std::string load_error(const std::string& path) {
  try {
    load_plugin_backend(path);
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

// A small explicit case: MODEL1 448 + 64, page size 5, two rows (one with -1 entries).
Case small_case() {
  Case c;
  c.geom.page_size = 5;
  c.geom.num_pages = 4;
  c.batch = 2;
  c.heads = 3;
  c.topk = 6;
  c.indices = {{0, 7, 13, -1, 19, 2}, {-1, -1, 4, 5, 6, 18}};
  c.sink = std::vector<double>{0.5, -1.0, 2.0};
  c.data_seed = 17;
  return c;
}

TEST(PluginLoad, CpuPluginDeclaresItself) {
  const PluginDescription d = describe_plugin(kCpuPlugin);
  EXPECT_EQ(d.name, "cpu-fp32-example");
  EXPECT_EQ(d.abi_version, MLAFUZZ_PLUGIN_ABI_VERSION);
  EXPECT_FALSE(d.traits.on_device);
  EXPECT_TRUE(d.traits.needs_worker);
  EXPECT_EQ(d.traits.name, "plugin:cpu-fp32-example");
  EXPECT_EQ(d.traits.precision, Precision::kSimtFp32);
  EXPECT_TRUE(d.has_supports);
  const auto b = load_plugin_backend(kCpuPlugin);
  EXPECT_EQ(b->traits().name, "plugin:cpu-fp32-example");
  EXPECT_TRUE(b->traits().availability.available);
  EXPECT_EQ(b->traits(), d.traits);  // the backend says what the description says
  // A host plugin says so, and as foreign code it still asks for a worker process.
  EXPECT_FALSE(b->traits().on_device);
  EXPECT_TRUE(b->traits().needs_worker);
  EXPECT_TRUE(resolve_backend(std::string("plugin:") + kCpuPlugin).foreign);
}

TEST(PluginLoad, RegistryResolvesPathAndLoadedName) {
  const auto by_path = make_backend(std::string(kPluginPrefix) + kCpuPlugin);
  EXPECT_EQ(by_path->traits().name, "plugin:cpu-fp32-example");
  EXPECT_EQ(loaded_plugin_path("plugin:cpu-fp32-example"), kCpuPlugin);
  const auto by_name = make_backend("plugin:cpu-fp32-example");
  EXPECT_EQ(by_name->traits().name, "plugin:cpu-fp32-example");
}

TEST(PluginLoad, DeclaredNamesResolveThroughThePluginPath) {
  // Reports and corpus entries name a plugin by what it declares; a fresh process finds it
  // through MLAFUZZ_PLUGIN_PATH. faulty-8 (the hanging plugin) is never loaded before here.
  EXPECT_EQ(loaded_plugin_path("plugin:faulty-8"), "");
  ASSERT_EQ(
      setenv("MLAFUZZ_PLUGIN_PATH",
             ("/nonexistent:" + std::string(mlafuzz::build_paths::kFaultyPluginDir)).c_str(), 1),
      0);
  EXPECT_EQ(make_backend("plugin:faulty-8")->traits().name, "plugin:faulty-8");
  EXPECT_EQ(resolve_plugin("faulty-8"), faulty("hang"));
  try {
    make_backend("plugin:no-such-plugin");
    ADD_FAILURE() << "an unknown plugin name must not load";
  } catch (const PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("no plugin of that name is loaded or found in "
                                         "MLAFUZZ_PLUGIN_PATH"),
              std::string::npos)
        << e.what();
  }
  unsetenv("MLAFUZZ_PLUGIN_PATH");
}

TEST(PluginLoad, CpuPluginMatchesTheOracleOnAnExplicitCase) {
  const MaterializedCase m = materialize(small_case());
  const auto plugin = load_plugin_backend(kCpuPlugin);
  const RunResult r = plugin->run(m);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.guard_violations, 0);
  const RunResult ref = make_backend("oracle")->run(m);
  ASSERT_TRUE(ref.ok()) << ref.message;
  const Comparison cmp = compare_results(r, ref, m.batch, m.heads, m.d_v());
  EXPECT_TRUE(cmp.passed()) << cmp.metrics_lines();
  EXPECT_GT(cmp.out.max_ref, 0) << "an all-zero reference would make this a vacuous pass";
  EXPECT_EQ(cmp.out.compared, int64_t{2} * 3 * m.d_v());
}

TEST(PluginLoad, CpuPluginPassesEveryPropertyOnGeneratedCases) {
  const auto plugin = load_plugin_backend(kCpuPlugin);
  std::vector<Backend*> backends{plugin.get()};
  GenConfig cfg;
  cfg.max_batch = 4;
  cfg.max_heads = 8;
  cfg.max_topk = 160;  // (generators.cc draws range(101, max_topk): keep it above 101)
  cfg.production_probability = 0;
  int failures = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    const Case c = generate_case(/*seed=*/6, i, cfg, nullptr);
    const CaseEvaluation ev = evaluate_case(c, backends, {});
    for (const PropertyOutcome* o : ev.failures()) {
      ADD_FAILURE() << "case " << i << ": " << format_outcome(*o);
      ++failures;
    }
    if (failures > 3) break;
  }
}

TEST(PluginLoad, WrongKernelFailsTolerance) {
  const auto plugin = load_plugin_backend(faulty("zeros"));
  std::vector<Backend*> backends{plugin.get()};
  const CaseEvaluation ev = evaluate_case(small_case(), backends, {"tolerance"});
  ASSERT_FALSE(ev.failures().empty());
  EXPECT_EQ(ev.failures().front()->property, "tolerance");
  EXPECT_EQ(ev.failures().front()->backend, "plugin:faulty-6");
}

TEST(PluginErrors, NonExistentPath) {
  const std::string e = load_error("/nonexistent/libnothing.so");
  EXPECT_EQ(e, "plugin /nonexistent/libnothing.so: cannot open: No such file or directory");
  EXPECT_THROW(make_backend("plugin:/nonexistent/libnothing.so"), PluginError);
}

TEST(PluginErrors, NotASharedLibrary) {
  // A C source file: dlopen must refuse it with a readable message.
  const std::string e =
      load_error(std::string(mlafuzz::build_paths::kSourceDir) + "/tests/plugins/faulty_plugin.c");
  EXPECT_NE(e.find("cannot load"), std::string::npos) << e;
}

TEST(PluginErrors, WrongAbiVersion) {
  // Newer than this mlafuzz and older than any it loads: both named, with the supported range.
  EXPECT_EQ(load_error(faulty("abi_v3")),
            "plugin " + faulty("abi_v3") + ": ABI version 3, mlafuzz supports 1 and 2");
  EXPECT_EQ(load_error(faulty("abi_v0")),
            "plugin " + faulty("abi_v0") + ": ABI version 0, mlafuzz supports 1 and 2");
}

TEST(PluginErrors, MissingSymbol) {
  EXPECT_EQ(load_error(faulty("missing_run")),
            "plugin " + faulty("missing_run") + ": missing symbol mlafuzz_plugin_run");
}

TEST(PluginErrors, CustomPrecisionNeedsTolerances) {
  const std::string e = load_error(faulty("bad_tolerance"));
  EXPECT_NE(e.find("custom precision needs abs_tol >= 0 and rel_tol >= 0"), std::string::npos) << e;
}

TEST(PluginErrors, RunErrorBecomesAResult) {
  const auto plugin = load_plugin_backend(faulty("run_error"));
  const RunResult r = plugin->run(materialize(small_case()));
  EXPECT_EQ(r.status, RunStatus::kError);
  EXPECT_EQ(r.message, "plugin:faulty-4: mlafuzz_plugin_run returned 7: simulated launch failure");
}

TEST(PluginErrors, UnsupportedCasesAreNotApplicable) {
  const auto plugin = load_plugin_backend(faulty("unsupported"));
  Case c = small_case();
  const MaterializedCase big = materialize(c);
  ASSERT_TRUE(plugin->unsupported(big).has_value());
  EXPECT_EQ(*plugin->unsupported(big), "plugin:faulty-5: topk 6 > 4");
  EXPECT_EQ(plugin->run(big).status, RunStatus::kUnsupported);
  c.topk = 4;
  c.indices = {{0, 7, 13, -1}, {-1, -1, 4, 5}};
  const MaterializedCase small = materialize(c);
  EXPECT_FALSE(plugin->unsupported(small).has_value());
  EXPECT_EQ(plugin->run(small).status, RunStatus::kOk);
}

}  // namespace
}  // namespace mlafuzz

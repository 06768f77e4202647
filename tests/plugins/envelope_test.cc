// ABI version 2: a real version-1 plugin keeps working, envelopes constrain generation and
// shrinking (the FlashMLA-like plugin gets >= 95% applicable cases with the edge classes still
// reached), and invariance claims turn a bitwise check into a bounded one, never into none.
#include "core/envelope.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/materialize.h"
#include "harness/backends/plugin_backend.h"
#include "harness/backends/registry.h"
#include "harness/campaign/worker.h"
#include "harness/campaign/worker_protocol.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/shrink.h"
#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

std::string variant(const char* kind) {
  return std::string(mlafuzz::build_paths::kVariantPluginDir) + "/libvariant_" + kind + ".so";
}
const std::string kV1Plugin =
    std::string(mlafuzz::build_paths::kVariantPluginDir) + "/libabi_v1_plugin.so";

std::string repro(uint64_t seed) {
  return "reproduce: build-host/tests/plugins/plugin_tests --gtest_filter='Envelope*' (seed " +
         std::to_string(seed) + ")";
}

const PropertyOutcome* find(const CaseEvaluation& ev, const std::string& prop) {
  for (const auto& o : ev.outcomes) {
    if (o.property == prop) return &o;
  }
  return nullptr;
}

// ---- version 1 ----

TEST(AbiV1, VersionOnePluginLoadsAndRunsEveryProperty) {
  const PluginDescription d = describe_plugin(kV1Plugin);
  EXPECT_EQ(d.abi_version, 1);
  EXPECT_EQ(d.name, "cpu-fp32-abi-v1");
  EXPECT_FALSE(d.has_envelope);
  EXPECT_EQ(d.traits.inexact_invariants, 0u);
  auto plugin = load_plugin_backend(kV1Plugin);
  // It declares nothing; version 1 itself limits it to one query token and no extra cache.
  Envelope v1;
  v1.s_q.values = {1};
  v1.refuses = kFeatureExtraCache | kFeatureExtraTopkLength;
  EXPECT_EQ(plugin->traits().envelope, v1) << envelope_to_json(plugin->traits().envelope).dump();
  EXPECT_EQ(d.traits.envelope, v1);
  auto oracle = make_backend("oracle");
  std::vector<Backend*> backends{oracle.get(), plugin.get()};
  // The plugin fails its run when handed anything but version-1 structs, so passing runs prove
  // mlafuzz sends struct_size MLAFUZZ_DECODE_CALL_V1_SIZE and abi_version 1.
  const uint64_t seed = 11;
  int ran = 0;
  GenConfig cfg;
  cfg.envelope = plugin->traits().envelope;  // as a campaign draws for it
  for (uint64_t i = 0; i < 25; ++i) {
    const Case c = generate_case(seed, i, cfg, nullptr);
    const CaseEvaluation ev = evaluate_case(c, backends, {});
    for (const auto* f : ev.failures()) {
      ADD_FAILURE() << "case " << i << ": " << format_outcome(*f) << "\n" << repro(seed);
    }
    const PropertyOutcome* run = nullptr;
    for (const auto& o : ev.outcomes) {
      if (o.property == "run" && o.backend == plugin->traits().name) run = &o;
    }
    ASSERT_NE(run, nullptr);
    ran += run->applicable && run->passed;
  }
  EXPECT_EQ(ran, 25);
}

// Plugins built before out_of_range and v32_scales existed keep their meaning: no index past
// the cache, both V32 scale conventions (a reader that rounds fp32 scales is tested for it).
// The example, which names both, gets both.
TEST(AbiV1, EarlierPluginsNeverGetOutOfRangeAndReadBothScaleConventions) {
  const Envelope old = load_plugin_backend(kV1Plugin)->traits().envelope;
  EXPECT_FALSE(old.allows(mla::InvalidIndexRule::kOutOfRange));
  EXPECT_TRUE(old.allows(mla::InvalidIndexRule::kAnyNegative));
  EXPECT_TRUE(old.allows(ScaleConvention::kFp32));
  EXPECT_TRUE(old.allows(ScaleConvention::kPowerOfTwo));
  const Envelope example = load_plugin_backend(mlafuzz::build_paths::kCpuPlugin)->traits().envelope;
  EXPECT_TRUE(example.allows(mla::InvalidIndexRule::kOutOfRange));
  EXPECT_TRUE(example.allows(ScaleConvention::kFp32));
}

TEST(AbiV1, CallStructsOfEachVersion) {
  GenConfig cfg;
  cfg.max_s_q = 1;  // a case a version-1 plugin can be given
  cfg.extra_cache = false;
  const MaterializedCase m = materialize(generate_case(3, 0, cfg, nullptr));
  const mla::DecodeParams p = m.host_params();
  const MlafuzzDecodeCall v1 = make_plugin_call(p, MLAFUZZ_RUNS_ON_HOST, nullptr, 1);
  EXPECT_EQ(v1.struct_size, MLAFUZZ_DECODE_CALL_V1_SIZE);
  EXPECT_EQ(v1.abi_version, 1u);
  EXPECT_EQ(v1.s_q, 0);  // never filled for a version-1 plugin
  const MlafuzzDecodeCall v2 = make_plugin_call(p, MLAFUZZ_RUNS_ON_HOST, nullptr);
  EXPECT_EQ(v2.struct_size, sizeof(MlafuzzDecodeCall));
  EXPECT_EQ(v2.abi_version, 2u);
  EXPECT_EQ(v2.s_q, 1);
  EXPECT_EQ(v2.has_extra, 0);
  EXPECT_EQ(v2.q_token_stride, int64_t{m.heads} * v2.q_head_stride);
  EXPECT_LE(v2.q_token_stride, v2.q_batch_stride);
  EXPECT_EQ(v2.indices_token_stride, m.topk);
  EXPECT_LE(v2.indices_token_stride, v2.indices_batch_stride);
  EXPECT_EQ(v2.out_token_stride, int64_t{m.heads} * v2.out_head_stride);
  EXPECT_EQ(v2.lse_token_stride, m.heads);
  // Both versions agree on every version-1 field.
  EXPECT_EQ(std::memcmp(reinterpret_cast<const char*>(&v1) + 8,
                        reinterpret_cast<const char*>(&v2) + 8, MLAFUZZ_DECODE_CALL_V1_SIZE - 8),
            0);
}

// ---- envelopes ----

TEST(EnvelopeJson, ExampleFileIsTheFlashMlaPluginsEnvelope) {
  const PluginDescription d = describe_plugin(variant("flashmla"));
  ASSERT_TRUE(d.has_envelope);
  // The plugin adds the example kernel's own limits (s_q 1, no extra cache) to the file's.
  const Envelope base =
      describe_plugin(std::string(mlafuzz::build_paths::kCpuPlugin)).traits.envelope;
  EXPECT_EQ(intersect(load_envelope(std::string(mlafuzz::build_paths::kSourceDir) +
                                    "/examples/envelopes/flashmla_model1.json"),
                      base),
            d.traits.envelope)
      << envelope_to_json(d.traits.envelope).dump();
  // JSON round trip.
  EXPECT_EQ(envelope_from_json(envelope_to_json(d.traits.envelope)), d.traits.envelope);
}

TEST(EnvelopeJson, ErrorsNameTheField) {
  auto err = [](const char* text) {
    try {
      envelope_from_json(nlohmann::ordered_json::parse(text));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(err(R"({"heads": {"max": -3}})"),
            "envelope.heads.max: must be in [0, 2147483647], got -3");
  EXPECT_NE(err(R"({"head": 4})").find("envelope.head: unknown key"), std::string::npos);
  EXPECT_NE(err(R"({"layouts": ["model2"]})").find("unknown name 'model2'"), std::string::npos);
  EXPECT_NE(err(R"({"topk": {"min": 9, "max": 3}})").find("min 9 > max 3"), std::string::npos);
  EXPECT_NE(err(R"({"version": 2})").find("unknown version 2"), std::string::npos);
  EXPECT_EQ(err(R"({"heads": [1, 2, 64], "topk": {"multiple_of": 64}})"), "");
}

TEST(EnvelopeSet, NearestAndIntersection) {
  IntSet m64;
  m64.multiple_of = 64;
  EXPECT_EQ(m64.nearest(1, 1, 512), 64);
  EXPECT_EQ(m64.nearest(100, 1, 512), 128);
  EXPECT_EQ(m64.nearest(96, 1, 512), 64);  // ties: the smaller
  EXPECT_EQ(m64.nearest(900, 1, 512), 512);
  EXPECT_FALSE(m64.nearest(1, 1, 50));
  IntSet le64;
  le64.max = 64;
  const IntSet both = intersect(m64, le64);
  EXPECT_TRUE(both.contains(64));
  EXPECT_FALSE(both.contains(128));
  IntSet list;
  list.values = {3, 5};
  EXPECT_FALSE(intersect(list, m64).nearest(1, 1, 1000));  // nothing left: empty, not "any"
}

// The FlashMLA-like plugin: applicable fraction and tag counts on the default profile, inside
// its envelope and (for comparison) without it.
struct Census {
  int cases = 0, applicable = 0;
  std::map<std::string, int> tags;
};

// Applicable: the plugin's supports() accepts the case (that needs the materialized case, the
// slow part), or with `plugin` null, the case lies inside `env` (the same rules, see
// variant_plugin.c).
Census census(const Backend* plugin, const Envelope& env, const GenConfig& cfg, uint64_t seed,
              int n) {
  Census s;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> tags;
    const Case c = generate_case(seed, static_cast<uint64_t>(i), cfg, &tags);
    ++s.cases;
    s.applicable += plugin ? !plugin->unsupported(materialize(c)) : !env.rejects(c);
    for (const auto& t : tags) ++s.tags[t];
  }
  return s;
}

TEST(Envelope, FlashMlaLikePluginGetsApplicableCasesWithTheEdgeClasses) {
  auto plugin = load_plugin_backend(variant("flashmla"));
  auto oracle = make_backend("oracle");
  GenConfig inside;
  inside.envelope = intersect(oracle->traits().envelope, plugin->traits().envelope);
  const uint64_t seed = 14;
  const int n = 500;
  Census in = census(plugin.get(), {}, inside, seed, n);
  Census out = census(nullptr, plugin->traits().envelope, GenConfig{}, seed, n);
  const double frac_in = double(in.applicable) / in.cases;
  const double frac_out = double(out.applicable) / out.cases;
  std::printf(
      "flashmla-like plugin, default profile, seed %llu, %d cases: applicable %.1f%% "
      "inside its envelope, %.1f%% without\n",
      static_cast<unsigned long long>(seed), n, 100 * frac_in, 100 * frac_out);
  EXPECT_GE(frac_in, 0.95) << repro(seed);
  // Every edge class of the generator, and the features that break kernels, still reached.
  const std::vector<std::string> edges = {
      "edge=all-invalid",  "edge=topk-length-0", "edge=sink-inf",       "edge=page-boundary",
      "edge=large-logits", "edge=ties",          "edge=extreme-scales", "edge=tile-edges",
      "edge=padded-dims",  "edge=empty-rows",    "edge=duplicates",     "edge=tiny-pages"};
  const std::vector<std::string> features = {"has_invalid",
                                             "all_invalid_row",
                                             "duplicates",
                                             "page_edge_slot",
                                             "topk_length=0",
                                             "topk_length=partial",
                                             "sink=+inf",
                                             "sink=-inf",
                                             "page_order=shuffled",
                                             "stride=padded",
                                             "page_size=non-pow2",
                                             "pages=many",
                                             "B>4",
                                             "H>16",
                                             "topk>128",
                                             "shape=production",
                                             "head_pad",
                                             "nope=padded",
                                             "scales=extreme",
                                             "values=special",
                                             "values=large-logits",
                                             "pad_fill=nan",
                                             "family=production"};
  std::printf("%-22s %8s %8s\n", "tag", "inside", "without");
  for (const auto* list : {&edges, &features}) {
    for (const auto& t : *list) {
      std::printf("%-22s %8d %8d\n", t.c_str(), in.tags[t], out.tags[t]);
      EXPECT_GE(in.tags[t], 2) << t << " no longer reached inside the envelope\n" << repro(seed);
    }
  }
  // The envelope's own exclusions never appear inside it.
  for (const char* t : {"layout=v32", "topk%64!=0", "conventions=non-default"}) {
    EXPECT_EQ(in.tags[t], 0) << t;
    EXPECT_GT(out.tags[t], 0) << t;
  }
}

TEST(Envelope, EmptyIntersectionIsAnError) {
  GenConfig cfg;
  cfg.envelope.layouts = 1u << static_cast<int>(mla::Layout::kV32);
  cfg.envelope.nope_dim.values = {448};  // not a multiple of V32's 128-dim tile
  try {
    generate_case(1, 0, cfg, nullptr);
    FAIL() << "generated a case in an empty envelope";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("admits no case"), std::string::npos) << e.what();
  }
}

// The CUDA kernels run the production decode: their envelope is the host models', so
// the production family (s_q 1-4, extra caches, H 64 and 128) lies inside it.
TEST(Envelope, CudaKernelsAcceptTheProductionDecode) {
  const Envelope e = cuda_kernel_envelope();
  // The host models' limits; the conventions the device code has not been run on left out.
  Envelope sizes = e;
  sizes.invalid_index_rules = kAllInvalidIndexRules;
  sizes.v32_scales = kBothValues;
  EXPECT_EQ(sizes, builtin_kernel_envelope());
  EXPECT_FALSE(e.allows(mla::InvalidIndexRule::kOutOfRange));
  EXPECT_FALSE(e.allows(ScaleConvention::kFp32));
  GenConfig cfg;
  cfg.families = {"production"};
  int multi = 0, extra = 0, h128 = 0;
  for (uint64_t i = 0; i < 60; ++i) {
    const Case c = generate_case(1515, i, cfg, nullptr);
    const auto why = e.rejects(c);
    EXPECT_FALSE(why) << "case " << i << ": " << *why << "; " << repro(1515);
    multi += c.s_q > 1;
    extra += c.extra.has_value();
    h128 += c.heads == 128;
  }
  EXPECT_GT(multi, 0) << repro(1515);
  EXPECT_GT(extra, 0) << repro(1515);
  EXPECT_GT(h128, 0) << repro(1515);
}

TEST(Envelope, ShrinkingNeverLeavesTheEnvelope) {
  auto plugin = load_plugin_backend(variant("flashmla"));
  GenConfig cfg;
  cfg.envelope = plugin->traits().envelope;
  const uint64_t seed = 5;
  int shrunk = 0;
  for (uint64_t i = 0; i < 200 && shrunk < 3; ++i) {
    const Case c = generate_case(seed, i, cfg, nullptr);
    if (c.topk < 128 || c.batch < 2) continue;
    // A failure that persists whatever the case: shrinking goes as far as it may.
    const auto always = [](const Case&) { return true; };
    const ShrinkResult r = shrink_case(c, always, ShrinkLimits{}, cfg.envelope);
    EXPECT_FALSE(cfg.envelope.rejects(r.minimal)) << *cfg.envelope.rejects(r.minimal);
    EXPECT_FALSE(plugin->unsupported(materialize(r.minimal))) << repro(seed);
    EXPECT_EQ(r.minimal.topk, 64);
    EXPECT_EQ(r.minimal.batch, 1);
    // Without the envelope the same shrink leaves it (topk 1).
    const ShrinkResult free = shrink_case(c, always, ShrinkLimits{});
    EXPECT_TRUE(cfg.envelope.rejects(free.minimal));
    ++shrunk;
  }
  EXPECT_EQ(shrunk, 3);
}

// ---- invariance claims ----

// B = 4 rows of 128 random tokens: the summation order of batch-order plugins differs alone.
Case batch_case() {
  Case c;
  c.geom.page_size = 64;
  c.geom.num_pages = 8;
  c.batch = 4;
  c.heads = 8;
  c.topk = 128;
  c.data_seed = 99;
  return c;
}

TEST(Invariance, SummationOrderDependingOnBFailsBatchAloneWhenClaimedExact) {
  auto plugin = load_plugin_backend(variant("batch_order"));
  EXPECT_EQ(plugin->traits().inexact_invariants, 0u);
  const CaseEvaluation ev = evaluate_case(batch_case(), {plugin.get()}, {"batch-alone"});
  const PropertyOutcome* o = find(ev, "batch-alone");
  ASSERT_NE(o, nullptr);
  EXPECT_TRUE(o->applicable);
  EXPECT_FALSE(o->passed) << o->detail;
  EXPECT_EQ(o->detail.find("bounded"), std::string::npos) << o->detail;
}

TEST(Invariance, DeclaredInexactBatchIsCheckedWithinTheBoundAndPasses) {
  auto plugin = load_plugin_backend(variant("batch_order_inexact"));
  EXPECT_EQ(plugin->traits().inexact_invariants, kInvariantBatch);
  const CaseEvaluation ev =
      evaluate_case(batch_case(), {plugin.get()}, {"batch-alone", "head-alone", "tolerance"});
  const PropertyOutcome* o = find(ev, "batch-alone");
  ASSERT_NE(o, nullptr);
  EXPECT_TRUE(o->applicable);
  EXPECT_TRUE(o->passed) << o->detail;
  EXPECT_EQ(o->detail, "bounded: not claimed exact by the kernel");
  EXPECT_GT(o->tightness, 0);  // really compared: the rows differ, within the bound
  EXPECT_LE(o->tightness, 1);
  // Head independence is still claimed, and still checked bit for bit.
  const PropertyOutcome* h = find(ev, "head-alone");
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(h->passed) << h->detail;
  EXPECT_TRUE(h->detail.empty()) << h->detail;
}

TEST(Invariance, GrosslyWrongInexactKernelStillFailsTheBoundedCheck) {
  auto plugin = load_plugin_backend(variant("batch_wrong_inexact"));
  const CaseEvaluation ev = evaluate_case(batch_case(), {plugin.get()}, {"batch-alone"});
  const PropertyOutcome* o = find(ev, "batch-alone");
  ASSERT_NE(o, nullptr);
  EXPECT_FALSE(o->passed);
  EXPECT_NE(o->detail.find("bounded: not claimed exact by the kernel; batch row"),
            std::string::npos)
      << o->detail;
  EXPECT_NE(o->detail.find("beyond the bound"), std::string::npos) << o->detail;
  EXPECT_GT(o->tightness, 1);
}

// ---- the extra-cache pipeline ----

// A plugin's extra_pipeline reaches the tolerance model, in the campaign process and across the
// worker's INFO reply (plugins run behind a `mlafuzz worker`).
TEST(ExtraPipeline, DeclaredLseMergedReachesTheToleranceModel) {
  auto joint = load_plugin_backend(variant("flashmla"));
  auto merged = load_plugin_backend(variant("lse_merged"));
  EXPECT_EQ(joint->traits().extra_pipeline, ExtraPipeline::kJoint);
  EXPECT_EQ(merged->traits().extra_pipeline, ExtraPipeline::kLseMerged);
  const campaign::WorkerInfo info =
      campaign::decode_info(campaign::encode_info(campaign::describe_backend(*merged)));
  EXPECT_EQ(info.traits.extra_pipeline, ExtraPipeline::kLseMerged);
  EXPECT_EQ(campaign::decode_info(campaign::encode_info(campaign::describe_backend(*joint)))
                .traits.extra_pipeline,
            ExtraPipeline::kJoint);
}

}  // namespace
}  // namespace mlafuzz

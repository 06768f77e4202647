// One bug, one finding: the canonical walk, cause sets, failure kinds and group signatures, the
// locus, and (with the host mutants) that one planted bug gives one group whichever seed found
// it while two bugs give two.
#include "properties/triage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <set>
#include <string>

#include "core/envelope.h"
#include "core/materialize.h"
#include "mla/mla_params.h"
#include "oracle/oracle.h"
#include "properties/canonical.h"
#include "properties/case_edits.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/properties.h"
#include "properties/shrink.h"
#include "tests/core/test_util.h"

#if MLAFUZZ_TEST_HOST_MUTANTS
#include "kernels/host/host_models.h"
#include "kernels/host/host_mutants.h"
#endif

namespace mlafuzz {
namespace {

// The rerun command of these tests, for failure messages.
constexpr const char* kRerun = "build/tests/properties/property_triage_tests";

// A generated case with every feature the walk removes: V32, a padded page stride, a page order,
// a sink, special values, random scales, padding, a non-default convention, several rows and
// heads, and `len` a topk_length that masks an entry holding a valid index.
Case messy_case(uint64_t seed) {
  GenConfig cfg;
  Case c = with_explicit_indices(generate_case(seed, 0, cfg, nullptr));
  c.extra.reset();
  c.s_q = 1;
  c.q_source.reset();
  c.batch = 3;
  c.heads = 2;
  c.topk = 5;
  c.geom = {mla::Layout::kV32, 384, 64, 128, 13, 0, 6};
  c.geom.page_stride = mla::min_page_stride(c.geom) + 64;
  c.page_order = {5, 4, 3, 2, 1, 0};
  c.indices.assign(3, {});
  for (int b = 0; b < 3; ++b) c.indices[static_cast<size_t>(b)] = {3, 14, 40, 41 + b, 70};
  c.topk_length = std::vector<int32_t>{2, 5, 3};
  c.sink = std::vector<double>{0.5, -HUGE_VAL};
  c.q_values = {ValueDist::kNormal, 4.0, 0.1};
  c.scales = {ScaleMode::kRandom, 120, 133};
  c.q_head_pad = 3;
  c.lse_row_pad = 2;
  c.pad_fill = Fill::kNaN;
  c.conventions.empty_lse = mla::EmptyRowLse::kNegInf;
  c.data_seed = seed * 7919 + 3;
  validate(c);
  return c;
}

// A kernel that reads one entry past topk_length, as a predicate on the recipe: some row whose
// length masks an entry holding a valid index.
bool reads_past_length(const Case& x) {
  const Case c = with_explicit_indices(x);
  if (!c.topk_length) return false;
  for (int q = 0; q < c.query_rows(); ++q) {
    const int32_t len = (*c.topk_length)[static_cast<size_t>(q / c.s_q)];
    if (len < c.topk && c.indices[static_cast<size_t>(q)][static_cast<size_t>(len)] >= 0) {
      return true;
    }
  }
  return false;
}

// One batch row, one head: the index list `list` on a cache of `pages` pages of `page_size`.
Case one_row_case(int32_t page_size, int32_t pages, std::vector<int32_t> list) {
  Case c = with_explicit_indices(testing::small_case());
  c = edits::select_rows(c, {0});
  c = edits::select_heads(c, {0});
  c.q_source.reset();
  c.geom.page_size = page_size;
  c.geom.num_pages = pages;
  c.topk = static_cast<int32_t>(list.size());
  c.indices = {std::move(list)};
  validate(c);
  return c;
}

// A kernel that needs valid entries of row 0 in two 64-token tiles (a split merged wrongly).
bool valid_in_two_tiles(const Case& x) {
  const Case e = with_explicit_indices(x);
  std::set<int> tiles;
  for (int k = 0; k < e.topk; ++k) {
    if (edits::entry_valid(e, 0, k)) tiles.insert(k / 64);
  }
  return tiles.size() >= 2;
}

TEST(Canonical, EveryStartWalksToOneCanonicalCaseAndCauseSet) {
  std::string first_json;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const Case start = messy_case(seed);
    ASSERT_TRUE(reads_past_length(start));
    const ShrinkResult r = canonicalize_case(start, reads_past_length, ShrinkLimits{});
    EXPECT_EQ(r.stopped_by, ShrinkStop::kFixedPoint) << "seed " << seed << "; rerun: " << kRerun;
    const Case& m = r.minimal;
    ASSERT_TRUE(reads_past_length(m)) << "seed " << seed;
    EXPECT_EQ(m.batch, 1);
    EXPECT_EQ(m.heads, 1);
    EXPECT_EQ(m.geom.layout, mla::Layout::kModel1);
    EXPECT_EQ(m.geom.nope_dim, 512);
    EXPECT_EQ(m.geom.rope_dim, 64);
    EXPECT_EQ(m.geom.page_size, 64);
    EXPECT_EQ(m.geom.page_stride, 0);
    EXPECT_TRUE(m.page_order.empty());
    EXPECT_FALSE(m.sink.has_value());
    EXPECT_EQ(m.q_values.dist, ValueDist::kSmallInt);
    EXPECT_EQ(m.q_values.special_fraction, 0);
    EXPECT_EQ(m.scales.mode, ScaleMode::kFixed);
    EXPECT_EQ(m.scales.exp_lo, 127);
    EXPECT_EQ(m.q_head_pad, 0);
    EXPECT_EQ(m.lse_row_pad, 0);
    EXPECT_EQ(m.pad_fill, Fill::kZero);
    EXPECT_EQ(m.conventions.empty_lse, mla::EmptyRowLse::kPosInf);
    EXPECT_EQ(m.data_seed, 0u);
    EXPECT_EQ(cause_set(m),
              std::vector<std::string>{"topk_length < topk, valid index beyond topk_length"})
        << to_json(m);
    // Whatever the start, the same canonical case (but its free-text name and description).
    Case bare = m;
    bare.name.clear();
    bare.description.clear();
    if (seed == 1) first_json = to_json(bare);
    EXPECT_EQ(to_json(bare), first_json) << "seed " << seed << "; rerun: " << kRerun;
  }
}

TEST(Canonical, CauseSetNamesTheFeaturesTheFailureNeeds) {
  // Needs a sink of -inf (a kernel computing exp(-inf - m) wrong) and a page size that is not a
  // power of two with an entry past the first page.
  const auto pred = [](const Case& x) {
    const Case c = with_explicit_indices(x);
    if (!c.sink || (*c.sink)[0] != -HUGE_VAL) return false;
    const int32_t P = c.geom.page_size;
    if ((P & (P - 1)) == 0) return false;
    for (int k = 0; k < c.topk; ++k) {
      if (edits::entry_valid(c, 0, k) && c.indices[0][static_cast<size_t>(k)] >= P) return true;
    }
    return false;
  };
  Case c = messy_case(5);
  c.sink = std::vector<double>{-HUGE_VAL, -HUGE_VAL};
  ASSERT_TRUE(pred(c));
  const ShrinkResult r = canonicalize_case(c, pred, ShrinkLimits{});
  ASSERT_TRUE(pred(r.minimal));
  EXPECT_EQ(r.minimal.geom.page_size, 61) << "the canonical page size that is not a power of two";
  const std::vector<std::string> causes = cause_set(r.minimal);
  EXPECT_EQ(causes, (std::vector<std::string>{"page_size not a power of two",
                                              "entry beyond the first page", "sink = -inf"}))
      << to_json(r.minimal) << "\nrerun: " << kRerun;
}

// A reader that needs fp32 V32 scales that are not powers of two (it rounds them): the walk
// keeps the V32 layout and the convention, its fixed scale is 1.5, and the cause set says so.
TEST(Canonical, Fp32ScalesAreACauseAndTheirSimplestScaleIsOneAndAHalf) {
  const auto pred = [](const Case& c) {
    return c.scales.convention == ScaleConvention::kFp32 &&
           !(c.scales.mode == ScaleMode::kFixed && c.scales.mantissa == 1.0);
  };
  Case c = messy_case(6);
  c.scales = {ScaleMode::kRandom, 120, 133, ScaleConvention::kFp32};
  validate(c);
  const ShrinkResult r = canonicalize_case(c, pred, ShrinkLimits{});
  ASSERT_TRUE(pred(r.minimal));
  EXPECT_EQ(r.minimal.geom.layout, mla::Layout::kV32) << "fp32 scales exist in V32 only";
  EXPECT_EQ(r.minimal.scales.mode, ScaleMode::kFixed);
  EXPECT_EQ(r.minimal.scales.mantissa, 1.5);
  const std::vector<std::string> causes = cause_set(r.minimal);
  EXPECT_NE(std::find(causes.begin(), causes.end(), "fp32 V32 scales"), causes.end())
      << to_json(r.minimal) << "\nrerun: " << kRerun;
  // A failure that does not need them walks to power-of-two scales.
  const ShrinkResult any = canonicalize_case(
      c, [](const Case&) { return true; }, ShrinkLimits{});
  EXPECT_EQ(any.minimal.scales.convention, ScaleConvention::kPowerOfTwo);
}

// Under out_of_range an entry past the cache is invalid: a failure that needs one keeps it past
// the end of the (smaller, re-paged) cache, on its first slot past the end, and the cause set
// names it and the convention.
TEST(Canonical, AnEntryPastTheCacheStaysPastItsEnd) {
  const auto past = [](const Case& x) {
    const Case c = with_explicit_indices(x);
    if (c.conventions.invalid_index != mla::InvalidIndexRule::kOutOfRange) return false;
    for (const auto& row : c.indices) {
      for (int32_t v : row) {
        if (v >= mla::num_slots(c.geom)) return true;
      }
    }
    return false;
  };
  Case c = messy_case(7);
  c.conventions.invalid_index = mla::InvalidIndexRule::kOutOfRange;
  const int64_t slots = mla::num_slots(c.geom);
  c.indices[1][2] = static_cast<int32_t>(slots + 5);
  validate(c);
  ASSERT_TRUE(past(c));
  // out_of_range is opt-in: the default envelope excludes it.
  const Envelope env = any_case_envelope();
  const ShrinkResult r = canonicalize_case(c, past, ShrinkLimits{}, env);
  ASSERT_TRUE(past(r.minimal)) << to_json(r.minimal);
  EXPECT_EQ(r.minimal.batch, 1);
  EXPECT_EQ(r.minimal.heads, 1);
  const std::vector<std::string> causes = cause_set(r.minimal, env);
  for (const char* want : {"entry past the cache", "any index outside the cache invalid"}) {
    EXPECT_NE(std::find(causes.begin(), causes.end(), want), causes.end())
        << want << "\n"
        << to_json(r.minimal) << "\nrerun: " << kRerun;
  }
  // How far past the end is no feature: the walk ends on the first slot past the end.
  const Case m = with_explicit_indices(r.minimal);
  bool first_past = false;
  for (const auto& row : m.indices) {
    for (int32_t v : row) first_past = first_past || v == mla::num_slots(m.geom);
  }
  EXPECT_TRUE(first_past) << to_json(m) << "\nrerun: " << kRerun;
  // The page edits keep it past the end: fewer pages, another page size.
  Case two = with_explicit_indices(c);
  two.page_order.clear();
  const auto compacted = edits::compact_pages(two);
  ASSERT_TRUE(compacted.has_value());
  EXPECT_EQ(compacted->indices[1][2], mla::num_slots(compacted->geom) + 5);
  const auto resized = edits::with_page_size(two, 64);
  ASSERT_TRUE(resized.has_value());
  EXPECT_EQ(resized->indices[1][2], mla::num_slots(resized->geom) + 5);
}

// A page size larger than the cache's slot count: each token keeps its page and slot (the last
// slot of a page stays the last) and stays in the cache, so that a failure found on two-token
// pages walks to page size 64 (as split-merge-log2 found by seed 4).
TEST(Canonical, ALargerPageSizeKeepsEveryTokenInTheCache) {
  std::vector<int32_t> list(65, -1);
  list[63] = 0;
  list[64] = 1;
  const Case c = one_row_case(2, 1, list);
  const auto resized = edits::with_page_size(c, 64);
  ASSERT_TRUE(resized.has_value());
  EXPECT_EQ(resized->indices[0][63], 0);
  EXPECT_EQ(resized->indices[0][64], 63);
  EXPECT_NO_THROW(validate(*resized)) << to_json(*resized) << "\nrerun: " << kRerun;
  const ShrinkResult r = canonicalize_case(c, valid_in_two_tiles, ShrinkLimits{});
  EXPECT_EQ(r.minimal.geom.page_size, 64) << to_json(r.minimal) << "\nrerun: " << kRerun;
  const std::vector<std::string> causes = cause_set(r.minimal);
  EXPECT_EQ(std::find(causes.begin(), causes.end(), "page_size 2"), causes.end())
      << to_json(r.minimal) << "\nrerun: " << kRerun;
}

// A long list (an extra list merged into the main one) walks to the few entries the failure
// needs in a number of evaluations that grows with the logarithm of its length: the budget of a
// 1000-evaluation triage is not spent one entry at a time (no-rescale found by seed 4).
TEST(Canonical, ALongListWalksToAFewEntriesInFewEvaluations) {
  std::vector<int32_t> list(256);
  std::iota(list.begin(), list.end(), 0);
  const Case c = one_row_case(64, 4, list);
  const ShrinkResult r = canonicalize_case(c, valid_in_two_tiles, ShrinkLimits{200, 1e9});
  EXPECT_EQ(r.stopped_by, ShrinkStop::kFixedPoint)
      << r.evaluations << " evaluations\nrerun: " << kRerun;
  int valid = 0;
  for (int k = 0; k < r.minimal.topk; ++k) valid += edits::entry_valid(r.minimal, 0, k) ? 1 : 0;
  EXPECT_EQ(valid, 2) << to_json(r.minimal) << "\nrerun: " << kRerun;
}

// Moving a duplicate entry relabels a token (it draws other values): a failure the values decide
// (a bitwise difference of sums in two orders, the batch-order plugin found by seed 3) does not
// name "duplicate entry" whichever draw kept the duplicate, as with every value-changing feature.
TEST(Canonical, ADuplicateIsNoCauseOfAFailureTheValuesDecide) {
  Case c = one_row_case(5, 3, {4, 0, 4});
  c.data_seed = 3;
  // Fails on a third of the draws, and only with the duplicate.
  const auto pred = [](const Case& x) {
    const Case e = with_explicit_indices(x);
    std::set<int32_t> seen;
    bool dup = false;
    for (int32_t v : e.indices[0]) dup = dup || (v >= 0 && !seen.insert(v).second);
    return dup && e.data_seed % 3 == 0;
  };
  const std::vector<std::string> all = cause_set(c);
  ASSERT_NE(std::find(all.begin(), all.end(), "duplicate entry"), all.end());
  int evals = 0;
  const std::vector<std::string> causes = robust_causes(c, {}, pred, 96, &evals);
  EXPECT_EQ(std::find(causes.begin(), causes.end(), "duplicate entry"), causes.end())
      << "rerun: " << kRerun << " --gtest_filter=Canonical.ADuplicate*";
}

TEST(Canonical, AFeatureTheEnvelopeKeepsIsNoCause) {
  // Fails on anything: the walk ends at the canonical case of the envelope, which only allows
  // V32; the layout is then no cause.
  Envelope env;
  env.layouts = 1u << static_cast<int>(mla::Layout::kV32);
  Case c = messy_case(2);
  const ShrinkResult r = canonicalize_case(
      c, [](const Case&) { return true; }, ShrinkLimits{}, env);
  EXPECT_EQ(r.minimal.geom.layout, mla::Layout::kV32);
  EXPECT_EQ(cause_set(r.minimal, env), std::vector<std::string>{}) << to_json(r.minimal);
  EXPECT_EQ(cause_set(r.minimal), std::vector<std::string>{"layout v32"});
}

TEST(Canonical, TheEvaluationLimitHoldsAndAWalkIsDeterministic) {
  const Case c = messy_case(3);
  int calls = 0;
  const auto counting = [&](const Case& x) {
    ++calls;
    return reads_past_length(x);
  };
  const ShrinkResult cut = canonicalize_case(c, counting, ShrinkLimits{7, 300});
  EXPECT_EQ(cut.stopped_by, ShrinkStop::kEvaluations);
  EXPECT_EQ(cut.evaluations, 7);
  EXPECT_EQ(calls, 7);
  const ShrinkResult a = canonicalize_case(c, reads_past_length, ShrinkLimits{});
  const ShrinkResult b = canonicalize_case(c, reads_past_length, ShrinkLimits{});
  EXPECT_EQ(to_json(a.minimal), to_json(b.minimal));
  EXPECT_EQ(a.evaluations, b.evaluations);
}

TEST(Canonical, TheExtraListMergesIntoTheMainList) {
  // Needs one entry masked by a length and one counted entry in the same softmax: found with the
  // masked entry in the extra list, it ends in the main list without an extra cache.
  const auto pred = [](const Case& x) {
    const Case c = with_explicit_indices(x);
    bool masked = false, counted = false;
    const auto scan = [&](const std::vector<int32_t>& row, std::optional<int32_t> len) {
      for (size_t k = 0; k < row.size(); ++k) {
        if (row[k] < 0) continue;
        if (len && static_cast<int32_t>(k) >= *len) {
          masked = true;
        } else {
          counted = true;
        }
      }
    };
    scan(c.indices[0], c.topk_length ? std::optional((*c.topk_length)[0]) : std::nullopt);
    if (c.extra) {
      scan(c.extra->indices[0],
           c.extra->topk_length ? std::optional((*c.extra->topk_length)[0]) : std::nullopt);
    }
    return masked && counted;
  };
  Case c = with_explicit_indices(testing::small_case());
  c = edits::select_rows(c, {0});
  c.q_source.reset();
  c.topk = 1;
  c.indices = {{2}};
  c.topk_length.reset();
  ExtraCache e;
  e.page_size = 16;
  e.num_pages = 1;
  e.topk = 2;
  e.indices = {{3, 5}};
  e.topk_length = std::vector<int32_t>{1};
  c.extra = e;
  validate(c);
  ASSERT_TRUE(pred(c));
  const ShrinkResult r = canonicalize_case(c, pred, ShrinkLimits{});
  EXPECT_FALSE(r.minimal.extra.has_value()) << to_json(r.minimal);
  EXPECT_EQ(cause_set(r.minimal),
            std::vector<std::string>{"topk_length < topk, valid index beyond topk_length"})
      << to_json(r.minimal);
}

// SameCaseFile, the cause set's test of whether a move changes the case, says what comparing
// the two files says: on generated cases (with and without an extra cache, several query tokens)
// and every move of every feature, the case itself and the case with its lists reshaped as
// another s_q would hold them.
TEST(Canonical, SameCaseFileIsTheFilesComparison) {
  // Files the same; lists the same but the rest of the file not; lists not the same.
  int same = 0, rest_differs = 0, lists_differ = 0, several_tokens = 0;
  for (const bool production : {false, true}) {
    GenConfig cfg;
    cfg.max_work = int64_t{1} << 14;
    if (production) cfg.families = {"production"};
    for (uint64_t i = 0; i < 12; ++i) {
      const Case e = with_explicit_indices(generate_case(production ? 41 : 40, i, cfg, nullptr));
      const std::string json = to_json(e);
      const SameCaseFile same_as_e(e);
      std::vector<Case> cands{e};
      if (e.s_q > 1) {
        ++several_tokens;
        Case one = e;  // the same lists as rows of one query token each
        one.batch *= one.s_q;
        one.s_q = 1;
        cands.push_back(one);
      }
      for (const CanonicalFeature& f : canonical_features()) {
        for (Case& m : f.toward(e)) cands.push_back(std::move(m));
      }
      for (const Case& cand : cands) {
        const bool want = to_json(cand) == json;
        ASSERT_EQ(same_as_e(cand), want)
            << "case " << i << (production ? " (production)" : "") << ": " << to_json(cand)
            << "\nrerun: " << kRerun
            << " --gtest_filter=Canonical.SameCaseFileIsTheFilesComparison";
        const bool lists = SameCaseFile::same_lists(cand, e);
        (want ? same : lists ? rest_differs : lists_differ) += 1;
      }
    }
  }
  EXPECT_GE(same, 24);  // each case itself (and any move that leaves it as it was)
  EXPECT_GT(rest_differs, 100);
  EXPECT_GT(lists_differ, 100);
  EXPECT_GT(several_tokens, 0);
}

// The largest |logit| of the canonical walk (max_abs_logit) materializes only the tokens a case's
// lists name (materialize_named_tokens): every row's valid entries and logits are those of the
// whole materialization, bit for bit, on generated cases with and without an extra cache.
TEST(Canonical, TheLogitsReadOnlyTheNamedTokens) {
  int rows = 0;
  for (const bool production : {false, true}) {
    GenConfig cfg;
    cfg.max_work = int64_t{1} << 14;
    if (production) cfg.families = {"production"};
    for (uint64_t i = 0; i < 16; ++i) {
      const Case c = generate_case(production ? 43 : 42, i, cfg, nullptr);
      const MaterializedCase whole = materialize(c), part = materialize_named_tokens(c);
      for (int r = 0; r < c.query_rows(); ++r) {
        const OracleRow a = gather_row(whole, r), b = gather_row(part, r);
        ASSERT_EQ(a.k, b.k);
        if (a.k.empty()) continue;
        const Eigen::MatrixXd xa = row_logits(whole, r, a), xb = row_logits(part, r, b);
        ASSERT_TRUE(xa.size() == xb.size() &&
                    std::memcmp(xa.data(), xb.data(), sizeof(double) * xa.size()) == 0)
            << "case " << i << (production ? " (production)" : "") << " row " << r
            << "\nrerun: " << kRerun << " --gtest_filter=Canonical.TheLogitsReadOnlyTheNamedTokens";
        ++rows;
      }
    }
  }
  EXPECT_GT(rows, 50);
}

// The shrink materializes its candidates in a ReuseCaches scope: a move materialized after the
// case it moves from (the shrink's order) holds the bytes it holds alone, whether it shares the
// case's caches (rows, heads, lists, q) or draws its own (pages, values, scales, seed), on
// generated cases with and without an extra cache (4 of each; 2 under MLAFUZZ_TEST_QUICK=1)
// and every move of every canonical feature.
TEST(Canonical, MovesSharingTheCasesCachesHoldTheirOwnBytes) {
  const auto cache_kib = [](const Case& c) {
    mla::CacheGeometry g = c.geom;
    if (g.page_stride == 0) g.page_stride = mla::min_page_stride(g);
    return mla::cache_bytes(g) >> 10;
  };
  int shared = 0, drawn = 0;
  for (const bool production : {false, true}) {
    GenConfig cfg;
    cfg.max_work = int64_t{1} << 11;
    if (production) cfg.families = {"production"};
    int used = 0;
    for (uint64_t i = 0; i < 40 && used < testing::full_or_quick(4, 2); ++i) {
      const Case e = with_explicit_indices(generate_case(production ? 45 : 44, i, cfg, nullptr));
      // Caches up to 256 KiB (each move is materialized three times).
      if (cache_kib(e) > 256) continue;
      ++used;
      for (const CanonicalFeature& f : canonical_features()) {
        for (const Case& cand : f.toward(e)) {
          try {
            validate(cand);
          } catch (const CaseError&) {
            continue;
          }
          if (cache_kib(cand) > 256) continue;
          const MaterializedCase alone = materialize(cand);
          const ReuseCaches reuse;
          const MaterializedCase from = materialize(e), m = materialize(cand);
          ASSERT_TRUE(m.cache == alone.cache && m.extra_cache == alone.extra_cache &&
                      m.q == alone.q && m.indices == alone.indices &&
                      m.extra_indices == alone.extra_indices)
              << "case " << i << (production ? " (production)" : "") << ", " << f.name
              << " move: " << to_json(cand) << "\nrerun: " << kRerun
              << " --gtest_filter=Canonical.MovesSharingTheCasesCachesHoldTheirOwnBytes";
          (m.cache.shares(from.cache) ? shared : drawn) += 1;
        }
      }
    }
  }
  EXPECT_GT(shared, 50);
  EXPECT_GT(drawn, 50);
}

TEST(Signature, KindsAndTheGroupSignature) {
  PropertyOutcome o;
  o.property = "tolerance";
  o.passed = false;
  EXPECT_EQ(failure_kind(o), FailureKind::kBoundExcess);
  o.nonfinite_mismatch = true;
  EXPECT_EQ(failure_kind(o), FailureKind::kNonfiniteMismatch);
  o.property = "poison";
  o.nonfinite_mismatch = false;
  EXPECT_EQ(failure_kind(o), FailureKind::kBitwiseDifference);
  o.guard_written = true;
  EXPECT_EQ(failure_kind(o), FailureKind::kGuardWrite);
  o.run_failed = true;
  EXPECT_EQ(failure_kind(o), FailureKind::kRunError);
  o.property = "fault";
  EXPECT_EQ(failure_kind(o), FailureKind::kFault);
  EXPECT_EQ(group_signature("cpu-mma~x", FailureKind::kBoundExcess, {"finite sink"}),
            "cpu-mma~x | bound excess | finite sink");
  EXPECT_EQ(group_signature("k", FailureKind::kRunError, {}),
            "k | run error | fails on the canonical case");
  // The primary failure is the first in property-table order, whatever the list's order.
  std::vector<PropertyOutcome> fails(3);
  fails[0].property = "permute";
  fails[1].property = "tolerance";
  fails[2].property = "poison";
  EXPECT_EQ(primary_failure(fails)->property, "tolerance");
  // A failure that only shows under a transformation says so in its causes.
  PropertyOutcome ins;
  ins.property = "insert-invalid";
  const Case c = with_explicit_indices(testing::small_case());
  const std::vector<std::string> causes = group_causes(c, ins, {});
  EXPECT_EQ(causes.back(), "only when -1 entries are inserted");
}

TEST(Locus, WrongOutputsInWords) {
  Case c = with_explicit_indices(testing::small_case());
  c = edits::with_dims(edits::select_rows(c, {0}), mla::Layout::kModel1, 512, 64);
  c.heads = 1;
  WrongOutputs w;
  w.out_rows = {{0, 0}};
  for (int d = 384; d <= 447; ++d) w.out_columns.push_back(d);
  EXPECT_EQ(describe_wrong(c, w), "out[b0,h0] wrong only in d 384..447 (scale group 6)");
  w.out_columns = {512, 513};
  w.lse_rows = {{0, 0}};
  EXPECT_EQ(describe_wrong(c, w),
            "out[b0,h0] wrong only in d 512..513 (in the rope part); "
            "lse[b0,h0] wrong");
  w = {};
  w.guard_written = 3;
  EXPECT_EQ(describe_wrong(c, w), "3 output guard or gap element(s) written");
}

TEST(Locus, NeededEntriesAreThoseWhoseRemovalEndsTheFailure) {
  Case c = with_explicit_indices(testing::small_case());
  c = edits::select_rows(c, {0});
  c.q_source.reset();
  c.topk_length.reset();
  c.geom.page_size = 64;
  c.geom.num_pages = 2;
  c.page_order.clear();
  c.topk = 3;
  c.indices = {{5, 63, 70}};
  validate(c);
  // Fails while the last slot of page 0 is selected.
  const auto pred = [](const Case& x) {
    for (int k = 0; k < x.topk; ++k) {
      if (x.indices[0][static_cast<size_t>(k)] == 63) return true;
    }
    return false;
  };
  int evaluations = 0;
  std::vector<int32_t> tokens;
  const std::string s = needed_entries(c, pred, 16, &evaluations, &tokens);
  EXPECT_EQ(s, "needs entry 1 (token 63: page 0, slot 63 = last slot of the page)");
  EXPECT_EQ(evaluations, 3);
  EXPECT_EQ(tokens, std::vector<int32_t>{63});
  const std::string inputs = inline_inputs(c, tokens);
  EXPECT_NE(inputs.find("indices [5, 63, 70]"), std::string::npos) << inputs;
  EXPECT_NE(inputs.find("token 63 2^["), std::string::npos) << inputs;
}

TEST(Bitwise, NansOfAnySignOrPayloadAreEqual) {
  const MaterializedCase m = materialize(testing::small_case());
  RunResult a, b;
  a.out = {1.0, std::nan(""), 3.0};
  a.lse = {-std::nan("")};
  b.out = {1.0, -std::nan("7"), 3.0};
  b.lse = {std::nan("")};
  std::string where;
  EXPECT_TRUE(bitwise_equal(m, a, b, &where)) << where;
  b.out[1] = 2.0;
  EXPECT_FALSE(bitwise_equal(m, a, b, &where));
  EXPECT_NE(where.find("NaNs of any sign or payload count as equal"), std::string::npos) << where;
}

#if MLAFUZZ_TEST_HOST_MUTANTS

// The first failure of `mutant` among the generated cases of `seed`.
struct Found {
  Case c;
  PropertyOutcome o;
};
std::optional<Found> first_failure(Backend& mutant, uint64_t seed) {
  GenConfig cfg;
  for (uint64_t i = 0; i < 200; ++i) {
    const Case c = generate_case(seed, i, cfg, nullptr);
    const CaseEvaluation ev = evaluate_case(c, {&mutant}, {});
    if (ev.failed()) return Found{c, *ev.failures().front()};
  }
  return std::nullopt;
}

std::string signature_of(mla::Mutant m, uint64_t seed, std::string* locus = nullptr) {
  std::unique_ptr<Backend> b = make_cpu_mma_mutant_backend(m);
  const std::optional<Found> f = first_failure(*b, seed);
  if (!f) return "(survived)";
  const Triage t = triage_failure(f->c, f->o, {b.get()}, TriageOptions{});
  std::cout << mla::mutant_name(m) << " seed " << seed << ": " << f->o.property << " -> "
            << t.signature << " in " << t.evaluations << " evaluations\n  " << t.locus.text()
            << "\n";
  if (locus) *locus = t.locus.outputs;
  return t.signature;
}

TEST(Triage, OneBugIsOneGroupWhicheverSeedFindsIt) {
  for (const mla::Mutant m : {mla::Mutant::kTopkLengthIgnored, mla::Mutant::kSinkIgnored,
                              mla::Mutant::kWrongScaleGroup}) {
    const std::string first = signature_of(m, 1);
    for (uint64_t seed = 2; seed <= 3; ++seed) {
      EXPECT_EQ(signature_of(m, seed), first)
          << mla::mutant_name(m) << " seed " << seed << "; rerun: " << kRerun;
    }
  }
}

TEST(Triage, TwoBugsAreTwoGroupsAndTheLocusNamesTheWrongColumns) {
  std::string locus;
  const std::string scale = signature_of(mla::Mutant::kWrongScaleGroup, 1, &locus);
  const std::string sink = signature_of(mla::Mutant::kSinkIgnored, 1);
  const auto causes = [](const std::string& sig) { return sig.substr(sig.find(" | ")); };
  EXPECT_NE(causes(scale), causes(sink)) << scale << "\n" << sink;
  EXPECT_EQ(causes(scale), " | bound excess | scales differ between tiles");
  EXPECT_EQ(causes(sink), " | bound excess | finite sink");
  // The last nope tile of MODEL1 512 (scale group 7) takes its neighbour's scale.
  EXPECT_NE(locus.find("only in scale group 7 (d 448..511"), std::string::npos) << locus;
}

// A case whose only token is in an extra cache with a page order (as generated cases of seed 2
// found them): the extra token is moved to its physical page before the merge into the main list,
// so that a bug in the address of a page walks to the group the main cache gives it.
TEST(Triage, AnExtraCacheWithAPageOrderWalksToTheMainCacheGroup) {
  const auto extra_case = [](int32_t page_size, int64_t stride, int32_t pages,
                             const std::string& order, int32_t token) {
    return case_from_json(
        R"({"format": "mlafuzz-case", "version": 2, "geometry": {"layout": "model1",
        "nope_dim": 512, "rope_dim": 64, "scale_tile": 64, "page_size": 64, "page_stride": 0,
        "num_pages": 1}, "batch": 1, "heads": 1, "topk": 1, "indices": [[-1]],
        "extra": {"geometry": {"page_size": )" +
        std::to_string(page_size) + R"(, "page_stride": )" + std::to_string(stride) +
        R"(, "num_pages": )" + std::to_string(pages) + R"(, "page_order": )" + order +
        R"(}, "topk": 1, "indices": [[)" + std::to_string(token) + R"(]]},
        "q_values": {"dist": "small_int", "magnitude": 1.0, "special_fraction": 0.0},
        "kv_values": {"dist": "small_int", "magnitude": 1.0, "special_fraction": 0.0},
        "rope_values": {"dist": "small_int", "magnitude": 1.0, "special_fraction": 0.0},
        "scales": {"mode": "fixed", "exp_lo": 127, "exp_hi": 127}, "data_seed": 0})");
  };
  const struct {
    mla::Mutant m;
    Case c;
    const char* causes;
  } runs[] = {
      {mla::Mutant::kPageStrideIgnored,
       extra_case(1, 964, 13, "[11, 10, 3, 5, 8, 9, 0, 6, 4, 12, 2, 7, 1]", 0),
       "padded page stride; entry beyond the first page"},
      {mla::Mutant::kPageSizePow2, extra_case(57, 0, 3, "[2, 0, 1]", 26),
       "page_size not a power of two; entry beyond the first page"},
  };
  for (const auto& r : runs) {
    std::unique_ptr<Backend> b = make_cpu_mma_mutant_backend(r.m);
    const CaseEvaluation ev = evaluate_case(r.c, {b.get()}, {"tolerance"});
    ASSERT_TRUE(ev.failed()) << mla::mutant_name(r.m) << "; rerun: " << kRerun;
    const Triage t = triage_failure(r.c, *ev.failures().front(), {b.get()}, TriageOptions{});
    const std::string sig = t.signature;
    EXPECT_EQ(sig.substr(sig.rfind(" | ") + 3), r.causes)
        << mla::mutant_name(r.m) << ": " << sig << "\n"
        << to_json(t.minimal) << "\nrerun: " << kRerun << " --gtest_filter=Triage.AnExtraCache*";
  }
}

#endif

// Two planted bugs in one backend: where bug a's output differs from the correct model's, a's
// element, else b's (out, lse and their raw buffers alike).
class TwoBugs : public ForwardingBackend<> {
 public:
  TwoBugs(mla::Mutant a, mla::Mutant b)
      : ForwardingBackend<>(make_cpu_mma_backend()),
        a_(make_cpu_mma_mutant_backend(a)),
        b_(make_cpu_mma_mutant_backend(b)),
        traits_(inner_->traits()) {
    traits_.name = std::string("two-bugs~") + mla::mutant_name(a) + "+" + mla::mutant_name(b);
  }
  const BackendTraits& traits() const override { return traits_; }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    const RunResult good = inner_->run(m);
    const RunResult a = a_->run(m);
    RunResult r = b_->run(m);
    if (good.status != RunStatus::kOk || a.status != RunStatus::kOk) return a;
    take_where_differs(good.out, a.out, r.out);
    take_where_differs(good.lse, a.lse, r.lse);
    take_where_differs(good.out_raw, a.out_raw, r.out_raw);
    take_where_differs(good.lse_raw, a.lse_raw, r.lse_raw);
    return r;
  }

 private:
  template <typename T>
  static void take_where_differs(const std::vector<T>& good, const std::vector<T>& a,
                                 std::vector<T>& out) {
    if (good.size() != a.size() || a.size() != out.size()) return;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(&good[i], &a[i], sizeof(T)) != 0) out[i] = a[i];
    }
  }
  std::unique_ptr<Backend> a_, b_;
  BackendTraits traits_;  // cpu-mma's, under the name of the two bugs
};

// A kernel without the softmax's max subtraction, as far as the result goes. Every (row, head)
// whose largest logit is above 88.72 (exp overflows fp32) or below -87.33 (every exp underflows: 0
// / 0) gets NaN outputs and LSE; the rest is the correct model's.
class ExpOverflows : public ForwardingBackend<> {
 public:
  ExpOverflows() : ForwardingBackend<>(make_cpu_mma_backend()), traits_(inner_->traits()) {
    traits_.name = "exp-overflows";
  }
  const BackendTraits& traits() const override { return traits_; }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    RunResult r = inner_->run(m);
    if (r.status != RunStatus::kOk) return r;
    const int32_t H = m.heads, dv = m.d_v();
    for (int32_t q = 0; q < m.query_rows(); ++q) {
      const OracleRow row = gather_row(m, q);
      if (row.k.empty()) continue;
      const Eigen::MatrixXd x = row_logits(m, q, row);
      for (int32_t h = 0; h < H; ++h) {
        const double top = x.row(h).maxCoeff();
        if (top <= 88.72 && top >= -87.33) continue;
        const size_t rh = static_cast<size_t>(q) * H + h;
        std::fill_n(r.out.begin() + static_cast<std::ptrdiff_t>(rh * dv), dv, std::nan(""));
        r.lse[rh] = std::nan("");
        // The raw buffers too (bound checks read a bf16 backend's in place).
        const int64_t b = q / m.s_q, s = q % m.s_q, G = OutputBuffers::kGuard;
        const int64_t o =
            G + b * m.out_batch_stride + s * m.out_token_stride + h * m.out_head_stride;
        std::fill_n(r.out_raw.begin() + o, dv, uint16_t{0x7FC0});
        r.lse_raw[static_cast<size_t>(G + b * m.lse_batch_stride + s * m.lse_token_stride + h)] =
            std::nanf("");
      }
    }
    return r;
  }

 private:
  BackendTraits traits_;  // cpu-mma's, under its own name
};

TEST(Triage, ALogitRangeCauseIsTheSameWhicheverSeedFindsIt) {
  // The failure needs logits beyond exp's range, whatever values and scales give them: the first
  // case of each seed with q large enough to overflow (other shapes, scales and draws each time)
  // walks to the group that names "large logits".
  ExpOverflows backend;
  GenConfig cfg;
  int triaged = 0;
  for (uint64_t seed = 1; seed <= 16 && triaged < 3; ++seed) {
    Case c = generate_case(seed, 0, cfg, nullptr);
    c.q_values = ValueSpec{ValueDist::kNormal, 32.0, 0.0};
    c.scales = ScaleSpec{ScaleMode::kRandom, 124, 130};
    const CaseEvaluation ev = evaluate_case(c, {&backend}, {"tolerance"});
    if (!ev.failed()) continue;
    ++triaged;
    const Triage t = triage_failure(c, *ev.failures().front(), {&backend}, TriageOptions{});
    std::cout << "seed " << seed << " -> " << t.signature << "\n  " << t.locus.text() << "\n";
    EXPECT_EQ(t.signature, "exp-overflows | non-finite mismatch | large logits")
        << "seed " << seed << "; rerun: " << kRerun
        << " --gtest_filter=Triage.ALogitRangeCauseIsTheSameWhicheverSeedFindsIt";
  }
  EXPECT_EQ(triaged, 3) << "rerun: " << kRerun;
}

// The group of every case of the first 40 of `seed` that fails tolerance (one triage each).
std::set<std::string> groups_of(Backend& backend, uint64_t seed) {
  GenConfig cfg;
  std::set<std::string> groups;
  for (uint64_t i = 0; i < 40; ++i) {
    const Case c = generate_case(seed, i, cfg, nullptr);
    const CaseEvaluation ev = evaluate_case(c, {&backend}, {});
    if (!ev.failed() || ev.failures().front()->property != "tolerance") continue;
    const PropertyOutcome& o = *ev.failures().front();
    const Triage t = triage_failure(c, o, {&backend}, TriageOptions{});
    std::cout << backend.traits().name << " seed " << seed << " case " << i << ": " << o.property
              << " -> " << t.signature << "\n";
    groups.insert(t.signature.substr(t.signature.find(" | ")));
  }
  return groups;
}

TEST(Triage, TwoBugsPlantedTogetherGiveTheirTwoGroups) {
  // invalid-index-unmasked fails on every row the walk leaves without a valid entry (the walk's
  // own moves can make one); a walk from sink-ignored's failure must not end on it.
  const std::pair<mla::Mutant, mla::Mutant> pairs[] = {
      {mla::Mutant::kSplitEmptyNaN, mla::Mutant::kWrongScaleGroup}};
  for (const auto& [a, b] : pairs) {
    const auto causes = [](const std::string& sig) { return sig.substr(sig.find(" | ")); };
    const std::set<std::string> alone{causes(signature_of(a, 1)), causes(signature_of(b, 1))};
    ASSERT_EQ(alone.size(), 2u);
    TwoBugs both(a, b);
    std::set<std::string> groups = groups_of(both, 2);
    EXPECT_EQ(groups, alone) << both.traits().name << ", seeds 1 and 2; rerun: " << kRerun
                             << " --gtest_filter=Triage.TwoBugsPlantedTogetherGiveTheirTwoGroups";
  }
}

}  // namespace

}  // namespace mlafuzz

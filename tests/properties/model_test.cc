// Unit tests of the property layer: the tolerance model (a bound that a perturbed output
// violates and the exact one respects), the bf16 rounding interval, shrinking with a synthetic
// predicate, generator determinism and distribution, corpus round trips, the transformations.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "core/backend.h"
#include "core/fileio.h"
#include "core/materialize.h"
#include "core/rng.h"
#include "harness/backends/registry.h"
#include "mla/fp_formats.h"
#include "mla/mla_params.h"
#include "mla/tiling.h"
#include "oracle/oracle.h"
#include "properties/corpus.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/generators.h"
#include "properties/properties.h"
#include "properties/shrink.h"
#include "properties/tolerance.h"
#include "tests/core/build_paths.h"
#include "tests/core/test_util.h"
#include "tests/properties/reference_bounds.h"

namespace mlafuzz {
namespace {

using testing::small_case;

// The oracle's output rounded to bf16 (RNE), as a perfect bf16 kernel would store it.
RunResult rounded_oracle(const OracleResult& ref) {
  RunResult r;
  for (double v : ref.out) r.out.push_back(mla::round_to_bf16(static_cast<float>(v)));
  for (double v : ref.lse) r.lse.push_back(static_cast<float>(v));
  return r;
}

// Reports and corpus entries name the code they ran on: the commit is taken at every build.
TEST(Corpus, BuildCommitIsACommitOrUnknown) {
  const std::string c = build_commit();
  if (c == "unknown") GTEST_SKIP() << "built outside a git checkout";
  // Checked by hand: std::regex draws a false -Wmaybe-uninitialized from gcc 12 at -O3.
  const std::string hash = c.substr(0, 12), rest = c.size() > 12 ? c.substr(12) : "";
  EXPECT_EQ(hash.size(), 12u) << c;
  EXPECT_EQ(hash.find_first_not_of("0123456789abcdef"), std::string::npos) << c;
  EXPECT_TRUE(rest.empty() || rest == "-dirty") << c;
}

TEST(Tolerance, Bf16RoundingInterval) {
  double lo, hi;
  bf16_rounding_interval(1.0, &lo, &hi);
  EXPECT_EQ(lo, 1.0 - 0x1p-9);  // the spacing below a power of two is half the one above
  EXPECT_EQ(hi, 1.0 + 0x1p-8);
  bf16_rounding_interval(-1.5, &lo, &hi);
  EXPECT_EQ(lo, -1.5 - 0x1p-8);
  EXPECT_EQ(hi, -1.5 + 0x1p-8);
  bf16_rounding_interval(0.0, &lo, &hi);
  EXPECT_EQ(lo, -0x1p-134);
  EXPECT_EQ(hi, 0x1p-134);
  // Every float in the interval rounds to the value (spot checks at the ends).
  bf16_rounding_interval(3.0, &lo, &hi);
  EXPECT_EQ(mla::round_to_bf16(static_cast<float>(std::nextafter(hi, 0.0))), 3.0f);
  EXPECT_EQ(mla::round_to_bf16(static_cast<float>(std::nextafter(lo, 10.0))), 3.0f);
}

TEST(Tolerance, ExactOutputPassesAndPerturbedOutputFails) {
  const MaterializedCase m = materialize(small_case());
  const OracleResult ref = run_oracle_eigen(m);
  for (Precision p : {Precision::kSimtFp32, Precision::kMmaBf16}) {
    const Bounds bd = compute_bounds(m, ref, pipeline_for(p));
    RunResult exact = rounded_oracle(ref);
    const Side refside{&ref.out, &ref.lse, false};
    BoundCheck bc =
        check_bounds(Side{&exact.out, &exact.lse, true}, refside, bd, m.batch, m.heads, m.d_v());
    EXPECT_TRUE(bc.passed) << bc.describe();
    EXPECT_EQ(bc.out_tightness, 0) << "RNE(O) lies in its own rounding interval";
    // Perturb one element by three times its bound beyond the rounding interval.
    const size_t i = 5 * static_cast<size_t>(m.d_v()) + 17;
    RunResult bad = exact;
    bad.out[i] = ref.out[i] + 3 * bd.out[i] + std::fabs(ref.out[i]) * 0x1p-7;
    bc = check_bounds(Side{&bad.out, &bad.lse, true}, refside, bd, m.batch, m.heads, m.d_v());
    EXPECT_FALSE(bc.passed);
    EXPECT_GT(bc.tightness, 1.0);
    EXPECT_EQ(bc.b, 1);  // flat row 5 = b 1, h 2
    EXPECT_EQ(bc.h, 2);
    EXPECT_EQ(bc.d, 17);
    // LSE: a perturbation of twice the bound fails.
    RunResult badl = exact;
    badl.lse[3] = ref.lse[3] + 2 * bd.lse[3];
    bc = check_bounds(Side{&badl.out, &badl.lse, true}, refside, bd, m.batch, m.heads, m.d_v());
    EXPECT_FALSE(bc.passed);
    EXPECT_EQ(bc.d, -1);
  }
}

TEST(Tolerance, MmaBoundContainsTheBf16PTermAndExceedsSimt) {
  const MaterializedCase m = materialize(small_case());
  const OracleResult ref = run_oracle_eigen(m);
  const Bounds simt = compute_bounds(m, ref, pipeline_for(Precision::kSimtFp32));
  const Bounds mma = compute_bounds(m, ref, pipeline_for(Precision::kMmaBf16));
  const Bounds f64 = compute_bounds(m, ref, pipeline_for(Precision::kFloat64));
  for (size_t i = 0; i < simt.out.size(); ++i) {
    EXPECT_GT(mma.out[i], simt.out[i]);
    EXPECT_GT(simt.out[i], 1e6 * f64.out[i]);  // fp32 vs float64 unit roundoff: 2^29 apart
  }
}

TEST(Tolerance, EmptyRowsAndPlusInfSinkDemandExactZero) {
  Case c = small_case();
  c.batch = 1;
  c.heads = 2;
  c.indices = {{-1, -1, -1, -1, -1, -1, -1}};
  const MaterializedCase m = materialize(c);
  const OracleResult ref = run_oracle_eigen(m);
  const Bounds bd = compute_bounds(m, ref, pipeline_for(Precision::kSimtFp32));
  for (double b : bd.out) EXPECT_EQ(b, 0.0);
  RunResult r = rounded_oracle(ref);
  const Side refside{&ref.out, &ref.lse, false};
  EXPECT_TRUE(check_bounds(Side{&r.out, &r.lse, true}, refside, bd, 1, 2, m.d_v()).passed);
  r.out[3] = 1e-30;  // anything but zero is wrong
  EXPECT_FALSE(check_bounds(Side{&r.out, &r.lse, true}, refside, bd, 1, 2, m.d_v()).passed);
  r = rounded_oracle(ref);
  r.lse[1] = -HUGE_VAL;  // the wrong infinity for the FlashMLA convention
  const BoundCheck bc = check_bounds(Side{&r.out, &r.lse, true}, refside, bd, 1, 2, m.d_v());
  EXPECT_FALSE(bc.nonfinite_match);

  c = small_case();
  c.sink = std::vector<double>{HUGE_VAL, 0.5, -HUGE_VAL};
  const MaterializedCase ms = materialize(c);
  const OracleResult refs = run_oracle_eigen(ms);
  const Bounds bs = compute_bounds(ms, refs, pipeline_for(Precision::kMmaBf16));
  for (int d = 0; d < ms.d_v(); ++d) EXPECT_EQ(bs.out[static_cast<size_t>(d)], 0.0);
  EXPECT_GT(bs.out[static_cast<size_t>(ms.d_v())], 0.0);
}

TEST(Tolerance, HostModelsSitUnderTheBound) {
  const MaterializedCase m = materialize(small_case());
  const OracleResult ref = run_oracle_eigen(m);
  for (const char* name : {"cpu-simt", "cpu-mma"}) {
    auto be = make_backend(name);
    const RunResult r = be->run(m);
    ASSERT_TRUE(r.ok()) << r.message;
    const Bounds bd = add_bounds(compute_bounds(m, ref, pipeline_for(be->traits().precision)),
                                 compute_bounds(m, ref, pipeline_for(Precision::kFloat64)));
    const BoundCheck bc = check_bounds(Side{&r.out, &r.lse, true}, Side{&ref.out, &ref.lse, false},
                                       bd, m.batch, m.heads, m.d_v());
    EXPECT_TRUE(bc.passed) << name << ": " << bc.describe();
    EXPECT_LT(bc.tightness, 0.5) << name;
  }
}

TEST(Transformations, PoisonMarksOnlyUnusedBytes) {
  Case c = small_case();
  c.indices = {{0, 1, -1, 7, 7, 14, 3}, {2, -1, -1, -1, -1, -1, -1}};
  c.topk_length = std::vector<int32_t>{5, 7};
  const MaterializedCase m = materialize(c);
  const std::vector<uint8_t> used = used_cache_bytes(m);
  const MaterializedCase p = poison_case(m, 0);
  size_t poisoned = 0;
  for (size_t i = 0; i < m.cache.size(); ++i) {
    if (used[i]) {
      EXPECT_EQ(p.cache[i], m.cache[i]);
    } else {
      poisoned += p.cache[i] == 0xff;
    }
  }
  EXPECT_GT(poisoned, m.cache.size() / 2);
  // Entries masked by topk_length now point at random in-range slots.
  const int64_t slots = mla::num_slots(m.geom);
  for (int k = 5; k < 7; ++k) {
    EXPECT_GE(p.indices[static_cast<size_t>(k)], 0);
    EXPECT_LT(p.indices[static_cast<size_t>(k)], slots);
  }
  // The unused MODEL1 scale byte (8 bytes, 7 scales) of a used token is poisoned.
  const mla::TokenAddress a = mla::token_address(m.geom, m.indices[0]);
  EXPECT_FALSE(used[static_cast<size_t>(a.scale + 7)]);
}

// Every variant poisons exactly q's pads (each head's pad, the gap after a token's heads and
// after a batch row's tokens), element i with its own draw, and keeps every q value: the
// per-element rule, checked on a case with every q pad and two query tokens.
TEST(Transformations, PoisonFillsExactlyTheQPads) {
  Case c = small_case();
  c.s_q = 2;
  c.q_head_pad = 3;
  c.q_batch_pad = 5;
  const MaterializedCase m = materialize(c);
  const int64_t heads_span = int64_t{m.heads} * m.q_head_stride;
  const int64_t tokens_span = int64_t{m.s_q} * m.q_token_stride;
  ASSERT_GT(m.q_batch_stride, tokens_span);
  ASSERT_GT(m.q_head_stride, m.d_qk());
  for (int variant = 0; variant < kPoisonVariants; ++variant) {
    const MaterializedCase p = poison_case(m, variant);
    ASSERT_EQ(p.q.size(), m.q.size());
    const CounterRng qrng(m.recipe.data_seed ^ static_cast<uint64_t>(variant), Stream::kPoison, 1);
    const uint16_t fixed[] = {0xffff, 0, 0x7f80, 0x7f7f};
    for (size_t i = 0; i < m.q.size(); ++i) {
      const int64_t in_row = static_cast<int64_t>(i) % m.q_batch_stride;
      const int64_t in_token = in_row % m.q_token_stride;
      const bool pad =
          in_row >= tokens_span || in_token >= heads_span || in_token % m.q_head_stride >= m.d_qk();
      const uint16_t want = !pad           ? m.q[i]
                            : variant == 1 ? static_cast<uint16_t>(qrng.at(i))
                                           : fixed[variant];
      ASSERT_EQ(p.q[i], want) << "variant " << variant << " element " << i << " pad " << pad;
    }
  }
}

// Every byte of the transformed cases (content_hash of each, mixed per case), pinned for the
// first generated cases of seed 21: the variants' builders may get faster, never different.
TEST(Transformations, VariantsKeepTheirBytes) {
  const uint64_t want[] = {
      0xef9f5ec4c8824c58ull,  // case 0: B 1 H 63
      0xf7d933c25be75d74ull,  // case 1: B 1 H 4
      0x5e93818fdf4e8ef2ull,  // case 2: B 1 H 4
      0x66cada3f8df828caull,  // case 3: B 1 H 43, extra cache
      0xbc14c7154d884e23ull,  // case 4: B 2 H 63
      0x3de0bff6ab8d976dull,  // case 5: B 3 H 3, extra cache
      0x9a66fa38e59312bfull,  // case 6: B 1 H 39, extra cache
      0xa3e362a1d82c4e3bull,  // case 7: B 4 H 2
  };
  for (uint64_t i = 0; i < std::size(want); ++i) {
    const MaterializedCase m = materialize(generate_case(21, i, GenConfig{}, nullptr));
    uint64_t h = content_hash(m);
    const auto mix = [&](const MaterializedCase& v) { h = h * 1099511628211ull ^ content_hash(v); };
    for (int v = 0; v < kPoisonVariants; ++v) mix(poison_case(m, v));
    mix(relocate_pages(m, m.recipe.data_seed + 17, 1));
    mix(relocate_pages(m, m.recipe.data_seed + 18, 64));
    mix(permute_indices(m, m.recipe.data_seed + 29));
    mix(insert_invalid(m, m.recipe.data_seed + 31, 2));
    if (m.has_extra) mix(swap_caches(m));
    mix(move_to_extra(m, m.recipe.data_seed + 37, 2));
    mix(batch_alone(m, m.batch - 1));
    mix(head_alone(m, m.heads - 1));
    EXPECT_EQ(h, want[i]) << "case " << i << " of seed 21; rerun: property_model_tests "
                          << "--gtest_filter=Transformations.VariantsKeepTheirBytes";
  }
}

// The variants that keep a cache's bytes read the case's very buffer (CacheBytes: no copy per
// variant); those that write a cache get one of their own, and the case's bytes never change.
TEST(Transformations, VariantsThatKeepACacheShareIt) {
  const MaterializedCase m = materialize(generate_case(21, 3, GenConfig{}, nullptr));
  ASSERT_TRUE(m.has_extra) << "case 3 of seed 21 was generated with an extra cache";
  const uint64_t before = content_hash(m);
  const auto shares_both = [&](const MaterializedCase& v, const char* name) {
    EXPECT_TRUE(v.cache.shares(m.cache)) << name;
    EXPECT_TRUE(v.extra_cache.shares(m.extra_cache)) << name;
  };
  shares_both(permute_indices(m, 29), "permute");
  shares_both(insert_invalid(m, 31, 2), "insert-invalid");
  shares_both(batch_alone(m, 0), "batch-alone");
  shares_both(query_alone(m, 0, 0), "query-alone");
  shares_both(head_alone(m, m.heads - 1), "head-alone");
  const MaterializedCase moved = move_to_extra(m, 37, 2);
  EXPECT_TRUE(moved.cache.shares(m.cache));
  EXPECT_FALSE(moved.extra_cache.shares(m.extra_cache));  // grown by the moved tokens
  const MaterializedCase swapped = swap_caches(m);
  EXPECT_TRUE(swapped.cache.shares(m.extra_cache));
  EXPECT_TRUE(swapped.extra_cache.shares(m.cache));
  for (const MaterializedCase& v : {poison_case(m, 0), relocate_pages(m, 17, 1)}) {
    EXPECT_FALSE(v.cache.shares(m.cache));
    EXPECT_FALSE(v.extra_cache.shares(m.extra_cache));
  }
  EXPECT_EQ(content_hash(m), before);
}

TEST(Transformations, RelocatedCaseMatchesTheOracleBitForBit) {
  const MaterializedCase m = materialize(small_case());
  const MaterializedCase r = relocate_pages(m, 5);
  EXPECT_NE(r.cache, m.cache);
  const OracleResult a = run_oracle_loop(m), b = run_oracle_loop(r);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  const MaterializedCase ins = insert_invalid(m, 3, 2);
  EXPECT_EQ(ins.topk, m.topk + 2);
  const OracleResult c = run_oracle_loop(ins);
  for (size_t i = 0; i < a.out.size(); ++i) EXPECT_NEAR(a.out[i], c.out[i], 1e-12);
}

TEST(Shrink, SyntheticPredicateShrinksToTheMinimum) {
  // "Fails" when some row has at least two valid entries: the minimum is B=1, H=1, topk=2.
  GenConfig cfg;
  Case big = generate_case(7, 3, cfg, nullptr);
  big = with_explicit_indices(big);
  big.batch = std::max(big.batch, 1);
  auto pred = [](const Case& c) {
    const CaseSize s = case_size(c);
    const Case e = with_explicit_indices(c);
    for (int32_t b = 0; b < e.batch; ++b) {
      int valid = 0;
      for (int32_t k = 0; k < e.topk; ++k) {
        const int32_t len = e.topk_length ? (*e.topk_length)[static_cast<size_t>(b)] : -1;
        valid += mla::index_valid(e.indices[static_cast<size_t>(b)][static_cast<size_t>(k)], k, len,
                                  e.conventions);
      }
      if (valid >= 2) return s.rows >= 1;
    }
    return false;
  };
  // Find a generated case that fails the predicate.
  uint64_t i = 0;
  while (!pred(big)) big = with_explicit_indices(generate_case(7, ++i, cfg, nullptr));
  const ShrinkResult r = shrink_case(big, pred, ShrinkLimits{});
  EXPECT_EQ(r.stopped_by, ShrinkStop::kFixedPoint);
  EXPECT_TRUE(pred(r.minimal));
  EXPECT_EQ(r.minimal.batch, 1);
  EXPECT_EQ(r.minimal.heads, 1);
  EXPECT_EQ(r.minimal.topk, 2);
  EXPECT_FALSE(r.minimal.sink.has_value());
  EXPECT_FALSE(r.minimal.topk_length.has_value());
  EXPECT_TRUE(r.minimal.page_order.empty());
  EXPECT_EQ(r.minimal.scales.mode, ScaleMode::kFixed);
  EXPECT_EQ(r.minimal.q_values.dist, ValueDist::kSmallInt);
  EXPECT_EQ(r.minimal.q_head_pad, 0);
  EXPECT_LE(r.minimal.geom.num_pages, 2);
  EXPECT_GT(r.steps, 0);
}

// A bug that needs valid tokens in two token tiles (a softmax rescale forgotten across tiles):
// removing list positions moves the later tokens into the first tile, so only turning entries
// into -1 in place reaches one valid token per tile.
TEST(Shrink, TwoTileBugKeepsOneValidTokenPerTile) {
  Case c = with_explicit_indices(small_case());
  c.batch = 1;
  c.topk = 160;
  c.topk_length.reset();
  c.indices.assign(1, std::vector<int32_t>(160));
  for (int k = 0; k < c.topk; ++k) c.indices[0][static_cast<size_t>(k)] = k % 8;
  ASSERT_NO_THROW(validate(c));
  const auto tiles_with_valid = [](const Case& x) {
    const Case e = with_explicit_indices(x);
    std::set<int> tiles;
    for (int k = 0; k < e.topk; ++k) {
      const int32_t len = e.topk_length ? (*e.topk_length)[0] : -1;
      if (mla::index_valid(e.indices[0][static_cast<size_t>(k)], k, len, e.conventions)) {
        tiles.insert(k / mla::kMmaTokenTile);
      }
    }
    return tiles.size() >= 2;
  };
  ASSERT_TRUE(tiles_with_valid(c));
  const ShrinkResult r = shrink_case(c, tiles_with_valid, ShrinkLimits{});
  EXPECT_EQ(r.stopped_by, ShrinkStop::kFixedPoint);
  EXPECT_TRUE(tiles_with_valid(r.minimal));
  EXPECT_EQ(case_size(r.minimal).valid_tokens, 2);
}

// A failure that only one (row, head) shows, through its q values: the shrinker keeps that row
// and head with their values (Case::q_source), so it ends at B = 1, H = 1. Without q_source the
// kept head would be renumbered to (0, 0) and draw other values, and the case could not shrink.
TEST(Shrink, KeptRowsAndHeadsKeepTheirQValues) {
  const Case c = with_explicit_indices(small_case());  // B = 2, H = 3
  const MaterializedCase m = materialize(c);
  const auto q_of = [](const MaterializedCase& x, int b, int h) {
    const auto at = x.q.begin() + (static_cast<int64_t>(b) * x.heads + h) * x.q_head_stride;
    return std::vector<uint16_t>(at, at + x.d_qk());
  };
  const std::vector<uint16_t> target = q_of(m, 1, 2);
  const auto shows = [&](const Case& x) {
    const MaterializedCase mx = materialize(x);
    for (int b = 0; b < mx.batch; ++b) {
      for (int h = 0; h < mx.heads; ++h) {
        if (q_of(mx, b, h) == target) return true;
      }
    }
    return false;
  };
  const ShrinkResult r = shrink_case(c, shows, ShrinkLimits{});
  EXPECT_EQ(r.minimal.batch, 1);
  EXPECT_EQ(r.minimal.heads, 1);
  ASSERT_TRUE(r.minimal.q_source.has_value());
  EXPECT_EQ(r.minimal.q_source->rows, std::vector<int32_t>{1});
  EXPECT_EQ(r.minimal.q_source->head_ids, std::vector<int32_t>{2});
  EXPECT_EQ(r.minimal.q_source->heads, 3);
}

TEST(Shrink, ThrowingPredicateRejectsTheCandidate) {
  const Case c = with_explicit_indices(small_case());
  const ShrinkResult r = shrink_case(
      c, [](const Case&) -> bool { throw std::runtime_error("cannot evaluate"); }, ShrinkLimits{});
  EXPECT_EQ(to_json(r.minimal), to_json(c));
  EXPECT_EQ(r.steps, 0);
}

// The count of evaluations decides where a shrink stops: a limit of exactly what the shrink
// needs reaches the same fixed point, one less stops one evaluation short and says so, and a
// limited shrink gives the same case every time.
TEST(Shrink, TheEvaluationLimitDecidesWhereItStops) {
  const Case c = with_explicit_indices(small_case());  // B = 2, H = 3
  const auto two_rows = [](const Case& x) { return x.batch >= 2; };
  const ShrinkResult full = shrink_case(c, two_rows, ShrinkLimits{});
  ASSERT_EQ(full.stopped_by, ShrinkStop::kFixedPoint);
  EXPECT_EQ(full.minimal.batch, 2);
  EXPECT_EQ(full.minimal.heads, 1);
  ASSERT_GT(full.evaluations, 2);

  const ShrinkResult exact = shrink_case(c, two_rows, {full.evaluations, 1e9});
  EXPECT_EQ(exact.stopped_by, ShrinkStop::kFixedPoint);
  EXPECT_EQ(exact.evaluations, full.evaluations);
  EXPECT_EQ(to_json(exact.minimal), to_json(full.minimal));

  const ShrinkLimits short_limits{full.evaluations / 2, 1e9};
  const ShrinkResult a = shrink_case(c, two_rows, short_limits);
  const ShrinkResult b = shrink_case(c, two_rows, short_limits);
  EXPECT_EQ(a.stopped_by, ShrinkStop::kEvaluations);
  EXPECT_STREQ(shrink_stop_name(a.stopped_by), "evaluations");
  EXPECT_TRUE(a.budget_exhausted());
  EXPECT_EQ(a.evaluations, short_limits.max_evaluations);
  EXPECT_EQ(to_json(a.minimal), to_json(b.minimal));
  EXPECT_EQ(a.steps, b.steps);

  const ShrinkResult none = shrink_case(c, two_rows, {0, 1e9});
  EXPECT_EQ(none.stopped_by, ShrinkStop::kEvaluations);
  EXPECT_EQ(none.evaluations, 0);
  EXPECT_EQ(to_json(none.minimal), to_json(c));
}

// The wall-clock cap is a safety net; a spent one (here: a negative cap, spent before the first
// evaluation, so the test does not depend on time) is reported as such.
TEST(Shrink, ASpentWallClockCapIsReported) {
  const Case c = with_explicit_indices(small_case());
  const ShrinkResult r = shrink_case(c, [](const Case&) { return true; }, {1000, -1});
  EXPECT_EQ(r.stopped_by, ShrinkStop::kSeconds);
  EXPECT_STREQ(shrink_stop_name(r.stopped_by), "seconds");
  EXPECT_EQ(r.evaluations, 0);
  EXPECT_EQ(to_json(r.minimal), to_json(c));
}

// A caller sees every accepted step as it is accepted (the case it keeps if the shrink is cut
// short), and its stop hook ends the shrink with the case so far.
TEST(Shrink, HooksSeeEachStepAndStopTheShrink) {
  const Case c = with_explicit_indices(small_case());  // B = 2, H = 3
  const auto two_rows = [](const Case& x) { return x.batch >= 2; };
  std::vector<std::string> seen;
  ShrinkHooks watch;
  watch.on_step = [&](const Case& k) { seen.push_back(to_json(k)); };
  const ShrinkResult full = shrink_case(c, two_rows, ShrinkLimits{}, {}, watch);
  ASSERT_EQ(full.stopped_by, ShrinkStop::kFixedPoint);
  ASSERT_EQ(static_cast<int>(seen.size()), full.steps);
  ASSERT_GE(full.steps, 2);
  EXPECT_EQ(seen.back(), to_json(full.minimal));

  // Stopped before the evaluation that would have given the second step: the first step's case.
  ShrinkHooks stop_early;
  int steps_seen = 0;
  stop_early.on_step = [&](const Case&) { ++steps_seen; };
  stop_early.stop = [&] { return steps_seen >= 1; };
  const ShrinkResult cut = shrink_case(c, two_rows, ShrinkLimits{}, {}, stop_early);
  EXPECT_EQ(cut.stopped_by, ShrinkStop::kStopped);
  EXPECT_STREQ(shrink_stop_name(cut.stopped_by), "stopped");
  EXPECT_TRUE(cut.budget_exhausted());
  EXPECT_EQ(cut.steps, 1);
  EXPECT_EQ(to_json(cut.minimal), seen.front());
}

TEST(Generators, SameSeedAndIndexGiveTheSameCase) {
  GenConfig cfg;
  for (uint64_t i = 0; i < 50; ++i) {
    std::vector<std::string> t1, t2;
    const Case a = generate_case(99, i, cfg, &t1);
    const Case b = generate_case(99, i, cfg, &t2);
    EXPECT_EQ(to_json(a), to_json(b)) << "index " << i;
    EXPECT_EQ(t1, t2);
    EXPECT_NE(to_json(a), to_json(generate_case(100, i, cfg, nullptr)));
  }
}

// A small envelope (a user's kernel that takes topk <= 50, B <= 2, H <= 8) must be honoured,
// not rejected: a weighted branch whose lower end lies above the maximum once threw
// "Invalid range" from RapidCheck.
TEST(Generators, SmallEnvelopesAreHonoured) {
  GenConfig cfg;
  cfg.max_topk = 50;
  cfg.max_batch = 2;
  cfg.max_heads = 8;
  for (uint64_t i = 0; i < 200; ++i) {
    const Case c = generate_case(7, i, cfg, nullptr);
    EXPECT_LE(c.topk, 50) << "index " << i;
    EXPECT_LE(c.batch, 2) << "index " << i;
    EXPECT_LE(c.heads, 8) << "index " << i;
  }
}

TEST(Generators, TagsCoverTheEdgeClassesAndCasesMaterialize) {
  GenConfig cfg;
  std::map<std::string, int> tags;
  const int n = 600;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> t;
    const Case c = generate_case(2026, static_cast<uint64_t>(i), cfg, &t);
    for (const auto& s : t) ++tags[s];
    if (i % 10 == 0) {
      const MaterializedCase m = materialize(c);  // throws on an invalid recipe
      EXPECT_LE(m.d_qk(), 512 + 64);
    }
  }
  for (const char* want : {"layout=model1",
                           "layout=v32",
                           "page_size=non-pow2",
                           "page_size=61",
                           "page_size=69",
                           "page_size=1",
                           "stride=padded",
                           "page_order=shuffled",
                           "pages=many",
                           "has_invalid",
                           "all_invalid_row",
                           "duplicates",
                           "page_edge_slot",
                           "topk%64!=0",
                           "topk_length=0",
                           "topk_length=partial",
                           "sink=+inf",
                           "sink=-inf",
                           "scales=random",
                           "scales=fixed",
                           "scales=extreme",
                           "values=ties",
                           "values=small_int",
                           "values=special",
                           "values=large-logits",
                           "nope=padded",
                           "conventions=non-default",
                           "head_pad",
                           "pad_fill=nan",
                           "pad_fill=garbage",
                           "family=production",
                           "family=edge",
                           "shape=production",
                           "B>4",
                           "H>16",
                           "topk>128"}) {
    EXPECT_GT(tags[want], 0) << "no generated case has tag " << want;
  }
  // Small most of the time.
  EXPECT_GT(tags["B=1"], n / 3);
  for (const auto& [k, v] : tags) std::cout << "  " << k << ": " << v << "\n";
}

TEST(Corpus, RoundTripAndStrictLoading) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("mlafuzz-corpus-test-" + std::to_string(::getpid())))
                              .string();
  const Case c = with_explicit_indices(small_case());
  PropertyOutcome o;
  o.property = "tolerance";
  o.backend = "cpu-mma";
  o.detail = "out[b=0,h=0,d=1] ...";
  o.error = 0.5;
  o.bound = 0.01;
  o.tightness = 50;
  Finding f = make_finding(o, c, 11, 12);
  EXPECT_EQ(f.expect, "fail");
  // The group: backend | kind | causes (of the case as given: make_finding does not shrink).
  EXPECT_EQ(f.kind, "bound excess");
  EXPECT_EQ(f.signature.rfind("cpu-mma | bound excess | ", 0), 0u) << f.signature;
  EXPECT_EQ(f.properties, std::vector<std::string>{"tolerance"});
  f.locus = "out[b0,h0] wrong only in d 1 (in scale group 0)";
  f.inputs = "inputs: ...";
  const std::string path = save_corpus_entry(dir, c, f);
  EXPECT_EQ(path, save_corpus_entry(dir, c, f)) << "same finding, same file";
  // One entry per group: the name depends on the signature alone.
  Case other = c;
  other.data_seed += 1;
  EXPECT_EQ(path, save_corpus_entry(dir, other, f)) << "another case of the group, same file";
  save_corpus_entry(dir, c, f);
  const CorpusEntry e = load_corpus_entry(path);
  EXPECT_EQ(to_json(e.c), to_json(c));
  EXPECT_EQ(e.f.property, "tolerance");
  EXPECT_EQ(e.f.signature, f.signature);
  EXPECT_EQ(e.f.kind, f.kind);
  EXPECT_EQ(e.f.causes, f.causes);
  EXPECT_EQ(e.f.properties, f.properties);
  EXPECT_EQ(e.f.locus, f.locus);
  EXPECT_EQ(e.f.inputs, f.inputs);
  EXPECT_EQ(e.f.seed, 11u);
  EXPECT_EQ(e.f.case_index, 12u);
  EXPECT_EQ(e.f.tightness, 50);
  EXPECT_EQ(to_json(load_case(path)), to_json(c)) << "load_case reads corpus entries";
  EXPECT_EQ(list_corpus(dir), std::vector<std::string>{path});
  nlohmann::ordered_json j = finding_to_json(f);
  j["bogus"] = 1;
  EXPECT_THROW(finding_from_json(j), CaseError);
  std::filesystem::remove_all(dir);
}

TEST(Corpus, NonfiniteMismatchIsAFlagAndOldEntriesLoad) {
  // Written by this build: the flag and an infinite tightness survive the round trip.
  Finding f;
  f.property = "tolerance";
  f.nonfinite_mismatch = true;
  f.tightness = HUGE_VAL;
  const Finding back = finding_from_json(finding_to_json(f));
  EXPECT_TRUE(back.nonfinite_mismatch);
  EXPECT_EQ(back.tightness, HUGE_VAL);
  f.nonfinite_mismatch = false;
  f.tightness = 2.5;
  EXPECT_FALSE(finding_from_json(finding_to_json(f)).nonfinite_mismatch);
  // Written before the flag existed: tightness 1e300 stood for a non-finite mismatch.
  nlohmann::ordered_json old = finding_to_json(f);
  old.erase("nonfinite_mismatch");
  old["tightness"] = 1e300;
  const Finding legacy = finding_from_json(old);
  EXPECT_TRUE(legacy.nonfinite_mismatch);
  EXPECT_EQ(legacy.tightness, 0);
  const CorpusEntry e = load_corpus_entry(std::string(mlafuzz::build_paths::kSourceDir) +
                                          "/corpus/regression/sink-in-lse-overflow.json");
  EXPECT_TRUE(e.f.nonfinite_mismatch) << "an entry saved with tightness 1e300";
}

// The shrink note is left out of an entry while empty, so that an entry without it (every entry
// written before it existed) means a shrink that ran to its end; a note round-trips.
TEST(Corpus, ShrinkNoteIsLeftOutWhenEmpty) {
  Finding f;
  f.property = "fault";
  EXPECT_FALSE(finding_to_json(f).contains("shrink_note"));
  EXPECT_EQ(finding_from_json(finding_to_json(f)).shrink_note, "");
  f.shrink_note = "the time budget ended while shrinking";
  const nlohmann::ordered_json j = finding_to_json(f);
  ASSERT_TRUE(j.contains("shrink_note"));
  EXPECT_EQ(finding_from_json(j).shrink_note, f.shrink_note);
  const CorpusEntry e = load_corpus_entry(std::string(mlafuzz::build_paths::kSourceDir) +
                                          "/corpus/regression/sink-in-lse-overflow.json");
  EXPECT_EQ(e.f.shrink_note, "") << "an entry written before the note existed";
}

// Corpus entries of format version 1 (findings before they were grouped) still load, replay the
// same case, and keep their old signature; versions this build does not know are refused.
TEST(Corpus, VersionOneEntriesLoadAndNewerOnesAreRefused) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("mlafuzz-corpus-v1-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  const Case c = with_explicit_indices(small_case());
  nlohmann::ordered_json j;
  j["format"] = "mlafuzz-corpus";
  j["version"] = 1;
  j["case"] = case_to_json_value(c);
  j["finding"] = {{"property", "poison"},
                  {"backend", "cpu-mma"},
                  {"backend_source", ""},
                  {"expect", "fail"},
                  {"detail", "poison fill 0 changed the output"},
                  {"signature", "poison|cpu-mma|model1 B2 H3-32 T3-8 P=pow2"},
                  {"error", 0.0},
                  {"bound", 0.0},
                  {"tightness", 0.0},
                  {"nonfinite_mismatch", false},
                  {"commit", "abc"},
                  {"gpu_name", ""},
                  {"driver_version", ""},
                  {"cuda_version", ""},
                  {"host", "h"},
                  {"found_at", "2026-11-29T08:00:00Z"},
                  {"seed", 1},
                  {"case_index", 2},
                  {"count", 3}};
  const std::string path = dir + "/poison-cpu-mma-0123456789abcdef.json";
  write_file_atomic(path, json_to_text(j));
  const CorpusEntry e = load_corpus_entry(path);
  EXPECT_EQ(to_json(e.c), to_json(c));
  EXPECT_EQ(e.f.signature, "poison|cpu-mma|model1 B2 H3-32 T3-8 P=pow2");
  EXPECT_EQ(e.f.count, 3);
  EXPECT_TRUE(e.f.kind.empty());
  EXPECT_TRUE(e.f.causes.empty());
  EXPECT_EQ(to_json(load_case(path)), to_json(c)) << "load_case reads version-1 entries";
  j["version"] = 3;
  write_file_atomic(path, json_to_text(j));
  EXPECT_THROW(load_corpus_entry(path), CaseError);
  EXPECT_THROW(load_case(path), CaseError);
  std::filesystem::remove_all(dir);
}

TEST(PropertyTable, NamesKindsAndFigures) {
  const std::vector<std::string> names = all_properties();
  ASSERT_EQ(names.size(), property_table().size());
  for (const PropertyInfo& p : property_table()) {
    EXPECT_EQ(find_property(p.name), &p);
    EXPECT_EQ(&property_info(p.id), &p);
  }
  std::set<std::string> figures;
  for (const auto& n : names) {
    if (has_error_figures(n)) figures.insert(n);
  }
  EXPECT_EQ(figures, (std::set<std::string>{"tolerance", "permute", "insert-invalid", "mma-vs-simt",
                                            "move-to-extra", "split-agree"}));
  EXPECT_FALSE(has_error_figures("fault")) << "the campaign's pseudo-property";
  EXPECT_EQ(find_property("fault"), nullptr);
  EXPECT_TRUE(property_info(PropertyId::kMmaVsSimt).needs_simt_partner);
}

TEST(PropertyTable, UnknownNamesListTheKnownOnes) {
  EXPECT_NO_THROW(check_property_names({"run", "poison"}));
  try {
    check_property_names({"tolerance", "toleranse"});
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("unknown property 'toleranse'"), std::string::npos) << what;
    EXPECT_NE(what.find("known: run, tolerance, poison"), std::string::npos) << what;
    EXPECT_NE(what.find("mma-vs-simt"), std::string::npos) << what;
  }
  auto be = make_backend("cpu-simt");
  EXPECT_THROW(evaluate_case(small_case(), {be.get()}, {"bogus"}), std::invalid_argument);
}

// cpu-simt with one output element replaced by NaN (a non-finite position mismatch).
class NanBackend : public TraitsBackend<Backend> {
 public:
  NanBackend() {
    traits_.name = "nan-simt";
    traits_.precision = Precision::kSimtFp32;
  }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    RunResult r = inner_->run(m);
    r.out[0] = std::nan("");
    r.out_raw[OutputBuffers::kGuard] = 0x7fc0;  // the same element in the raw buffer: bf16 NaN
    return r;
  }

 private:
  std::unique_ptr<Backend> inner_ = make_backend("cpu-simt");
};

TEST(Evaluate, NonfiniteMismatchIsFlaggedAndRankedFirst) {
  NanBackend nan;
  auto simt = make_backend("cpu-simt");
  const CaseEvaluation ev = evaluate_case(small_case(), {&nan, simt.get()}, {"run", "tolerance"});
  const PropertyOutcome* tol = nullptr;
  for (const auto& o : ev.outcomes) {
    if (o.property == "tolerance" && o.backend == "nan-simt") tol = &o;
    if (o.backend == "cpu-simt") {
      EXPECT_FALSE(o.nonfinite_mismatch);
    }
  }
  ASSERT_NE(tol, nullptr);
  EXPECT_FALSE(tol->passed);
  EXPECT_TRUE(tol->nonfinite_mismatch);
  EXPECT_LT(tol->tightness, 1e300) << "the finite elements' tightness, no sentinel";
  EXPECT_NE(format_outcome(*tol).find("non-finite mismatch"), std::string::npos);
  // Ranked above any finite excess, below failures without figures.
  PropertyOutcome finite = *tol, bitwise = *tol;
  finite.nonfinite_mismatch = false;
  finite.tightness = 1e30;
  bitwise.property = "poison";
  bitwise.nonfinite_mismatch = false;
  EXPECT_TRUE(failure_worse(*tol, finite));
  EXPECT_FALSE(failure_worse(finite, *tol));
  EXPECT_TRUE(failure_worse(bitwise, *tol));
  // An excess over a bound of 0 (a value that must be exact) ranks with the bitwise failures.
  PropertyOutcome zero_bound = finite;
  zero_bound.tightness = HUGE_VAL;
  EXPECT_TRUE(failure_worse(zero_bound, *tol));
  EXPECT_FALSE(failure_worse(bitwise, zero_bound));
  EXPECT_FALSE(failure_worse(zero_bound, bitwise));
}

// `mlafuzz run`'s verdict is the tolerance property: judge_runs gives the outcomes
// evaluate_case gives for the same clean runs.
TEST(Evaluate, JudgeRunsMatchesEvaluateCase) {
  auto simt = make_backend("cpu-simt"), mma = make_backend("cpu-mma");
  auto loop = make_backend("oracle-loop");
  const Case c = small_case();
  const MaterializedCase m = materialize(c);
  const RunResult rs = simt->run(m), rm = mma->run(m), rl = loop->run(m);
  const std::vector<PropertyOutcome> judged =
      judge_runs(m, {{simt.get(), &rs}, {mma.get(), &rm}, {loop.get(), &rl}});
  const CaseEvaluation ev =
      evaluate_case(c, {simt.get(), mma.get(), loop.get()}, {"run", "tolerance"});
  ASSERT_EQ(judged.size(), ev.outcomes.size());
  for (size_t i = 0; i < judged.size(); ++i) {
    EXPECT_EQ(judged[i].property, ev.outcomes[i].property);
    EXPECT_EQ(judged[i].backend, ev.outcomes[i].backend);
    EXPECT_EQ(judged[i].passed, ev.outcomes[i].passed);
    EXPECT_EQ(judged[i].tightness, ev.outcomes[i].tightness) << judged[i].backend;
    EXPECT_EQ(judged[i].detail, ev.outcomes[i].detail);
  }
}

// The worst element of a bound check is described with every digit: the bf16 value with its bits,
// the float64 reference with 17 digits, and the error in ulps of bf16 (out) or fp32 (lse).
TEST(BoundCheckDescribe, FullPrecisionValuesBitsAndUlps) {
  const std::vector<double> out_a{1.0078125}, out_b{1.0}, lse_a{8.662681579589844},
      lse_b{8.6626806259155273};
  Bounds bound;
  bound.out = {1e-9};
  bound.lse = {1e-12};
  const BoundCheck out_fail =
      check_bounds({&out_a, &lse_b, true}, {&out_b, &lse_b, false}, bound, 1, 1, 1);
  EXPECT_FALSE(out_fail.passed);
  const std::string d = out_fail.describe();
  EXPECT_NE(d.find("out[b=0,h=0,d=0] value 1.0078125 (bf16 0x3f81) reference 1 "),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("= 1 ulp (bf16)"), std::string::npos) << d;
  const std::vector<double> out_same{1.0};
  const BoundCheck lse_fail =
      check_bounds({&out_same, &lse_a, true}, {&out_same, &lse_b, false}, bound, 1, 1, 1);
  const std::string l = lse_fail.describe();
  EXPECT_NE(l.find("lse[b=0,h=0] value 8.66268158 (fp32 0x410a9a58) reference "
                   "8.6626806259155273 |error| 9.5367431640625e-07 = 1 ulp (fp32)"),
            std::string::npos)
      << l;
}

}  // namespace
}  // namespace mlafuzz

namespace mlafuzz {
namespace {

// The same doubles bit for bit (NaNs included).
bool bits_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// bf16_rounding_interval reads the exponent from the bits (check_bounds calls it for
// every element); the interval must be the ilogb/ldexp one for every bf16 value.
TEST(Tolerance, Bf16RoundingIntervalMatchesTheLibmFormForEveryBf16) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double v = mla::bf16_to_float(static_cast<uint16_t>(bits));
    if (!std::isfinite(v)) continue;
    const double a = std::fabs(v);
    double away, toward;
    if (a < 0x1p-126) {
      away = toward = 0x1p-134;
    } else {
      const int ex = std::ilogb(a);
      const double ulp = std::ldexp(1.0, ex - 7);
      away = ulp / 2;
      toward = (a == std::ldexp(1.0, ex) && ex > -126) ? ulp / 4 : ulp / 2;
    }
    double want_lo = v > 0 ? v - toward : v - away, want_hi = v > 0 ? v + away : v + toward;
    if (a == 0) {
      want_lo = -0x1p-134;
      want_hi = 0x1p-134;
    }
    double lo, hi;
    bf16_rounding_interval(v, &lo, &hi);
    ASSERT_EQ(lo, want_lo) << "bf16 0x" << std::hex << bits << "; rerun: property_model_tests "
                           << "--gtest_filter=Tolerance.Bf16RoundingIntervalMatchesTheLibmForm*";
    ASSERT_EQ(hi, want_hi) << "bf16 0x" << std::hex << bits << "; rerun: property_model_tests "
                           << "--gtest_filter=Tolerance.Bf16RoundingIntervalMatchesTheLibmForm*";
  }
}

// Every pipeline of every precision: joint, LSE-merged, and with split-KV toggled.
std::vector<BoundsRequest> every_pipeline() {
  std::vector<BoundsRequest> req;
  for (const Precision p : {Precision::kFloat64, Precision::kSimtFp32, Precision::kMmaBf16}) {
    Pipeline pl = pipeline_for(p);
    req.push_back({pl, 0});
    pl.lse_merged = true;
    req.push_back({pl, 0});
    pl.lse_merged = false;
    pl.split_kv = !pl.split_kv;
    req.push_back({pl, 0});
  }
  return req;
}

// Two bounds that must be equal up to the rounding of their sums: the same +inf, NaN and zero
// positions (bit for bit), elsewhere within 1e-12 relative, and 2^-46 (64 ulps of 1) absolute
// more for an LSE bound, whose log of a sum of ~1 moves by a few ulps of 1 with the order of
// that sum. Keeps the largest differences in worst: output relative, LSE absolute.
void expect_near_bounds(const std::vector<double>& want, const std::vector<double>& got, bool lse,
                        const std::string& where, double (&worst)[2]) {
  ASSERT_EQ(want.size(), got.size()) << where;
  for (size_t j = 0; j < want.size(); ++j) {
    const double a = want[j], b = got[j];
    if (!std::isfinite(a) || a == 0) {
      ASSERT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b))
          << "[" << j << "]: " << a << " vs " << b << ", " << where;
      continue;
    }
    const double d = std::fabs(a - b);
    worst[lse] = std::max(worst[lse], lse ? d : d / std::fabs(a));
    ASSERT_LE(d, 1e-12 * std::fabs(a) + (lse ? 0x1p-46 : 0.0))
        << "[" << j << "]: " << a << " vs " << b << ", " << where;
  }
}

// compute_bounds_set shares the pipeline-free work of several bounds; each bound must be the one
// compute_bounds gives alone, bit for bit (up to rounding for a pipeline repeated over a longer
// list: 1e-12 relative, and 2^-46 absolute for its LSE bound), for every pipeline (joint and
// LSE-merged, split-KV or not) and tile_topk, on generated cases of every family (sinks, extra
// caches, s_q > 1, empty rows, special values).
TEST(Tolerance, BoundsSetEqualsBoundsOneByOne) {
  GenConfig cfg;
  cfg.max_work = int64_t{1} << 15;
  const std::vector<BoundsRequest> req = every_pipeline();
  int compared = 0;
  double worst[2] = {0, 0};  // the longer lists' largest differences: out relative, lse absolute
  for (uint64_t i = 0; i < 40; ++i) {
    const MaterializedCase m = materialize(generate_case(31, i, cfg, nullptr));
    const OracleResult ref = run_oracle_eigen(m, 1);
    std::vector<BoundsRequest> r = req;
    r.push_back({pipeline_for(Precision::kMmaBf16), m.topk + 3});
    r.push_back({pipeline_for(Precision::kSimtFp32), m.topk + 64});
    const std::vector<Bounds> set = compute_bounds_set(m, ref, r);
    ASSERT_EQ(set.size(), r.size());
    for (size_t k = 0; k < r.size(); ++k) {
      const Bounds one = compute_bounds(m, ref, r[k].pipeline, r[k].tile_topk);
      ASSERT_EQ(one.out.size(), set[k].out.size());
      ASSERT_EQ(one.lse.size(), set[k].lse.size());
      // The last two are the same pipelines as requests 6 and 3 over longer lists: their sums
      // over V come from those requests' (exp(delta) S + expm1(delta) S_w), and their logit
      // errors' largest and LSE weight error are those requests' plus delta: the same values up
      // to rounding.
      if (k + 2 >= r.size()) {
        const std::string where = "case " + std::to_string(i) + " request " + std::to_string(k) +
                                  "; rerun: property_model_tests "
                                  "--gtest_filter=Tolerance.BoundsSetEqualsBoundsOneByOne";
        ASSERT_NO_FATAL_FAILURE(
            expect_near_bounds(one.out, set[k].out, false, "out, " + where, worst));
        ASSERT_NO_FATAL_FAILURE(
            expect_near_bounds(one.lse, set[k].lse, true, "lse, " + where, worst));
        ++compared;
        continue;
      }
      for (size_t j = 0; j < one.out.size(); ++j) {
        ASSERT_EQ(std::bit_cast<uint64_t>(one.out[j]), std::bit_cast<uint64_t>(set[k].out[j]))
            << "case " << i << " request " << k << " out[" << j << "]: " << one.out[j] << " vs "
            << set[k].out[j] << "; rerun: property_model_tests "
            << "--gtest_filter=Tolerance.BoundsSetEqualsBoundsOneByOne";
      }
      for (size_t j = 0; j < one.lse.size(); ++j) {
        ASSERT_EQ(std::bit_cast<uint64_t>(one.lse[j]), std::bit_cast<uint64_t>(set[k].lse[j]))
            << "case " << i << " request " << k << " lse[" << j << "]; rerun: "
            << "property_model_tests --gtest_filter=Tolerance.BoundsSetEqualsBoundsOneByOne";
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 40 * 11);
  std::printf("longer lists: largest differences out %.3g relative, lse %.3g absolute\n", worst[0],
              worst[1]);
}

// BoundsSetVisitor bounds a case from the oracle's own rows while the oracle computes it: the
// same bounds bit for bit as compute_bounds_set with the oracle's result, with one oracle thread
// or several (rows visited from several threads), for every pipeline on generated cases of every
// family and of the production family; the oracle's result does not change.
TEST(Tolerance, BoundsSetVisitorEqualsBoundsSet) {
  int compared = 0;
  for (const bool production : {false, true}) {
    GenConfig cfg;
    cfg.max_work = int64_t{1} << 15;
    if (production) cfg.families = {"production"};
    const uint64_t seed = production ? 38 : 31;
    for (uint64_t i = 0; i < (production ? 3u : 30u); ++i) {
      const MaterializedCase m = materialize(generate_case(seed, i, cfg, nullptr));
      std::vector<BoundsRequest> r = every_pipeline();
      r.push_back({pipeline_for(Precision::kMmaBf16), m.topk + 3});
      const OracleResult ref = run_oracle_eigen(m, 1);
      const std::vector<Bounds> want = compute_bounds_set(m, ref, r);
      for (const int threads : {1, 3}) {
        BoundsSetVisitor visitor(m, r);
        const OracleResult got_ref = run_oracle_eigen(m, threads, &visitor);
        const std::vector<Bounds> got = visitor.take();
        const std::string where = "seed " + std::to_string(seed) + " case " + std::to_string(i) +
                                  " threads " + std::to_string(threads) +
                                  "; rerun: property_model_tests "
                                  "--gtest_filter=Tolerance.BoundsSetVisitorEqualsBoundsSet";
        ASSERT_TRUE(bits_equal(got_ref.out, ref.out) && bits_equal(got_ref.lse, ref.lse)) << where;
        ASSERT_EQ(got.size(), want.size()) << where;
        for (size_t k = 0; k < r.size(); ++k) {
          ASSERT_TRUE(bits_equal(got[k].out, want[k].out)) << "request " << k << ", " << where;
          ASSERT_TRUE(bits_equal(got[k].lse, want[k].lse)) << "request " << k << ", " << where;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 33 * 10);
}

// Bounds built in recycled buffers (recycle_bounds: a campaign hands every case's bounds back)
// are the bounds built in fresh ones, bit for bit, whatever the buffers held: each buffer is
// filled with NaN before it goes back, so an element the builder leaves at its initial 0 (an
// empty row, a +inf sink's head, an exact LSE) shows, as a NaN (which no bound is), if the pool
// skipped the zeros.
TEST(Tolerance, RecycledBuffersGiveTheSameBounds) {
  GenConfig cfg;
  cfg.max_work = int64_t{1} << 15;
  const std::vector<BoundsRequest> r = every_pipeline();
  // Every case's bounds in fresh buffers first, before this test recycles any. Every third case
  // has a +inf sink on head 0 (its output exactly 0: a head whose output bounds stay 0).
  std::vector<MaterializedCase> cases;
  std::vector<OracleResult> refs;
  std::vector<std::vector<Bounds>> wants;
  int inf_sinks = 0;
  for (uint64_t i = 0; i < 30; ++i) {
    cases.push_back(materialize(generate_case(31, i, cfg, nullptr)));
    MaterializedCase& m = cases.back();
    if (i % 3 == 0) {
      if (m.sink.empty()) m.sink.assign(m.heads, -std::numeric_limits<float>::infinity());
      m.sink[0] = std::numeric_limits<float>::infinity();
    }
    for (const float s : m.sink) inf_sinks += s == std::numeric_limits<float>::infinity();
    refs.push_back(run_oracle_eigen(m, 1));
    wants.push_back(compute_bounds_set(cases.back(), refs.back(), r));
  }
  int reused = 0, compared = 0;
  const auto is_nan = [](double x) { return std::isnan(x); };
  for (size_t i = 0; i < cases.size(); ++i) {
    const MaterializedCase& m = cases[i];
    const OracleResult& ref = refs[i];
    const std::vector<Bounds>& want = wants[i];
    std::vector<Bounds> old = compute_bounds_set(m, ref, r);
    std::vector<const double*> given;
    for (Bounds& b : old) {
      std::fill(b.out.begin(), b.out.end(), std::numeric_limits<double>::quiet_NaN());
      std::fill(b.lse.begin(), b.lse.end(), std::numeric_limits<double>::quiet_NaN());
      given.push_back(b.out.data());
      recycle_bounds(std::move(b));
    }
    const std::vector<Bounds> got = compute_bounds_set(m, ref, r);
    const std::string where = "seed 31 case " + std::to_string(i) +
                              "; rerun: property_model_tests "
                              "--gtest_filter=Tolerance.RecycledBuffersGiveTheSameBounds";
    ASSERT_EQ(got.size(), want.size()) << where;
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_TRUE(bits_equal(got[k].out, want[k].out)) << "request " << k << ", " << where;
      ASSERT_TRUE(bits_equal(got[k].lse, want[k].lse)) << "request " << k << ", " << where;
      ASSERT_TRUE(std::none_of(got[k].out.begin(), got[k].out.end(), is_nan) &&
                  std::none_of(got[k].lse.begin(), got[k].lse.end(), is_nan))
          << "request " << k << ", " << where;
      reused += std::find(given.begin(), given.end(), got[k].out.data()) != given.end();
      ++compared;
    }
  }
  EXPECT_EQ(compared, 30 * static_cast<int>(r.size()));
  EXPECT_GE(inf_sinks, 10);
  // The larger cases' output bounds (64 KiB and more) come from the pool.
  EXPECT_GT(reused, 0);
}

// move-to-extra's variant (entries moved into a longer extra list, or the two caches swapped)
// has the case's valid tokens and exact result in other lists. A joint pipeline reads the lists
// only through their lengths, so the campaign bounds the variant as the case at the variant's
// list lengths (compute_bounds with extra_topk, its sums over V derived from the case's own in
// one set; a swap: the case's own bound). That equals the bound computed on the variant up to
// the order of its sums: within a relative 1e-12, the same +inf and zero positions, for every
// joint pipeline (split-KV or not) on generated cases with and without an extra cache and of
// the production family. The LSE bound's log of a sum of ~1 (lse_weight_error, token by token)
// moves by a few ulps of 1 with the order of the tokens: within 2^-46 (64 ulps of 1) absolute
// there. Prints the largest differences seen. An LSE-merged pipeline cannot take another extra
// list length. MLAFUZZ_TEST_QUICK=1: of the 40 generated cases, those with an extra cache and
// the first 6 without one; 1 production case of 3.
TEST(Tolerance, MovedToExtraBoundIsTheCaseBoundAtTheVariantLengths) {
  const int without_extra = testing::full_or_quick(40, 6);
  const uint64_t production_cases = testing::full_or_quick(3u, 1u);
  double worst[2] = {0, 0};  // output relative, LSE absolute
  const auto near = [&](const std::vector<double>& want, const std::vector<double>& got, bool lse,
                        const std::string& where) {
    ASSERT_NO_FATAL_FAILURE(expect_near_bounds(want, got, lse, where, worst));
  };
  std::vector<BoundsRequest> joint;
  for (const BoundsRequest& r : every_pipeline()) {
    if (!r.pipeline.lse_merged) joint.push_back(r);
  }
  int compared = 0, with_extra = 0, cases = 0, no_extra = 0;
  for (const bool production : {false, true}) {
    GenConfig cfg;
    cfg.max_work = int64_t{1} << 15;
    if (production) cfg.families = {"production"};
    const uint64_t seed = production ? 38 : 31;
    for (uint64_t i = 0; i < (production ? production_cases : 40u); ++i) {
      const MaterializedCase m = materialize(generate_case(seed, i, cfg, nullptr));
      if (!m.has_extra && no_extra++ >= without_extra) continue;
      const OracleResult ref = run_oracle_eigen(m, 1);
      with_extra += m.has_extra ? 1 : 0;
      ++cases;
      const int count = 1 + static_cast<int>(i % 4);
      const MaterializedCase moved = move_to_extra(m, m.recipe.data_seed + 37, count);
      const int moved_extra = move_to_extra_topk(m, count);
      ASSERT_EQ(moved.extra_topk, moved_extra);
      // The campaign's set: each pipeline at the case's lengths, then at the variant's.
      std::vector<BoundsRequest> set;
      for (const BoundsRequest& r : joint) {
        set.push_back(r);
        set.push_back({r.pipeline, 0, moved_extra});
      }
      const std::vector<Bounds> got = compute_bounds_set(m, ref, set);
      // Computed on the variants (one set each: the same bits as one compute_bounds per
      // pipeline, Tolerance.BoundsSetEqualsBoundsOneByOne).
      const std::vector<Bounds> on_moved = compute_bounds_set(moved, ref, joint);
      const std::vector<Bounds> on_swapped =
          m.has_extra ? compute_bounds_set(swap_caches(m), ref, joint) : std::vector<Bounds>{};
      for (size_t k = 0; k < joint.size(); ++k) {
        const std::string where = ": seed " + std::to_string(seed) + " case " + std::to_string(i) +
                                  " request " + std::to_string(k) +
                                  "; rerun: property_model_tests --gtest_filter="
                                  "Tolerance.MovedToExtraBoundIsTheCaseBoundAtTheVariantLengths";
        near(on_moved[k].out, got[2 * k + 1].out, false, "moved out" + where);
        near(on_moved[k].lse, got[2 * k + 1].lse, true, "moved lse" + where);
        const Bounds alone = compute_bounds(m, ref, joint[k].pipeline, 0, moved_extra);
        near(alone.out, got[2 * k + 1].out, false, "alone out" + where);
        near(alone.lse, got[2 * k + 1].lse, true, "alone lse" + where);
        if (m.has_extra) {
          near(on_swapped[k].out, got[2 * k].out, false, "swapped out" + where);
          near(on_swapped[k].lse, got[2 * k].lse, true, "swapped lse" + where);
        }
        ++compared;
      }
    }
    Pipeline merged = pipeline_for(Precision::kMmaBf16);
    merged.lse_merged = true;
    const MaterializedCase m = materialize(generate_case(seed, 0, cfg, nullptr));
    EXPECT_THROW(compute_bounds(m, run_oracle_eigen(m, 1), merged, 0, m.topk),
                 std::invalid_argument);
  }
  EXPECT_EQ(compared, cases * 6);
  EXPECT_GE(with_extra, 8) << "too few generated cases with an extra cache";
  std::cout << "[moved-to-extra] " << with_extra << " of " << cases
            << " cases with an extra cache; largest differences: out " << worst[0]
            << " relative, lse " << worst[1] << " absolute\n";
}

// The bounds are the formulas of tolerance.h evaluated with their sums over the tokens as matrix
// products shared by the row's heads: each equals the token-by-token form (frozen in
// reference_compute_bounds.cc) up to the rounding of those sums, within a relative 1e-12 (or both
// are below 2^-1000, where absolute allowances of 2^-1074 per operation dominate; the longer
// lists' LSE bounds within 2^-46 more, as their log of a sum of ~1 is the base's), with the same
// +inf, NaN and zero positions, for every pipeline (joint and LSE-merged, split-KV or not, longer
// tile lists) on generated cases of every family and on the corpus. Prints the largest relative
// difference seen. MLAFUZZ_TEST_QUICK=1 leaves out the corpus cases above 2^18 of work
// (B * s_q * H * (topk + extra topk): model1_b16_topk512 and model1_b32_topk512,
// model1_b4_topk512's shape with more batch rows): the token-by-token reference costs minutes on
// them under the sanitizers.
TEST(Tolerance, BoundsEqualTheTokenByTokenForm) {
  const std::vector<BoundsRequest> req = every_pipeline();
  std::vector<std::pair<std::string, MaterializedCase>> cases;
  const int64_t max_corpus_work = testing::full_or_quick<int64_t>(INT64_MAX, int64_t{1} << 18);
  for (const char* dir : {"/corpus/cases", "/corpus/regression"}) {
    for (const std::string& path :
         list_corpus(std::string(mlafuzz::build_paths::kSourceDir) + dir)) {
      const Case c = load_corpus_entry(path).c;
      const int64_t topk = c.topk + (c.extra ? c.extra->topk : 0);
      if (int64_t{c.batch} * c.s_q * c.heads * topk > max_corpus_work) {
        std::cout << "MLAFUZZ_TEST_QUICK: left out " << path << "\n";
        continue;
      }
      cases.emplace_back(path, materialize(c));
    }
  }
  const size_t corpus_cases = cases.size();
  EXPECT_GE(corpus_cases, testing::full_or_quick<size_t>(20, 18))
      << "the corpus folders were not found";
  for (const bool production : {false, true}) {
    GenConfig cfg;
    cfg.max_work = int64_t{1} << 15;
    if (production) cfg.families = {"production"};
    const uint64_t seed = production ? 37 : 36;
    for (uint64_t i = 0; i < (production ? 2u : 24u); ++i) {
      cases.emplace_back("seed " + std::to_string(seed) + " case " + std::to_string(i) +
                             (production ? " (production family)" : ""),
                         materialize(generate_case(seed, i, cfg, nullptr)));
    }
  }
  double worst = 0;
  std::string worst_at = "none";
  int compared = 0;
  for (const auto& [name, m] : cases) {
    const OracleResult ref = run_oracle_eigen(m, 1);
    std::vector<BoundsRequest> r = req;
    r.push_back({pipeline_for(Precision::kMmaBf16), m.topk + 3});
    r.push_back({pipeline_for(Precision::kSimtFp32), m.topk + 64});
    const std::vector<Bounds> got = compute_bounds_set(m, ref, r);
    const std::vector<Bounds> want = reference::reference_compute_bounds_set(m, ref, r);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < r.size(); ++k) {
      for (const bool lse : {false, true}) {
        const std::vector<double>& g = lse ? got[k].lse : got[k].out;
        const std::vector<double>& w = lse ? want[k].lse : want[k].out;
        ASSERT_EQ(g.size(), w.size());
        // The element's name is built only where a message or the worst difference needs it:
        // one string per element made this loop the test's largest cost under the sanitizers.
        const auto where = [&](size_t j) {
          return name + " request " + std::to_string(k) + (lse ? " lse[" : " out[") +
                 std::to_string(j) + "]";
        };
        const char* rerun =
            "; rerun: property_model_tests "
            "--gtest_filter=Tolerance.BoundsEqualTheTokenByTokenForm";
        for (size_t j = 0; j < g.size(); ++j) {
          if (!std::isfinite(w[j]) || w[j] == 0) {
            ASSERT_EQ(std::bit_cast<uint64_t>(g[j]), std::bit_cast<uint64_t>(w[j]))
                << where(j) << ": " << g[j] << " vs the reference's " << w[j] << rerun;
            continue;
          }
          ASSERT_TRUE(std::isfinite(g[j])) << where(j) << ": " << g[j] << rerun;
          if (std::fabs(w[j]) < 0x1p-1000 && std::fabs(g[j]) < 0x1p-1000) continue;
          const double rel = std::fabs(g[j] - w[j]) / std::fabs(w[j]);
          if (rel > worst) {
            worst = rel;
            worst_at = where(j);
          }
          // The longer lists' LSE weight error is their base's plus delta (tolerance.cc,
          // HeadTail::e_max), the reference's a log of its own sum of ~1: a few ulps of 1 apart.
          const double allow = lse && k + 2 >= r.size() ? 0x1p-46 / std::fabs(w[j]) : 0.0;
          ASSERT_LE(rel, 1e-12 + allow)
              << where(j) << ": " << g[j] << " vs the reference's " << w[j] << rerun;
        }
      }
      ++compared;
    }
  }
  std::printf("largest relative difference to the token-by-token form: %.3g (%s)\n", worst,
              worst_at.c_str());
  EXPECT_EQ(compared, static_cast<int>(cases.size()) * 11);
}

// Backends of one precision whose pipelines differ (cpu-mma folds 64-token tiles, cpu-mma-small
// 32) are each judged under their own bound in one evaluation: the per-case bounds cache is
// keyed on the pipeline, so evaluating them together gives each the figures it gets alone (a
// key of precision and extra pipeline only gave cpu-mma the bound of whichever came first).
TEST(Evaluate, BackendsOfOnePrecisionWithOtherTilesKeepTheirOwnBounds) {
  Case c = small_case();
  c.geom.page_size = 64;
  c.geom.num_pages = 4;
  c.topk = 192;  // 3 tiles of 64, 6 of 32: the two bounds differ
  c.heads = 4;
  const auto mma = make_backend("cpu-mma");
  const auto small = make_backend("cpu-mma-small");
  const auto tolerance_of = [&](const std::vector<Backend*>& bes, const std::string& name) {
    const CaseEvaluation ev = evaluate_case(c, bes, {"tolerance"});
    for (const auto& o : ev.outcomes) {
      if (o.property == "tolerance" && o.backend == name) return o;
    }
    ADD_FAILURE() << "no tolerance outcome for " << name;
    return PropertyOutcome{};
  };
  const PropertyOutcome mma_alone = tolerance_of({mma.get()}, "cpu-mma");
  const PropertyOutcome small_alone = tolerance_of({small.get()}, "cpu-mma-small");
  ASSERT_NE(mma_alone.bound, small_alone.bound) << "the case must tell the two bounds apart";
  for (const std::vector<Backend*>& bes : {std::vector<Backend*>{small.get(), mma.get()},
                                           std::vector<Backend*>{mma.get(), small.get()}}) {
    const PropertyOutcome m = tolerance_of(bes, "cpu-mma");
    const PropertyOutcome s = tolerance_of(bes, "cpu-mma-small");
    EXPECT_EQ(m.bound, mma_alone.bound);
    EXPECT_EQ(m.tightness, mma_alone.tightness);
    EXPECT_EQ(s.bound, small_alone.bound);
    EXPECT_EQ(s.tightness, small_alone.tightness);
  }
}

}  // namespace
}  // namespace mlafuzz

namespace mlafuzz {
namespace {

constexpr double kInfD = std::numeric_limits<double>::infinity();

// One trial of CheckBoundsRowWiseEqualsTheElementLoop: sides a and b of B x H rows of dv values
// and their LSEs, two bounds, and side a also as a bf16 backend's raw buffers in `layout`.
struct RowCheckTrial {
  int32_t B = 0, H = 0, dv = 0;
  bool bf16_a = false, bf16_b = false;
  std::vector<double> ao, bo, al, bl;
  Bounds b1, b2;
  MaterializedCase layout;
  RunResult raw;
};

// The values and bounds of a trial, with every kind of value (bf16 and fp64 sides, NaN, +-inf,
// zeros, subnormals, ties of the largest ratio, bounds of 0 and +inf).
RowCheckTrial random_row_values(CounterRng& rng) {
  RowCheckTrial t;
  t.B = static_cast<int32_t>(rng.uniform_int(1, 3));
  t.H = static_cast<int32_t>(rng.uniform_int(1, 4));
  // Short rows, and rows of a production d_v.
  t.dv = static_cast<int32_t>(rng.bernoulli(0.8) ? rng.uniform_int(0, 40) : 512);
  t.bf16_a = rng.bernoulli(0.7);
  t.bf16_b = rng.bernoulli(0.5);
  const double special = rng.bernoulli(0.3) ? 0.02 : 0.0;  // some rows all finite
  // Values within 2^+-20, or within a narrow range (whose bf16 errors sum exactly in any
  // order: check_bounds then sums them in vectorized order).
  const int range = rng.bernoulli(0.5) ? 20 : static_cast<int>(rng.uniform_int(0, 4));
  const double tiny = rng.bernoulli(0.5) ? 0.05 : 0.0;  // zeros and bf16 subnormals
  const auto value = [&](bool bf16) {
    const double u = rng.uniform();
    if (u < special) return std::numeric_limits<double>::quiet_NaN();
    if (u < 2 * special) return rng.bernoulli(0.5) ? kInfD : -kInfD;
    if (u < 2 * special + tiny) return 0.0;
    if (u < 2 * special + 2 * tiny) return 0x1p-140 * (rng.uniform() - 0.5);  // bf16 subnormal
    double v =
        (rng.uniform() - 0.5) * std::ldexp(1.0, static_cast<int>(rng.uniform_int(-range, range)));
    if (bf16) v = mla::bf16_to_float(mla::float_to_bf16(static_cast<float>(v)));
    return v;
  };
  const size_t n = static_cast<size_t>(t.B) * t.H * t.dv, nl = static_cast<size_t>(t.B) * t.H;
  t.ao.resize(n);
  t.bo.resize(n);
  t.al.resize(nl);
  t.bl.resize(nl);
  for (size_t i = 0; i < n; ++i) {
    t.bo[i] = value(t.bf16_b);
    // Ties: often the same value as the other side, or one ulp of the format away.
    t.ao[i] = rng.bernoulli(0.3) ? t.bo[i] : value(t.bf16_a);
    const double u = rng.uniform();
    t.b1.out.push_back(u < 0.05 ? 0.0 : u < 0.08 ? kInfD : 1e-3 * rng.uniform());
    t.b2.out.push_back(rng.bernoulli(0.5) ? 0.0 : 1e-3 * rng.uniform());
    if (i > 0 && rng.bernoulli(0.2)) {  // an exact tie with the element before
      t.ao[i] = t.ao[i - 1];
      t.bo[i] = t.bo[i - 1];
      t.b1.out[i] = t.b1.out[i - 1];
      t.b2.out[i] = t.b2.out[i - 1];
    }
  }
  for (size_t i = 0; i < nl; ++i) {
    t.bl[i] = value(false);
    t.al[i] = rng.bernoulli(0.3) ? t.bl[i] : value(false);
    t.b1.lse.push_back(1e-4 * rng.uniform());
    t.b2.lse.push_back(1e-4 * rng.uniform());
  }
  return t;
}

// Side a also as a bf16 backend's raw buffers (strided, guard bands, s_q tokens per row): its
// values then bf16 (NaN and the infinities keep their class) and its lse fp32.
void add_raw_side_a(RowCheckTrial& t, CounterRng& rng) {
  const int32_t B = t.B, H = t.H, dv = t.dv;
  const int32_t s_q = B % 2 == 0 && rng.bernoulli(0.5) ? 2 : 1;
  MaterializedCase& layout = t.layout;
  layout.batch = B / s_q;
  layout.s_q = s_q;
  layout.heads = H;
  layout.out_head_stride = dv + rng.uniform_int(0, 3);
  layout.out_token_stride = H * layout.out_head_stride + rng.uniform_int(0, 5);
  layout.out_batch_stride = s_q * layout.out_token_stride + rng.uniform_int(0, 5);
  layout.lse_token_stride = H + rng.uniform_int(0, 2);
  layout.lse_batch_stride = s_q * layout.lse_token_stride + rng.uniform_int(0, 2);
  t.raw.out_raw.assign(OutputBuffers::out_elements(layout), OutputBuffers::kCanaryBits);
  t.raw.lse_raw.assign(OutputBuffers::lse_elements(layout), 0.0f);
  if (!t.bf16_a) return;
  for (size_t i = 0; i < t.ao.size(); ++i) {
    const uint16_t bits16 = mla::float_to_bf16(static_cast<float>(t.ao[i]));
    t.ao[i] = mla::bf16_to_float(bits16);
    const int64_t r = static_cast<int64_t>(i) / dv / H, h = static_cast<int64_t>(i) / dv % H;
    t.raw.out_raw[OutputBuffers::kGuard + r / s_q * layout.out_batch_stride +
                  r % s_q * layout.out_token_stride + h * layout.out_head_stride +
                  static_cast<int64_t>(i) % dv] = bits16;
  }
  for (size_t i = 0; i < t.al.size(); ++i) {
    t.al[i] = static_cast<float>(t.al[i]);
    const int64_t r = static_cast<int64_t>(i) / H, h = static_cast<int64_t>(i) % H;
    t.raw.lse_raw[OutputBuffers::kGuard + r / s_q * layout.lse_batch_stride +
                  r % s_q * layout.lse_token_stride + h] = static_cast<float>(t.al[i]);
  }
}

// Every figure, the worst element and the message of `got` those of `want`, bit for bit.
void expect_same_check(const BoundCheck& got, const BoundCheck& want, const std::string& why) {
  const auto bits = [](double v) { return std::bit_cast<uint64_t>(v); };
  EXPECT_EQ(got.passed, want.passed) << why;
  EXPECT_EQ(got.nonfinite_match, want.nonfinite_match) << why;
  EXPECT_EQ(got.nonfinite_detail, want.nonfinite_detail) << why;
  EXPECT_EQ(got.describe(), want.describe()) << why;
  EXPECT_EQ(got.b, want.b) << why;
  EXPECT_EQ(got.h, want.h) << why;
  EXPECT_EQ(got.d, want.d) << why;
  for (const auto& [x, y, what] :
       {std::tuple{got.tightness, want.tightness, "tightness"},
        std::tuple{got.value, want.value, "value"},
        std::tuple{got.reference, want.reference, "reference"},
        std::tuple{got.error, want.error, "error"}, std::tuple{got.excess, want.excess, "excess"},
        std::tuple{got.bound, want.bound, "bound"},
        std::tuple{got.max_abs, want.max_abs, "max_abs"},
        std::tuple{got.mean_abs, want.mean_abs, "mean_abs"},
        std::tuple{got.max_rel, want.max_rel, "max_rel"},
        std::tuple{got.lse_max_abs, want.lse_max_abs, "lse_max_abs"},
        std::tuple{got.out_max_ref, want.out_max_ref, "out_max_ref"},
        std::tuple{got.out_tightness, want.out_tightness, "out_tightness"},
        std::tuple{got.lse_tightness, want.lse_tightness, "lse_tightness"}}) {
    EXPECT_EQ(bits(x), bits(y)) << what << " " << x << " vs " << y << "; " << why;
  }
}

// check_bounds works row by row (a vectorized pass for rows finite on both sides, element by
// element otherwise), may add a second bound on the fly and may read a bf16 backend's raw
// buffers: every figure, the worst element and the message must be those of the element loop
// under add_bounds on the widened values, bit for bit, on rows with every kind of value (bf16
// and fp64 sides, NaN, +-inf, zeros, subnormals, ties of the largest ratio, bounds of 0 and
// +inf). The seed is printed on failure.
TEST(Tolerance, CheckBoundsRowWiseEqualsTheElementLoop) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    CounterRng rng(seed, Stream::kPoison, 40);
    RowCheckTrial t = random_row_values(rng);
    add_raw_side_a(t, rng);
    const Side a{&t.ao, &t.al, t.bf16_a}, b{&t.bo, &t.bl, t.bf16_b};
    for (const bool two : {false, true}) {
      const Bounds* second = two ? &t.b2 : nullptr;
      const BoundCheck want = reference::reference_check_bounds(
          a, b, two ? add_bounds(t.b1, t.b2) : t.b1, t.B, t.H, t.dv);
      const BoundCheck got =
          t.bf16_a && rng.bernoulli(0.5)
              ? check_bounds(raw_side(t.raw, t.layout), b, t.b1, second, t.B, t.H, t.dv)
              : check_bounds(a, b, t.b1, second, t.B, t.H, t.dv);
      const std::string why = "seed " + std::to_string(seed) + (two ? " (two bounds)" : "") +
                              "; rerun: property_model_tests --gtest_filter=Tolerance." +
                              "CheckBoundsRowWiseEqualsTheElementLoop";
      expect_same_check(got, want, why);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace mlafuzz

// GPU tests of the production decode (docs/SPEC.md section 8: an extra cache, s_q > 1, H = 128)
// on the CUDA kernels: hand-written and generated cases within the bound of the oracle and of the
// host model, poisoned unread bytes of both caches, BLOCK_H 32 == 64. Skipped without a CUDA
// device.
#include <gtest/gtest.h>

#include "tests/kernels/cuda/gpu_test_support.h"

namespace mlafuzz {
namespace {

using testing::check_within;
using testing::host_model_of;
using testing::kernel_bound;
using testing::kSeed;
using testing::random_cases;
using testing::Tightness;

// ---- the production decode (docs/SPEC.md section 8): extra cache, s_q > 1, H = 128 ----

// A production-shaped case: MODEL1 448 + 64, main topk 128 over P = 256 (4 pages), s_q query
// tokens per row, and (extra_topk > 0) an extra cache of extra_topk entries over pages of
// extra_page tokens (2048 slots), both lists random.
Case production_case(const std::string& name, int batch, int heads, int s_q, int extra_topk,
                     int extra_page, uint64_t seed) {
  Case c;
  c.name = name;
  c.geom.layout = mla::Layout::kModel1;
  c.geom.page_size = 256;
  c.geom.num_pages = 4;
  c.batch = batch;
  c.heads = heads;
  c.topk = 128;
  c.s_q = s_q;
  if (extra_topk > 0) {
    ExtraCache e;
    e.page_size = extra_page;
    e.num_pages = 2048 / extra_page;
    e.topk = extra_topk;
    c.extra = e;
  }
  c.data_seed = seed;
  return c;
}

// The hand-written production cases: FlashMLA's MODEL1 shapes and the extra cache's edges.
std::vector<Case> production_cases() {
  std::vector<Case> cases;
  {  // the V4-Flash decode with MTP: s_q = 3, extra 512 over P = 64, every stride padded
    Case c = production_case("s_q3-extra512-p64-h64-padded", 3, 64, 3, 512, 64, 1501);
    c.topk_length = std::vector<int32_t>{128, 77, 0};
    c.extra->topk_length = std::vector<int32_t>{512, 300, 65};
    c.q_head_pad = 8;
    c.out_head_pad = 4;
    c.q_batch_pad = 24;
    c.out_batch_pad = 6;
    c.indices_row_pad = 3;
    c.lse_row_pad = 5;
    c.pad_fill = Fill::kNaN;
    c.sink = std::vector<double>(64);
    for (int h = 0; h < 64; ++h) (*c.sink)[h] = h == 3 ? HUGE_VAL : h == 4 ? -HUGE_VAL : 0.1 * h;
    cases.push_back(c);
  }
  cases.push_back(production_case("extra1024-p2-h128", 2, 128, 1, 1024, 2, 1502));
  cases.push_back(production_case("s_q2-extra1024-p2-h128", 2, 128, 2, 1024, 2, 1503));
  cases.push_back(production_case("s_q3-h128-no-extra", 2, 128, 3, 0, 0, 1504));
  cases.push_back(production_case("s_q4-extra512-p64-h128", 4, 128, 4, 512, 64, 1505));
  {  // H not a multiple of BLOCK_H, an extra list not a multiple of the tile sizes
    Case c = production_case("s_q2-extra100-p3-h100", 2, 100, 2, 100, 2, 1506);
    c.extra->page_size = 3;
    c.extra->num_pages = 600;
    cases.push_back(c);
  }
  {  // every extra entry invalid: the main list alone
    Case c = production_case("extra-all-invalid", 2, 64, 2, 512, 64, 1507);
    c.extra->index_spec.invalid_fraction = 1.0;
    cases.push_back(c);
  }
  {  // extra_topk_length 0 in every row (one row empty in both caches), partial main lengths
    Case c = production_case("extra-topk-length-0", 3, 64, 3, 512, 64, 1508);
    c.topk_length = std::vector<int32_t>{128, 0, 5};
    c.extra->topk_length = std::vector<int32_t>{0, 0, 0};
    c.conventions.empty_lse = mla::EmptyRowLse::kNegInf;
    cases.push_back(c);
  }
  {  // the main cache empty (all invalid), the extra cache not
    Case c = production_case("main-all-invalid-extra-valid", 2, 64, 2, 512, 64, 1509);
    c.index_spec.invalid_fraction = 1.0;
    cases.push_back(c);
  }
  {  // the same tokens in both lists (same_values: extra token t holds main token t's values;
     // each counts twice), with some invalid entries on both sides
    Case c = production_case("same-token-both-lists", 2, 64, 2, 128, 64, 1510);
    c.extra->same_values = true;
    c.extra->num_pages = 1024 / 64;  // main slots: 4 * 256 = 1024
    for (int r = 0; r < c.query_rows(); ++r) {
      std::vector<int32_t> row(128);
      for (int k = 0; k < 128; ++k) row[k] = k % 17 == 5 ? -1 : (r * 131 + k * 7) % 1024;
      c.indices.push_back(row);
      c.extra->indices.push_back(row);
    }
    cases.push_back(c);
  }
  return cases;
}

class CudaProduction : public ::testing::TestWithParam<std::string> {};

// Each production case within the bound of the oracle and of the host model, deterministic,
// guards intact.
TEST_P(CudaProduction, HandWrittenCasesWithinBoundOfOracleAndHostModel) {
  SKIP_WITHOUT_DEVICE();
  const std::string name = GetParam();
  auto backend = make_backend(name);
  auto host = make_backend(host_model_of(name));
  for (const Case& c : production_cases()) {
    const MaterializedCase m = materialize(c);
    const std::string what = name + " " + c.name;
    ASSERT_FALSE(backend->unsupported(m)) << what << ": " << *backend->unsupported(m);
    const RunResult r = backend->run(m);
    ASSERT_TRUE(r.ok()) << what << ": " << r.message;
    const OracleResult ref = run_oracle_eigen(m, 1);
    const Bounds bd = kernel_bound(m, ref, *backend);
    const Tightness t = check_within(m, r, ref.out, ref.lse, bd, false, what + " vs oracle");
    const RunResult hr = host->run(m);
    ASSERT_TRUE(hr.ok()) << what << " host model: " << hr.message;
    const Tightness th =
        check_within(m, r, hr.out, hr.lse, add_bounds(bd, bd), true, what + " vs host model");
    const RunResult again = backend->run(m);
    ASSERT_TRUE(again.ok()) << again.message;
    EXPECT_TRUE(testing::same_bits(r, again)) << what << ": not deterministic";
    std::printf("[production] %s: tightness vs oracle out %.3g lse %.3g, vs %s out %.3g lse %.3g\n",
                what.c_str(), t.out, t.lse, host_model_of(name).c_str(), th.out, th.lse);
    if (HasFailure()) return;
  }
}

// Generated cases of the "production" and "edge" families (the generator's s_q, extra caches
// and their edges: an extra list all invalid, extra_topk_length 0, one token in both lists, one
// cache empty, extra pages of 1-3 tokens) inside the backend's envelope, against the oracle and
// the host model.
TEST_P(CudaProduction, GeneratedProductionAndEdgeCasesWithinBound) {
  SKIP_WITHOUT_DEVICE();
  const std::string name = GetParam();
  auto backend = make_backend(name);
  auto host = make_backend(host_model_of(name));
  GenConfig cfg;
  cfg.envelope = backend->traits().envelope;
  cfg.families = {"production", "edge"};
  const int cases = random_cases(200);
  std::printf("[seed] %s: %d cases of generate_case(0x%llx, i, production+edge)\n", name.c_str(),
              cases, static_cast<unsigned long long>(kSeed + 15));
  int multi = 0, extra = 0, h128 = 0;
  for (int i = 0; i < cases; ++i) {
    const Case c = generate_case(kSeed + 15, static_cast<uint64_t>(i), cfg, nullptr);
    const MaterializedCase m = materialize(c);
    const std::string what = name + " generated case " + std::to_string(i) +
                             " (B=" + std::to_string(m.batch) + " s_q=" + std::to_string(m.s_q) +
                             " H=" + std::to_string(m.heads) + " topk=" + std::to_string(m.topk) +
                             " extra_topk=" + std::to_string(m.has_extra ? m.extra_topk : 0) + ")";
    const RunResult r = backend->run(m);
    ASSERT_TRUE(r.ok()) << what << ": " << r.message;
    const OracleResult ref = run_oracle_eigen(m, 1);
    const Bounds bd = kernel_bound(m, ref, *backend);
    check_within(m, r, ref.out, ref.lse, bd, false, what + " vs oracle");
    const RunResult hr = host->run(m);
    ASSERT_TRUE(hr.ok()) << what << " host model: " << hr.message;
    check_within(m, r, hr.out, hr.lse, add_bounds(bd, bd), true, what + " vs host model");
    if (HasFailure()) return;
    multi += m.s_q > 1;
    extra += m.has_extra;
    h128 += m.heads == 128;
  }
  std::printf(
      "[production] %s: %d generated cases, %d with s_q > 1, %d with an extra cache, %d "
      "with H = 128\n",
      name.c_str(), cases, multi, extra, h128);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaProduction,
                         ::testing::Values("cuda-simt", "cuda-mma", "cuda-mma-h64",
                                           "cuda-mma-small", "cuda-mma-split",
                                           "cuda-mma-split-max"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// poison_unread for the extra cache: every extra-cache byte no valid extra entry reads becomes
// `poison` (random bytes when poison < 0), every masked extra index another value the kernel must
// ignore (another negative under kAnyNegative, a random slot past extra_topk_length).
void poison_unread_extra(MaterializedCase& m, int poison, uint64_t seed) {
  if (!m.has_extra) return;
  const mla::CacheGeometry& g = m.extra_geom;
  std::vector<uint8_t> read(m.extra_cache.size(), 0);
  auto mark = [&](int64_t at, int64_t len) {
    std::fill(read.begin() + at, read.begin() + at + len, uint8_t{1});
  };
  const int32_t tiles = mla::num_scale_tiles(g);
  auto len_of = [&](int32_t b) {
    return m.extra_topk_length.empty() ? -1 : m.extra_topk_length[static_cast<size_t>(b)];
  };
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t s = 0; s < m.s_q; ++s) {
      for (int32_t k = 0; k < m.extra_topk; ++k) {
        const int32_t idx = m.extra_index_at(b, s, k);
        if (!mla::index_valid(idx, k, len_of(b), m.conv)) continue;
        const mla::TokenAddress a = mla::token_address(g, idx);
        mark(a.nope, g.nope_dim);
        mark(a.rope, 2 * int64_t{g.rope_dim});
        mark(a.scale, g.layout == mla::Layout::kModel1 ? tiles : 4 * tiles);
      }
    }
  }
  CounterRng rng(seed, Stream::kPoison);
  CacheBytes::Vector& extra = m.extra_cache.mut();
  for (size_t i = 0; i < extra.size(); ++i) {
    if (!read[i]) extra[i] = static_cast<uint8_t>(poison >= 0 ? poison : rng.next() & 0xff);
  }
  const int64_t slots = mla::num_slots(g);
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t s = 0; s < m.s_q; ++s) {
      for (int32_t k = 0; k < m.extra_topk; ++k) {
        int32_t& idx = m.extra_indices[static_cast<size_t>(b * m.extra_indices_batch_stride +
                                                           s * m.extra_indices_token_stride + k)];
        if (mla::index_valid(idx, k, len_of(b), m.conv)) continue;
        if (len_of(b) >= 0 && k >= len_of(b) && idx >= 0) {
          idx = static_cast<int32_t>(rng.uniform_int(0, slots - 1));
        } else if (m.conv.invalid_index == mla::InvalidIndexRule::kAnyNegative) {
          idx = -static_cast<int32_t>(rng.uniform_int(1, 1 << 30));
        }
      }
    }
  }
}

// Bytes and entries of either cache that no valid entry reads change no output bit.
TEST_P(CudaProduction, PoisonedUnreadBytesOfBothCachesChangeNoBit) {
  SKIP_WITHOUT_DEVICE();
  auto backend = make_backend(GetParam());
  const std::vector<Case> cases = production_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    Case c = cases[i];
    c.conventions.invalid_index =
        i % 2 ? mla::InvalidIndexRule::kAnyNegative : mla::InvalidIndexRule::kMinusOneOnly;
    const MaterializedCase m = materialize(c);
    const RunResult r = backend->run(m);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.message;
    for (int f : {0xff, 0x7f, -1}) {
      MaterializedCase pm = m;
      testing::poison_unread(pm, f, kSeed + i);
      poison_unread_extra(pm, f, kSeed + 100 + i);
      const RunResult pr = backend->run(pm);
      ASSERT_TRUE(pr.ok()) << pr.message;
      EXPECT_EQ(pr.guard_violations, 0) << c.name;
      ASSERT_TRUE(testing::same_bits(r, pr))
          << GetParam() << " " << c.name << ": poison fill " << f << " changed the output";
    }
  }
}

// BLOCK_H 32 and 64 give the same bits on the production decode too (H = 128: four blocks of 32
// against two of 64 per query token).
TEST(CudaProductionMma, BlockH64GivesTheSameBitsAsBlockH32) {
  SKIP_WITHOUT_DEVICE();
  auto a = make_backend("cuda-mma"), b = make_backend("cuda-mma-h64");
  for (const Case& c : production_cases()) {
    const MaterializedCase m = materialize(c);
    const RunResult ra = a->run(m), rb = b->run(m);
    ASSERT_TRUE(ra.ok() && rb.ok()) << c.name << ": " << ra.message << rb.message;
    EXPECT_TRUE(testing::same_bits(ra, rb)) << c.name;
  }
}

}  // namespace
}  // namespace mlafuzz

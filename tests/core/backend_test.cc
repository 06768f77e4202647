// Canary-guarded output buffers: out-of-bounds and gap writes are counted, results collected.
#include "core/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/core/test_util.h"

namespace mlafuzz {
namespace {

MaterializedCase padded_case() {
  Case c = testing::small_case();
  c.out_head_pad = 4;
  return materialize(c);
}

// Writes every logical output element and LSE as a well-behaved kernel would.
void write_all(const MaterializedCase& m, OutputBuffers& b) {
  for (int32_t bb = 0; bb < m.batch; ++bb) {
    for (int32_t h = 0; h < m.heads; ++h) {
      for (int32_t d = 0; d < m.d_v(); ++d) {
        b.out_begin()[bb * b.out_batch_stride + h * b.out_head_stride + d] =
            mla::float_to_bf16(static_cast<float>(d) * 0.5f + static_cast<float>(h));
      }
      b.lse_begin()[bb * b.lse_batch_stride + h] = static_cast<float>(bb * 10 + h);
    }
  }
}

TEST(OutputBuffers, ShapeAndCanaries) {
  const MaterializedCase m = padded_case();
  OutputBuffers b(m);
  EXPECT_EQ(b.out_head_stride, 512 + 4);
  EXPECT_EQ(b.out_batch_stride, 3 * (512 + 4));
  EXPECT_EQ(b.out.size(), size_t(2 * OutputBuffers::kGuard + 2 * 3 * 516));
  EXPECT_EQ(b.lse.size(), size_t(2 * OutputBuffers::kGuard + 6));
  EXPECT_TRUE(std::isnan(mla::bf16_to_float(OutputBuffers::kCanaryBits)));
  EXPECT_EQ(b.guard_violations(m), 0);
  write_all(m, b);
  EXPECT_EQ(b.guard_violations(m), 0);
}

TEST(OutputBuffers, CountsWritesOutsideTheOutput) {
  const MaterializedCase m = padded_case();
  OutputBuffers b(m);
  write_all(m, b);
  b.out[0] = 0;                                        // before
  b.out[b.out.size() - 1] = 0;                         // after
  b.out_begin()[512] = 0;                              // gap of head 0
  b.out_begin()[b.out_batch_stride + 515] = 0;         // gap of the last element of row 1, head 0
  b.lse[OutputBuffers::kGuard - 1] = 1.0f;             // before lse
  b.lse[b.lse.size() - OutputBuffers::kGuard] = 1.0f;  // first element after lse
  EXPECT_EQ(b.guard_violations(m), 6);
}

TEST(OutputBuffers, CollectOutputsWidensTheLogicalRegion) {
  const MaterializedCase m = padded_case();
  OutputBuffers b(m);
  write_all(m, b);
  RunResult r = collect_outputs(m, b);
  EXPECT_TRUE(r.outputs_pending);
  EXPECT_TRUE(r.out.empty());
  finish_outputs(m, r, /*raw_outputs=*/false);
  EXPECT_FALSE(r.outputs_pending);
  EXPECT_TRUE(r.ok());
  ASSERT_EQ(r.out.size(), size_t(2 * 3 * 512));
  EXPECT_EQ(r.out[(1 * 3 + 2) * 512 + 7], 3.5 + 2);
  EXPECT_EQ(r.lse[1 * 3 + 2], 12.0);
  EXPECT_EQ(r.out_raw, b.out);
  EXPECT_EQ(r.guard_violations, 0);
  EXPECT_STREQ(precision_name(Precision::kMmaBf16), "mma-bf16");
}

// Batch-row gaps of out and lse are canaries like the guard bands: a kernel that writes row b at
// b * H * out_head_stride (or lse at b * H) instead of the strides it was given is caught.
TEST(OutputBuffers, RowGapsOfOutAndLseAreCanaries) {
  Case c = testing::small_case();
  c.out_head_pad = 4;
  c.out_batch_pad = 9;
  c.lse_row_pad = 2;
  const MaterializedCase m = materialize(c);
  OutputBuffers b(m);
  EXPECT_EQ(b.out_batch_stride, 3 * 516 + 9);
  EXPECT_EQ(b.lse_batch_stride, 3 + 2);
  EXPECT_EQ(b.out.size(), size_t(2 * OutputBuffers::kGuard + 2 * (3 * 516 + 9)));
  EXPECT_EQ(b.lse.size(), size_t(2 * OutputBuffers::kGuard + 2 * 5));
  write_all(m, b);
  EXPECT_EQ(b.guard_violations(m), 0);
  RunResult r = collect_outputs(m, b);
  finish_outputs(m, r, /*raw_outputs=*/false);
  EXPECT_EQ(r.lse[1 * 3 + 2], 12.0);  // read at b * lse_batch_stride + h
  EXPECT_EQ(r.out[(1 * 3 + 2) * 512 + 7], 3.5 + 2);
  b.out_begin()[3 * 516] = 0;                 // the gap after row 0's last head
  b.out_begin()[b.out_batch_stride - 1] = 0;  // its last element
  b.lse_begin()[3] = 0;                       // lse gap of row 0
  b.lse_begin()[b.lse_batch_stride + 4] = 0;  // lse gap of row 1
  EXPECT_EQ(b.guard_violations(m), 4);
}

// A bf16 backend that writes every output (write_all) and one guard element, and refuses cases
// with more than `max_heads` heads; it counts the calls it ran.
class WritesAll final : public TraitsBackend<Backend> {
 public:
  explicit WritesAll(int32_t max_heads) : max_heads_(max_heads) {
    traits_.name = "writes-all";
    traits_.precision = Precision::kSimtFp32;
  }
  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    if (m.heads > max_heads_) return "more than " + std::to_string(max_heads_) + " heads";
    return std::nullopt;
  }
  int ran = 0;

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    ++ran;
    OutputBuffers b(m);
    write_all(m, b);
    b.out[0] = 0;  // one guard violation
    return collect_outputs(m, std::move(b));
  }

 private:
  int32_t max_heads_;
};

// run_batch: one result per case in order, the unsupported ones not run; outputs widened by
// default, left raw (guard bands counted) when the call asks; on_result sees each result and can
// stop the batch; on_inputs brackets each case.
TEST(RunBatch, VerdictsOutputsAndCallbacks) {
  const MaterializedCase m = padded_case();  // 3 heads
  Case c = testing::small_case();
  c.heads = 5;
  const MaterializedCase wide = materialize(c);
  WritesAll be(3);
  const std::vector<const MaterializedCase*> cases{&m, &wide, &m};
  const std::vector<CheckedRun> widened = be.run_batch(cases);
  ASSERT_EQ(widened.size(), 3u);
  EXPECT_EQ(be.ran, 2);
  EXPECT_FALSE(widened[0].unsupported);
  ASSERT_TRUE(widened[1].unsupported);
  EXPECT_EQ(*widened[1].unsupported, "more than 3 heads");
  EXPECT_FALSE(widened[0].result.outputs_pending);
  EXPECT_EQ(widened[0].result.out[(1 * 3 + 2) * 512 + 7], 3.5 + 2);
  EXPECT_EQ(widened[0].result.guard_violations, 1);

  RunOptions o;
  o.raw_outputs = true;
  std::vector<std::pair<size_t, bool>> inputs;
  std::vector<size_t> seen;
  o.on_inputs = [&](size_t k, bool lend) { inputs.emplace_back(k, lend); };
  o.on_result = [&](size_t k, CheckedRun&) {
    seen.push_back(k);
    return k < 1;  // stop after the second case
  };
  const std::vector<CheckedRun> raw = be.run_batch(cases, o);
  ASSERT_EQ(raw.size(), 2u);
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(inputs,
            (std::vector<std::pair<size_t, bool>>{{0, true}, {0, false}, {1, true}, {1, false}}));
  EXPECT_EQ(be.ran, 3);  // the third case was not run
  EXPECT_TRUE(raw[0].result.outputs_pending);
  EXPECT_TRUE(raw[0].result.out.empty());
  EXPECT_EQ(raw[0].result.guard_violations, 1);
  EXPECT_EQ(raw[0].result.out_raw, widened[0].result.out_raw);

  const RunResult refused = be.run(wide);  // a batch of one, its verdict folded in
  EXPECT_EQ(refused.status, RunStatus::kUnsupported);
  EXPECT_EQ(refused.message, "more than 3 heads");
}

// A PipelinedBackend that logs its calls: "b<k>" when case k is begun, "f<k>" when finished.
class LogsCalls final : public TraitsBackend<PipelinedBackend> {
 public:
  LogsCalls() { traits_.name = "logs-calls"; }
  std::vector<std::string> log;

 protected:
  std::unique_ptr<Pending> begin_case(const MaterializedCase& m) override {
    auto p = std::make_unique<Call>();
    p->k = m.heads;  // the tests give case k k heads
    log.push_back("b" + std::to_string(p->k));
    return p;
  }
  RunResult finish_case(std::unique_ptr<Pending> pending) override {
    log.push_back("f" + std::to_string(dynamic_cast<Call&>(*pending).k));
    return RunResult{};
  }

 private:
  struct Call final : Pending {
    int32_t k = 0;
  };
};

// Case k is begun before case k-1 is finished, results delivered in order; one that on_result
// stops leaves the call begun behind it unfinished and undelivered.
TEST(RunBatch, PipelinedBackendOverlapsTwoCalls) {
  std::vector<MaterializedCase> ms;
  for (int32_t k = 1; k <= 3; ++k) {
    Case c = testing::small_case();
    c.heads = k;
    ms.push_back(materialize(c));
  }
  const std::vector<const MaterializedCase*> cases{&ms[0], &ms[1], &ms[2]};
  LogsCalls be;
  RunOptions o;
  o.on_result = [&](size_t k, CheckedRun&) {
    be.log.push_back("r" + std::to_string(k + 1));
    return true;
  };
  EXPECT_EQ(be.run_batch(cases, o).size(), 3u);
  EXPECT_EQ(be.log,
            (std::vector<std::string>{"b1", "b2", "f1", "r1", "b3", "f2", "r2", "f3", "r3"}));
  be.log.clear();
  o.on_result = [&](size_t k, CheckedRun&) {
    be.log.push_back("r" + std::to_string(k + 1));
    return k != 0;
  };
  EXPECT_EQ(be.run_batch(cases, o).size(), 1u);
  EXPECT_EQ(be.log, (std::vector<std::string>{"b1", "b2", "f1", "r1"}));
}

}  // namespace
}  // namespace mlafuzz

// Canary-guarded output buffers: out-of-bounds and gap writes are counted, results collected.
#include "core/backend.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace mlafuzz

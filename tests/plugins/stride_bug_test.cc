// Every stride the plugin ABI passes is varied, so a kernel that ignores any one of them fails:
// the C example with one planted stride bug per variant (stride_bug_plugin.c) fails mlafuzz's
// properties on a case whose rows are padded, passes them where the strides are contiguous (the
// bug cannot show), and the correct variant passes both. The generator draws every pad.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <string>

#include "harness/backends/plugin_backend.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

const char* const kBugs[] = {"none",           "q batch stride",   "q head stride",
                             "indices stride", "out batch stride", "out head stride",
                             "lse stride"};

std::string plugin_path(int bug) {
  return std::string(mlafuzz::build_paths::kStridePluginDir) + "/libstride_bug_" +
         std::to_string(bug) + ".so";
}

// B = 3 rows (a row stride shows from row 1 on), every stride padded.
Case padded_case() {
  Case c;
  c.name = "every-stride-padded";
  c.geom.page_size = 64;
  c.geom.num_pages = 4;
  c.batch = 3;
  c.heads = 4;
  c.topk = 50;
  c.q_head_pad = 8;
  c.out_head_pad = 6;
  c.q_batch_pad = 13;
  c.out_batch_pad = 11;
  c.indices_row_pad = 7;
  c.lse_row_pad = 3;
  c.pad_fill = Fill::kGarbage;
  c.data_seed = 21;
  return c;
}

Case contiguous_case() {
  Case c = padded_case();
  c.q_head_pad = c.out_head_pad = c.q_batch_pad = c.out_batch_pad = c.indices_row_pad =
      c.lse_row_pad = 0;
  return c;
}

std::string failures_of(const CaseEvaluation& ev) {
  std::string s;
  for (const PropertyOutcome* o : ev.failures()) s += "\n  " + format_outcome(*o);
  return s;
}

TEST(StrideBugs, EachIgnoredStrideFailsOnPaddedRowsAndOnlyThere) {
  for (int bug = 0; bug <= 6; ++bug) {
    const auto plugin = load_plugin_backend(plugin_path(bug));
    ASSERT_EQ(plugin->traits().name, "plugin:stride-bug-" + std::to_string(bug));
    const std::vector<Backend*> backends{plugin.get()};
    const CaseEvaluation padded = evaluate_case(padded_case(), backends, {});
    const CaseEvaluation contiguous = evaluate_case(contiguous_case(), backends, {});
    std::cout << "stride bug " << bug << " (" << kBugs[bug] << "): padded case "
              << (padded.failed() ? "fails" : "passes") << failures_of(padded) << "\n";
    EXPECT_FALSE(contiguous.failed())
        << kBugs[bug] << ": the bug cannot show without pads" << failures_of(contiguous);
    if (bug == 0) {
      EXPECT_FALSE(padded.failed()) << "the correct kernel" << failures_of(padded);
    } else {
      ASSERT_TRUE(padded.failed()) << "a kernel that ignores the " << kBugs[bug]
                                   << " passed every property on a padded case";
    }
  }
}

// Which property catches which bug: a wrong read (q, indices) is a tolerance failure against the
// oracle; a wrong write (out, lse) leaves canaries in the output and writes into the row gaps.
TEST(StrideBugs, WrongWritesTouchTheCanariesWrongReadsMissTheBound) {
  const std::map<int, std::string> expected{{1, "tolerance"}, {2, "tolerance"}, {3, "tolerance"}};
  for (const auto& [bug, property] : expected) {
    const auto plugin = load_plugin_backend(plugin_path(bug));
    const CaseEvaluation ev = evaluate_case(padded_case(), {plugin.get()}, {property});
    EXPECT_TRUE(ev.failed()) << kBugs[bug] << " must fail " << property;
  }
  for (int bug : {4, 5, 6}) {
    const auto plugin = load_plugin_backend(plugin_path(bug));
    const RunResult r = plugin->run(materialize(padded_case()));
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_GT(r.guard_violations, 0) << kBugs[bug] << " wrote no row gap or head gap";
  }
}

TEST(StrideBugs, GeneratorDrawsEveryRowPadAndTagsIt) {
  std::map<std::string, int> tags;
  int padded = 0;
  const int n = 240;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> t;
    const Case c = generate_case(/*seed=*/5, static_cast<uint64_t>(i), GenConfig{}, &t);
    for (const std::string& s : t) ++tags[s];
    if (c.q_batch_pad || c.out_batch_pad || c.indices_row_pad || c.lse_row_pad) ++padded;
    if (i < 40) {
      const MaterializedCase m = materialize(c);
      // A batch row spans its s_q query tokens, then its pad.
      EXPECT_EQ(m.indices_batch_stride, c.s_q * c.topk + c.indices_row_pad);
      EXPECT_EQ(m.lse_batch_stride, c.s_q * c.heads + c.lse_row_pad);
      EXPECT_EQ(m.q_batch_stride, c.s_q * c.heads * (c.d_qk() + c.q_head_pad) + c.q_batch_pad);
      EXPECT_EQ(m.out_batch_stride, c.s_q * c.heads * (c.d_v() + c.out_head_pad) + c.out_batch_pad);
      if (c.extra) {
        EXPECT_EQ(m.extra_indices_batch_stride, c.s_q * c.extra->topk + c.indices_row_pad);
      }
    }
  }
  std::cout << "seed 5: " << padded << " of " << n << " cases pad batch rows\n";
  for (const char* tag : {"row_pad=q", "row_pad=out", "row_pad=indices", "row_pad=lse"}) {
    EXPECT_GE(tags[tag], 5) << tag;
  }
  EXPECT_GT(padded, n / 8);
  EXPECT_LT(padded, n / 2);
  GenConfig off;
  off.row_pads = false;
  for (int i = 0; i < 50; ++i) {
    const Case c = generate_case(5, static_cast<uint64_t>(i), off, nullptr);
    EXPECT_EQ(c.q_batch_pad + c.out_batch_pad + c.indices_row_pad + c.lse_row_pad, 0);
  }
}

}  // namespace
}  // namespace mlafuzz

// The report model: histogram, JSON round trip and strict loading, merge of shard reports equal
// to the single-run report, comparison of two nights, JUnit and HTML well-formedness.
#include "harness/campaign/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "core/fileio.h"
#include "harness/campaign/campaign.h"
#include "tests/harness/cli_helpers.h"

namespace mlafuzz::campaign {
namespace {

using Json = nlohmann::ordered_json;

TEST(LogHistogram, BinsAndQuantiles) {
  EXPECT_EQ(LogHistogram::bin_of(0), 0);
  EXPECT_EQ(LogHistogram::bin_of(1e-9), 0);
  EXPECT_EQ(LogHistogram::bin_of(INFINITY), LogHistogram::kBins - 1);
  EXPECT_EQ(LogHistogram::bin_of(NAN), LogHistogram::kBins - 1);
  EXPECT_EQ(LogHistogram::bin_of(1e7), LogHistogram::kBins - 1);
  for (double x : {1.5e-6, 3e-3, 0.42, 1.0, 7.0, 9e5}) {
    const int b = LogHistogram::bin_of(x);
    EXPECT_LE(LogHistogram::lower_edge(b), x * (1 + 1e-12)) << x;
    EXPECT_GE(LogHistogram::upper_edge(b), x * (1 - 1e-12)) << x;
  }
  LogHistogram h;
  EXPECT_EQ(h.quantile(0.5), 0);
  for (int i = 0; i < 90; ++i) h.add(0.01);
  for (int i = 0; i < 10; ++i) h.add(0.5);
  EXPECT_EQ(h.total(), 100);
  EXPECT_NEAR(h.quantile(0.5), 0.01, 0.01 * 0.26);  // upper edge of the bin (10 per decade)
  // Interpolated inside the bin of 0.5; never above the maximum when it is given.
  EXPECT_GE(h.quantile(0.99), LogHistogram::lower_edge(LogHistogram::bin_of(0.5)));
  EXPECT_LE(h.quantile(0.99), 0.5 * 1.26);
  EXPECT_LE(h.quantile(0.99, 0.5), 0.5);
  LogHistogram g;
  g.add(0.5);
  h.merge(g);
  EXPECT_EQ(h.total(), 101);
}

// A percentile is never above the maximum: the bin of 0.721 reaches 0.794, and the p99 must not
// print that edge beside "max 0.721". Inside a bin the rank is interpolated on the log scale.
TEST(LogHistogram, PercentilesNeverExceedTheMaximumAndInterpolate) {
  LogHistogram h;
  for (int i = 0; i < 100; ++i) h.add(0.7 + 0.021 * i / 99.0);  // 0.700 .. 0.721, one bin
  const int b = LogHistogram::bin_of(0.721);
  ASSERT_EQ(LogHistogram::bin_of(0.7), b);
  EXPECT_GT(LogHistogram::upper_edge(b), 0.79);
  EXPECT_LE(h.quantile(0.99, 0.721), 0.721);
  EXPECT_EQ(h.quantile(1.0, 0.721), 0.721);
  // Without the max: interpolated inside the bin, ordered, between the bin's edges.
  const double p50 = h.quantile(0.5), p90 = h.quantile(0.9), p99 = h.quantile(0.99);
  EXPECT_GT(p50, LogHistogram::lower_edge(b));
  EXPECT_LT(p50, p90);
  EXPECT_LT(p90, p99);
  EXPECT_LT(p99, LogHistogram::upper_edge(b));
  EXPECT_NEAR(p50, std::sqrt(LogHistogram::lower_edge(b) * LogHistogram::upper_edge(b)),
              1e-12);  // the middle rank sits at the bin's geometric middle
  LogHistogram big;
  big.add(INFINITY);
  EXPECT_EQ(big.quantile(0.5), LogHistogram::kHi);
}

// The summary's tag list is grouped: one line per family with its top values, not a hundred
// `page_size=N` lines.
TEST(ReportRender, TagsGroupedByFamilyWithTopValues) {
  std::map<std::string, int64_t> tags{
      {"layout=model1", 60}, {"layout=v32", 40}, {"has_invalid", 7}};
  for (int p = 1; p <= 100; ++p) tags["page_size=" + std::to_string(p)] = p;
  const std::vector<TagFamily> g = group_tags(tags, 8);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].family, "flags");
  EXPECT_EQ(g[1].family, "layout");
  ASSERT_EQ(g[1].values.size(), 2u);
  EXPECT_EQ(g[1].values[0], (std::pair<std::string, int64_t>{"model1", 60}));
  EXPECT_EQ(g[2].family, "page_size");
  ASSERT_EQ(g[2].values.size(), 8u);
  EXPECT_EQ(g[2].values[0].first, "100");  // most frequent first
  EXPECT_EQ(g[2].others, 92);
  EXPECT_EQ(g[2].other_count, 92 * 93 / 2);
  Report r;
  r.cases = 100;
  r.tags = tags;
  const std::string text = render_summary(r);
  EXPECT_NE(text.find("    page_size: 100 100, 99 99, 98 98, 97 97, 96 96, 95 95, 94 94, 93 93, "
                      "+92 more (4278)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("    layout: model1 60, v32 40\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("page_size=5"), std::string::npos) << text;
}

PropertyStats some_stats(const std::string& backend, const std::string& property, double t) {
  PropertyStats s;
  s.backend = backend;
  s.property = property;
  s.cases = 10;
  s.not_applicable = 1;
  s.failures = t > 1 ? 2 : 0;
  s.max_abs = 0.01 * t;
  s.sum_mean_abs = 0.003;
  s.max_rel = 0.02;
  s.max_cos_diff = 1e-6;
  s.lse_max_abs = 1e-5;
  s.max_tightness = t;
  for (int i = 0; i < 9; ++i) s.tightness.add(t / (i + 1));
  for (uint64_t i = 0; i < 7; ++i) {
    WorstCase w;
    w.seed = 3;
    w.case_index = i;
    w.failed = t > 1 && i == 0;
    w.tightness = t / (i + 1);
    w.max_abs = 0.01;
    w.shape = "model1 B1 <H>";
    w.detail = "worst at (0, 1, 447) & \"quoted\"";
    w.repro = replay_command(3, i, "default", backend, property);
    s.add_worst(w);
    Sample p;
    p.key = sample_key(3, i);
    p.seed = 3;
    p.case_index = i;
    p.out_max_ref = 1.5;
    p.max_abs = 1e-3 * (i + 1);
    p.tightness = t / (i + 1);
    p.topk = 64;
    p.page_size = 61;
    s.add_sample(p);
  }
  return s;
}

// The results table keeps its columns whatever the backend names: every row's "cases" column
// ends where the header's does. A passing row with a huge max abs gets the line explaining it.
TEST(ReportRender, ResultsTableAlignedForLongBackendNames) {
  Report r;
  r.cases = 10;
  for (const char* b : {"cpu-mma", "python:/very/long/path/to/a/kernel_module.py:decode~mutant"}) {
    PropertyStats s = some_stats(b, "insert-invalid", 0.5);
    r.results.push_back(s);
  }
  // Every table line (header and rows) has the same length: right-aligned columns of one width.
  std::istringstream lines(render_summary(r));
  std::string line;
  std::vector<size_t> lengths;
  while (std::getline(lines, line)) {
    if (line.find("insert-invalid") != std::string::npos ||
        line.find("tight max") != std::string::npos) {
      lengths.push_back(line.size());
    }
  }
  ASSERT_EQ(lengths.size(), 3u) << render_summary(r);
  EXPECT_EQ(lengths[0], lengths[1]) << render_summary(r);
  EXPECT_EQ(lengths[0], lengths[2]) << render_summary(r);
  EXPECT_EQ(render_summary(r).find("max abs is"), std::string::npos);
  r.results[0].max_abs = 9.88e27;  // a passing row on values near 1e30
  EXPECT_NE(render_summary(r).find("max abs is |backend - oracle| in output units"),
            std::string::npos)
      << render_summary(r);
}

Report some_report(double t, bool with_finding) {
  Report r;
  r.complete = true;
  r.seed = 3;
  r.backends = {"cpu-mma", "cpu-simt"};
  r.properties = {"tolerance", "poison"};
  r.commit = "abc";
  r.host = "h";
  r.start = "2026-11-29T00:00:00Z";
  r.end = "2026-11-29T01:00:00Z";
  r.stop_reason = "time";
  r.duration_s = 3600;
  r.cases = 10;
  r.cases_per_s = 10 / 3600.0;
  ShardRun s;
  s.cases = 10;
  s.case_ranges = {{0, 10}};
  r.shards = {s};
  r.devices = {{"cpu", "", 10}};
  r.tags = {{"layout=model1", 6}, {"layout=v32", 4}};
  r.stats("cpu-mma", "tolerance") = some_stats("cpu-mma", "tolerance", t);
  r.stats("cpu-simt", "tolerance") = some_stats("cpu-simt", "tolerance", 0.1);
  r.stats("cpu-mma", "poison") = some_stats("cpu-mma", "poison", 0);
  if (with_finding) {
    Finding f;
    f.signature = "cpu-mma | bound excess | finite sink";
    f.property = "tolerance";
    f.backend = "cpu-mma";
    f.kind = "bound excess";
    f.causes = {"finite sink"};
    f.properties = {"tolerance"};
    f.locus = "out[b0,h0] wrong in every column";
    f.inputs = "inputs: model1 nope 512 rope 64, page_size 64, 1 page(s); sink [0]";
    f.shape_class = "model1 B1 H1 T1-2";
    f.raw = {{"tolerance", "model1 B2 H3-32 T3-8 P=odd sink", 3, 3, 0, "mlafuzz fuzz ..."},
             {"tolerance", "v32 B1 H1 T1-2 P=pow2 sink", 1, 3, 5, "mlafuzz fuzz ..."}};
    f.count = 4;
    f.seed = 3;
    f.case_index = 0;
    f.tightness = t;
    f.summary = "out[0,0,447] error 3 > bound 0.01 <bad>";
    f.corpus_path = "corpus/findings/x.json";
    f.repro = "mlafuzz repro corpus/findings/x.json --backends cpu-mma";
    r.findings = {f};
  }
  return r;
}

TEST(ReportJson, RoundTrips) {
  const Report r = some_report(5.0, true);
  const Json j = report_to_json(r);
  EXPECT_EQ(j.at("format"), "mlafuzz-report");
  EXPECT_EQ(j.at("version"), 2);
  const Report back = report_from_json(Json::parse(j.dump()), "mem");
  ASSERT_EQ(back.findings.size(), 1u);
  EXPECT_EQ(back.findings[0].causes, r.findings[0].causes);
  EXPECT_EQ(back.findings[0].kind, r.findings[0].kind);
  EXPECT_EQ(back.findings[0].properties, r.findings[0].properties);
  EXPECT_EQ(back.findings[0].locus, r.findings[0].locus);
  ASSERT_EQ(back.findings[0].raw.size(), 2u);
  EXPECT_EQ(back.findings[0].raw[1].case_index, 5u);
  EXPECT_EQ(statistics_difference(r, back), "");
  EXPECT_EQ(back.shards.size(), 1u);
  EXPECT_EQ(back.shards[0].case_ranges, r.shards[0].case_ranges);
  EXPECT_EQ(back.findings[0].repro, r.findings[0].repro);
  EXPECT_EQ(back.find_stats("cpu-mma", "tolerance")->worst,
            r.find_stats("cpu-mma", "tolerance")->worst);
  EXPECT_EQ(back.seed, 3u);
  // Infinities survive (JSON has none).
  Report inf = r;
  inf.stats("cpu-mma", "tolerance").max_tightness = INFINITY;
  const Report inf_back = report_from_json(report_to_json(inf), "mem");
  EXPECT_TRUE(std::isinf(inf_back.find_stats("cpu-mma", "tolerance")->max_tightness));
}

// A non-finite mismatch is a flag of worst cases, findings and statistics; reports written before
// the flag existed (tightness 1e300, no field) load with it set.
TEST(ReportJson, NonfiniteMismatchFlagAndOldReports) {
  Report r = some_report(0.5, true);
  PropertyStats& s = r.stats("cpu-mma", "tolerance");
  ASSERT_FALSE(s.worst.empty());
  ASSERT_FALSE(r.findings.empty());
  s.nonfinite_mismatches = 2;
  WorstCase w = s.worst.front();
  w.case_index = 999;
  w.nonfinite_mismatch = true;
  w.tightness = 0;
  s.add_worst(w);
  EXPECT_EQ(s.worst.front().case_index, 999u) << "ranked above every finite tightness";
  r.findings[0].nonfinite_mismatch = true;
  const Report back = report_from_json(report_to_json(r), "mem");
  EXPECT_EQ(back.find_stats("cpu-mma", "tolerance")->nonfinite_mismatches, 2);
  EXPECT_TRUE(back.find_stats("cpu-mma", "tolerance")->worst.front().nonfinite_mismatch);
  EXPECT_TRUE(back.findings[0].nonfinite_mismatch);
  EXPECT_NE(render_summary(back).find("non-finite"), std::string::npos);

  Json old = report_to_json(some_report(0.5, true));
  Json& t = old["results"][0]["tightness"];
  t.erase("nonfinite_mismatches");
  t["max"] = 1e300;
  old["results"][0]["worst"][0].erase("nonfinite_mismatch");
  old["results"][0]["worst"][0]["tightness"] = 1e300;
  old["findings"][0].erase("nonfinite_mismatch");
  old["findings"][0]["tightness"] = 1e300;
  const Report legacy = report_from_json(old, "old.json");
  EXPECT_EQ(legacy.results[0].nonfinite_mismatches, 1);
  EXPECT_EQ(legacy.results[0].max_tightness, 0);
  EXPECT_TRUE(legacy.results[0].worst[0].nonfinite_mismatch);
  EXPECT_TRUE(legacy.findings[0].nonfinite_mismatch);
  EXPECT_EQ(legacy.findings[0].tightness, 0);
}

// A campaign's warnings and a finding's shrink note: in report.json only when there is one (a
// report without them, every report written before they existed, loads with none), merged from
// every shard, and shown by the summary, the HTML report and JUnit.
TEST(ReportJson, WarningsAndShrinkNotes) {
  Report r = some_report(5.0, true);  // a failing property: JUnit lists the finding
  const Json plain = report_to_json(r);
  EXPECT_FALSE(plain.at("campaign").contains("warnings"));
  EXPECT_FALSE(plain.at("findings")[0].contains("shrink_note"));
  EXPECT_TRUE(report_from_json(plain, "old.json").warnings.empty());

  const std::string warning = "1 case(s) completed in 20 s: the backends were too slow or hung";
  const std::string note = "the time budget ended while shrinking";
  r.warnings = {warning};
  r.findings[0].shrink_note = note;
  const Report back = report_from_json(Json::parse(report_to_json(r).dump()), "mem");
  EXPECT_EQ(back.warnings, std::vector<std::string>{warning});
  EXPECT_EQ(back.findings[0].shrink_note, note);
  for (const std::string& text : {render_summary(back), render_html(back), render_junit(back)}) {
    EXPECT_NE(text.find(note), std::string::npos) << text;
  }
  EXPECT_NE(render_summary(back).find("warning: " + warning), std::string::npos);
  EXPECT_NE(render_html(back).find(warning), std::string::npos);

  Report other = some_report(0.5, false);
  other.shards[0].index = 1;
  other.shards[0].count = 2;
  r.shards[0].count = 2;
  other.warnings = {"0 case(s) completed in 5 s: the backends were too slow or hung"};
  EXPECT_EQ(merge_reports({r, other}).warnings.size(), 2u);
}

// A fault finding is listed in JUnit under the failing test cases of its backend, whichever
// property's run met the fault.
TEST(ReportJunit, FaultFindingsUnderTheirBackendsFailures) {
  Report r = some_report(5.0, true);
  Finding& f = r.findings[0];
  f.property = "fault";
  f.signature = "fault|cpu-mma|model1 B1 H1 T1-2";
  const std::string junit = render_junit(r);
  EXPECT_NE(junit.find("finding fault|cpu-mma|model1 B1 H1 T1-2 seen 4x"), std::string::npos)
      << junit;
}

TEST(ReportJson, StrictLoadingNamesTheField) {
  Json j = report_to_json(some_report(0.5, false));
  auto expect_error = [](const Json& bad, const std::string& needle) {
    try {
      report_from_json(bad, "night.json");
      ADD_FAILURE() << "accepted a bad report; expected " << needle;
    } catch (const ReportError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("night.json"), std::string::npos) << e.what();
    }
  };
  Json v = j;
  v["version"] = 3;
  expect_error(v, "version");
  v = j;
  v["format"] = "something";
  expect_error(v, "format");
  v = j;
  v["campaign"].erase("seed");
  expect_error(v, "campaign.seed");
  v = j;
  v["results"][0]["tightness"]["histogram"]["counts"].erase(0);
  expect_error(v, "results[0].tightness.histogram.counts");
  v = j;
  v["results"][1]["failures"] = 99;
  expect_error(v, "results[1]");
  const std::string dir = test::fresh_dir("bad");
  write_file_atomic(dir + "/r.json", "{not json");
  EXPECT_THROW(load_report(dir + "/r.json"), ReportError);
}

TEST(ReportMerge, SumsMaximaHistogramsFindings) {
  Report a = some_report(0.5, true), b = some_report(3.0, true);
  b.shards[0].index = 1;
  b.shards[0].count = 2;
  a.shards[0].count = 2;
  b.findings[0].case_index = 7;
  b.findings[0].corpus_path = "other/x.json";
  const Report m = merge_reports({a, b});
  EXPECT_EQ(m.cases, 20);
  EXPECT_EQ(m.tags.at("layout=model1"), 12);
  const PropertyStats& s = *m.find_stats("cpu-mma", "tolerance");
  EXPECT_EQ(s.cases, 20);
  EXPECT_EQ(s.failures, 2);
  EXPECT_DOUBLE_EQ(s.max_tightness, 3.0);
  EXPECT_EQ(s.tightness.total(), 18);
  EXPECT_EQ(s.worst.size(), PropertyStats::kWorst);
  EXPECT_TRUE(s.worst.front().failed);
  ASSERT_EQ(m.findings.size(), 1u);  // the same group from two shards: one finding
  EXPECT_EQ(m.findings[0].count, 8);
  EXPECT_EQ(m.findings[0].case_index, 0u);  // the earliest representative
  EXPECT_EQ(m.findings[0].corpus_entries.size(), 2u);
  // Raw failure classes add up; the earliest first case of each is kept.
  ASSERT_EQ(m.findings[0].raw.size(), 2u);
  EXPECT_EQ(m.findings[0].raw[0].count, 6);
  EXPECT_EQ(m.findings[0].raw[1].count, 2);
  EXPECT_EQ(m.shards.size(), 2u);
  // Merge order does not matter.
  EXPECT_EQ(statistics_difference(m, merge_reports({b, a})), "");
  // The same shard twice is refused (its cases would count twice).
  EXPECT_THROW(merge_reports({a, a}), ReportError);
}

// The statistics of two shard campaigns, merged, equal those of one campaign over the same
// cases (global indices 0..2n-1).
TEST(ReportMerge, ShardsMergeToTheSingleRun) {
  auto run = [](const std::string& shard, uint64_t cases) {
    CampaignOptions o;
    o.backends = {"cpu-simt", "cpu-mma"};
    o.properties = {"run", "tolerance", "determinism", "mma-vs-simt"};
    o.seed = 11;
    o.max_cases = cases;
    o.shard = parse_shard(shard);
    o.jobs = 2;
    o.shrink_time_s = 0;
    o.corpus_dir = test::fresh_dir("corpus-" + std::to_string(o.shard.index) + "-" +
                                   std::to_string(o.shard.count));
    std::ostringstream log;
    o.log = &log;
    Report r;
    run_campaign(o, &r);
    return r;
  };
  const Report single = run("0/1", 16);
  const Report s0 = run("0/2", 8), s1 = run("1/2", 8);
  const Report merged = merge_reports({s0, s1});
  EXPECT_EQ(single.cases, 16);
  EXPECT_EQ(statistics_difference(single, merged), "");
  ASSERT_EQ(merged.shards.size(), 2u);
  EXPECT_EQ(merged.shards[0].case_ranges, (std::vector<std::pair<uint64_t, uint64_t>>{{0, 8}}));
  // Round trip through files, as `mlafuzz report merge` does.
  const Report reloaded = report_from_json(report_to_json(merged), "merged");
  EXPECT_EQ(statistics_difference(single, reloaded), "");
}

// The campaign side of the cases: a campaign fills case_breakdown for every case it
// evaluated, with steps that fit inside the cases' wall time; the field survives JSON, shards
// add up, the summary shows it, and reports without the field still load.
TEST(ReportCaseBreakdown, FilledByTheCampaignRoundTripsAndMerges) {
  CampaignOptions o;
  o.backends = {"cpu-simt", "cpu-mma"};
  o.seed = 12;
  o.max_cases = 6;
  o.jobs = 2;
  o.shrink_time_s = 0;
  o.corpus_dir = test::fresh_dir("corpus-breakdown");
  std::ostringstream log;
  o.log = &log;
  Report r;
  run_campaign(o, &r);
  const CaseBreakdown& c = r.case_breakdown;
  EXPECT_EQ(c.cases, r.cases);
  double steps = 0;
  for (int i = 0; i < kCaseStepCount; ++i) {
    EXPECT_GE(c.steps.seconds[i], 0) << case_step_name(static_cast<CaseStep>(i));
    steps += c.steps.seconds[i];
  }
  for (CaseStep s :
       {CaseStep::kMaterialize, CaseStep::kCleanRuns, CaseStep::kOracle, CaseStep::kBounds,
        CaseStep::kVariants, CaseStep::kVariantRuns, CaseStep::kChecks}) {
    EXPECT_GT(c.steps[s], 0) << case_step_name(s) << " was never timed";
  }
  EXPECT_LE(steps, c.steps.wall * 1.001 + 1e-6) << "the steps are parts of the wall time";
  EXPECT_GT(steps, 0.5 * c.steps.wall) << "most of the wall time is in a step";
  EXPECT_GT(c.steps.thread_cpu, 0);
  // The host models compute on the evaluating thread: nearly all of its wall time is CPU.
  EXPECT_LE(c.steps.thread_cpu, c.steps.wall * 1.05 + 1e-3);

  const Report back = report_from_json(Json::parse(report_to_json(r).dump()), "mem");
  EXPECT_EQ(back.case_breakdown.cases, c.cases);
  EXPECT_DOUBLE_EQ(back.case_breakdown.steps[CaseStep::kOracle], c.steps[CaseStep::kOracle]);
  EXPECT_DOUBLE_EQ(back.case_breakdown.steps.thread_cpu, c.steps.thread_cpu);
  EXPECT_NE(render_summary(back).find("time per case (ms"), std::string::npos);

  Report a = some_report(0.5, false), b = some_report(0.5, false);
  b.shards[0].index = 1;
  a.shards[0].count = b.shards[0].count = 2;
  a.case_breakdown = c;
  b.case_breakdown = c;
  const Report m = merge_reports({a, b});
  EXPECT_EQ(m.case_breakdown.cases, 2 * c.cases);
  EXPECT_DOUBLE_EQ(m.case_breakdown.steps.wall, 2 * c.steps.wall);

  Json old = report_to_json(some_report(0.5, false));
  old["campaign"].erase("case_breakdown");
  EXPECT_EQ(report_from_json(old, "old.json").case_breakdown.cases, 0);
  Json bad = report_to_json(r);
  bad["campaign"]["case_breakdown"]["oracle"] = "slow";
  try {
    report_from_json(bad, "night.json");
    ADD_FAILURE() << "accepted a non-numeric step";
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("case_breakdown.oracle"), std::string::npos) << e.what();
  }
}

// The time per worker call, written and read through one field table: the layout is pinned,
// older entries (no "requests", a phase added later) read with zeros, a bad entry is named.
TEST(ReportTimeBreakdown, WritesItsLayoutReadsOlderEntriesAndNamesABadField) {
  TimeBreakdown t;
  t["cuda-mma"].calls = 12;
  t["cuda-mma"].requests = 3;
  t["cuda-mma"].phases[Phase::kKernel] = 0.25;
  const Json j = time_breakdown_to_json(t);
  EXPECT_EQ(j.dump(),
            R"({"cuda-mma":{"calls":12,"requests":3,"queue":0.0,"encode":0.0,"transport":0.0,)"
            R"("decode":0.0,"run":0.0,"alloc":0.0,"upload":0.0,"kernel":0.25,"download":0.0,)"
            R"("stage":0.0,"widen":0.0}})");
  const TimeBreakdown back = time_breakdown_from_json(j, "campaign.time_breakdown");
  EXPECT_EQ(back.at("cuda-mma").calls, 12);
  EXPECT_EQ(back.at("cuda-mma").requests, 3);
  EXPECT_EQ(back.at("cuda-mma").phases[Phase::kKernel], 0.25);

  const TimeBreakdown old =
      time_breakdown_from_json(Json::parse(R"({"cpu-mma": {"calls": 5, "run": 1.5}})"), "x");
  EXPECT_EQ(old.at("cpu-mma").calls, 5);
  EXPECT_EQ(old.at("cpu-mma").requests, 0);
  EXPECT_EQ(old.at("cpu-mma").phases[Phase::kRun], 1.5);
  EXPECT_EQ(old.at("cpu-mma").phases[Phase::kWiden], 0);

  const auto error = [](const char* text) -> std::string {
    try {
      time_breakdown_from_json(Json::parse(text), "campaign.time_breakdown");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(error(R"({"cpu-mma": {"run": 1.5}})"),
            "campaign.time_breakdown.cpu-mma.calls: missing");
  EXPECT_EQ(error(R"({"cpu-mma": {"calls": 1, "requests": 0.5}})"),
            "campaign.time_breakdown.cpu-mma.requests: expected an integer");
  EXPECT_EQ(error(R"({"cpu-mma": {"calls": 1, "kernel": "fast"}})"),
            "campaign.time_breakdown.cpu-mma.kernel: expected a number (or \"inf\", \"-inf\", "
            "\"nan\")");
  EXPECT_EQ(error(R"([1])"), "campaign.time_breakdown: expected an object");
}

// Findings compare by group: the same bug on another night's seed (another first case, other
// raw classes) is still open, a group NEW alone has is a regression, and a version-1 OLD report's
// ungrouped findings match NEW groups by backend and property.
TEST(ReportCompare, GroupsStillOpenNewAndVersionOne) {
  const Report night1 = some_report(0.5, true);
  Report night2 = some_report(0.5, true);
  night2.seed = 2;
  night2.findings[0].seed = 2;
  night2.findings[0].case_index = 17;
  night2.findings[0].raw = {{"poison", "model1 B1 H1 T1-2 P=1 sink", 9, 2, 17, "x"}};
  Comparison c = compare_reports(night1, night2, {});
  EXPECT_FALSE(c.regression) << c.text;
  EXPECT_NE(c.text.find("still open: cpu-mma | bound excess | finite sink"), std::string::npos)
      << c.text;
  Finding other = night2.findings[0];
  other.signature = "cpu-mma | non-finite mismatch | row without a valid entry";
  night2.findings.push_back(other);
  c = compare_reports(night1, night2, {});
  EXPECT_TRUE(c.regression) << c.text;
  EXPECT_NE(c.text.find("REGRESSION new finding: cpu-mma | non-finite mismatch"), std::string::npos)
      << c.text;
  // OLD written before findings were grouped.
  Json old = report_to_json(night1);
  old["version"] = 1;
  for (auto& f : old["findings"]) {
    for (const char* k : {"kind", "causes", "properties", "locus", "inputs", "raw"}) f.erase(k);
    f["signature"] = "tolerance|cpu-mma|model1 B1 H1 T1-2";
  }
  const Report v1 = report_from_json(old, "v1.json");
  EXPECT_EQ(v1.version, 1);
  c = compare_reports(v1, some_report(0.5, true), {});
  EXPECT_FALSE(c.regression) << c.text;
  EXPECT_NE(c.text.find("version-1 report"), std::string::npos) << c.text;
  EXPECT_NE(c.text.find("still open"), std::string::npos) << c.text;
}

TEST(ReportCompare, IdenticalNewFindingAndTightness) {
  const Report old_r = some_report(0.5, false);
  Comparison c = compare_reports(old_r, old_r, {});
  EXPECT_FALSE(c.regression) << c.text;
  // A new finding signature is a regression.
  c = compare_reports(old_r, some_report(0.5, true), {});
  EXPECT_TRUE(c.regression);
  EXPECT_NE(c.text.find("new finding"), std::string::npos) << c.text;
  // A finding that went away is not.
  EXPECT_FALSE(compare_reports(some_report(0.5, true), old_r, {}).regression);
  // Worst tightness up by more than the factor.
  c = compare_reports(old_r, some_report(1.6, false), {});
  EXPECT_TRUE(c.regression) << c.text;
  EXPECT_NE(c.text.find("worst tightness cpu-mma / tolerance"), std::string::npos) << c.text;
  EXPECT_FALSE(compare_reports(old_r, some_report(0.9, false), {}).regression);
  EXPECT_FALSE(compare_reports(old_r, some_report(1.6, false), {4.0, 0.1}).regression);
  // Tiny tightness values moving around are noise.
  EXPECT_FALSE(compare_reports(some_report(0.001, false), some_report(0.05, false), {}).regression);
}

// A small XML well-formedness check: balanced tags, quoted attributes, escaped text.
std::string xml_problem(const std::string& x) {
  std::vector<std::string> stack;
  size_t i = 0;
  if (x.rfind("<?xml", 0) == 0) i = x.find("?>") + 2;
  while (i < x.size()) {
    if (x[i] == '&') {
      const size_t semi = x.find(';', i);
      const std::string ent = x.substr(i, semi - i + 1);
      // A list, not std::regex: gcc 12 draws a false -Wmaybe-uninitialized from <regex> at -O3.
      static const std::set<std::string> kEntities = {"&amp;", "&lt;", "&gt;", "&quot;", "&#39;"};
      if (semi == std::string::npos || kEntities.count(ent) == 0) {
        return "bad entity at " + std::to_string(i);
      }
      i = semi + 1;
      continue;
    }
    if (x[i] == '>') return "stray > at " + std::to_string(i);
    if (x[i] != '<') {
      ++i;
      continue;
    }
    const size_t end = x.find('>', i);
    if (end == std::string::npos) return "unterminated tag";
    std::string tag = x.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.rfind("!DOCTYPE", 0) == 0) continue;
    if (tag.find('<') != std::string::npos) return "< inside a tag";
    if (std::count(tag.begin(), tag.end(), '"') % 2) return "unbalanced quotes in <" + tag + ">";
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
    } else if (tag.back() != '/') {
      const std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
      static const std::set<std::string> kVoid = {"meta", "br"};
      if (!kVoid.count(name)) stack.push_back(name);
    }
  }
  return stack.empty() ? "" : "unclosed <" + stack.back() + ">";
}

TEST(ReportRender, SummaryLeadsWithOneEntryPerBug) {
  const std::string t = render_summary(some_report(3.0, true));
  const size_t group = t.find("1 finding(s), one per bug, folding 4 raw failure(s)");
  ASSERT_NE(group, std::string::npos) << t;
  const size_t sig = t.find("[4x] cpu-mma | bound excess | finite sink");
  EXPECT_NE(sig, std::string::npos) << t;
  EXPECT_LT(group, t.find("property")) << "the findings come before the statistics\n" << t;
  for (const char* line :
       {"fails tolerance; 4 raw failure(s) folded in 2 class(es)",
        "where: out[b0,h0] wrong in every column", "inputs: model1", "first: seed 3 case 0",
        "reproduce: mlafuzz repro corpus/findings/x.json --backends cpu-mma"}) {
    EXPECT_NE(t.find(line), std::string::npos) << line << "\n" << t;
  }
}

TEST(ReportRender, JunitIsWellFormed) {
  const std::string x = render_junit(some_report(3.0, true));
  EXPECT_EQ(xml_problem(x), "");
  EXPECT_NE(x.find("<testsuite name=\"cpu-mma\""), std::string::npos);
  EXPECT_NE(x.find("<testcase name=\"tolerance\" classname=\"mlafuzz.cpu-mma\""),
            std::string::npos);
  // One failing test case per finding; the (backend, property) it holds does not fail again.
  EXPECT_NE(x.find("<testcase name=\"cpu-mma | bound excess | finite sink\" "
                   "classname=\"mlafuzz.findings.cpu-mma\">"),
            std::string::npos)
      << x;
  EXPECT_NE(x.find("<failure message=\"bound excess: finite sink\""), std::string::npos) << x;
  EXPECT_EQ(x.find("<failure message=\"2 of 9 cases failed"), std::string::npos) << x;
  EXPECT_NE(x.find("&lt;bad&gt;"), std::string::npos);  // the detail, escaped
  // Failures no finding holds fail their (backend, property).
  const std::string lost = render_junit(some_report(3.0, false));
  EXPECT_EQ(xml_problem(lost), "");
  EXPECT_NE(lost.find("<failure message=\"2 of 9 cases failed (in no finding)"), std::string::npos)
      << lost;
  EXPECT_EQ(xml_problem("<a><b></a>"), "mismatched </a>");  // the checker can fail
}

TEST(ReportRender, HtmlIsSelfContainedAndWellFormed) {
  const std::string h = render_html(some_report(3.0, true));
  EXPECT_EQ(xml_problem(h), "");
  EXPECT_EQ(h.find("http"), std::string::npos);
  EXPECT_EQ(h.find("src="), std::string::npos);
  EXPECT_EQ(h.find("href="), std::string::npos);
  EXPECT_EQ(h.find("<script"), std::string::npos);
  EXPECT_EQ(h.find("<link"), std::string::npos);
  EXPECT_GE(std::count(h.begin(), h.end(), '\n'), 10);
  size_t svgs = 0;
  for (size_t p = h.find("<svg"); p != std::string::npos; p = h.find("<svg", p + 1)) ++svgs;
  EXPECT_GE(svgs, 5u);  // histograms, three scatter plots (the tags are a table)
  EXPECT_NE(h.find("<circle"), std::string::npos);  // sampled points plotted
  EXPECT_NE(h.find("cpu-mma | bound excess | finite sink"), std::string::npos);  // findings
  EXPECT_NE(h.find("<details>"), std::string::npos);  // the raw failures behind each
  EXPECT_NE(h.find("v32 B1 H1 T1-2 P=pow2 sink"), std::string::npos);
  // The distribution: one row per tag family with its values.
  EXPECT_NE(h.find("<td class=\"l\">layout</td><td class=\"l\">"), std::string::npos);
  EXPECT_EQ(h.find("layout=v32"), std::string::npos);
}

}  // namespace
}  // namespace mlafuzz::campaign

// `mlafuzz fuzz` and `mlafuzz report` run as a binary: faults become findings and the campaign
// goes on, signals leave loadable reports and corpora, mutants give one finding per signature,
// environment sharding, merge and compare exit codes, bad usage exits 2.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>

#include "core/fileio.h"
#include "harness/campaign/report.h"
#include "properties/corpus.h"
#include "properties/generate.h"
#include "tests/core/build_paths.h"
#include "tests/harness/cli_helpers.h"

namespace mlafuzz::campaign {
namespace {

namespace fs = std::filesystem;
using test::run_cli;
// The campaign's workers: the test worker, whose MLAFUZZ_TEST_FAULT hooks make them fault.
const std::string kTestWorkerEnv =
    std::string("MLAFUZZ_WORKER_EXE=") + mlafuzz::build_paths::kTestWorker;

std::vector<std::string> fuzz_args(const std::string& dir, std::vector<std::string> extra) {
  const bool jobs = std::find(extra.begin(), extra.end(), "--jobs") != extra.end();
  std::vector<std::string> a = {"fuzz",   "--report", dir + "/report", "--corpus", dir + "/corpus",
                                "--jobs", "2",        "--progress",    "plain",    "--seed",
                                "7"};
  if (jobs) a.erase(a.begin() + 5, a.begin() + 7);
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

void expect_corpus_loads(const std::string& dir, size_t expected) {
  const auto entries = list_corpus(dir);
  EXPECT_EQ(entries.size(), expected);
  for (const auto& p : entries) EXPECT_NO_THROW(load_corpus_entry(p)) << p;
}

TEST(FuzzCli, WorkerCrashIsAFindingAndTheCampaignGoesOn) {
  const std::string dir = test::fresh_dir("crash");
  const auto r = run_cli(fuzz_args(dir, {"--backends", "cpu-simt", "--isolate", "all", "--cases",
                                         "12", "--shrink-time", "0", "--shard", "0/1"}),
                         {"MLAFUZZ_TEST_FAULT=crash:4", kTestWorkerEnv});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const Report rep = load_report(dir + "/report/report.json");
  EXPECT_TRUE(rep.complete);
  EXPECT_EQ(rep.cases, 12) << r.output;  // every case ran despite the crashes
  ASSERT_FALSE(rep.findings.empty()) << r.output;
  int64_t faults = 0;
  for (const auto& f : rep.findings) {
    EXPECT_EQ(f.property, "fault");
    EXPECT_NE(f.summary.find("signal 11"), std::string::npos) << f.summary;
    faults += f.count;
  }
  const PropertyStats* run = rep.find_stats("cpu-simt", "run");
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->failures, faults);
  EXPECT_LT(run->failures, run->cases);  // cases with few heads passed on restarted workers
  expect_corpus_loads(dir + "/corpus", rep.findings.size());
}

TEST(FuzzCli, WorkerHangIsAFindingAndTheCampaignGoesOn) {
  const std::string dir = test::fresh_dir("hang");
  const auto r = run_cli(fuzz_args(dir, {"--backends", "cpu-simt", "--isolate", "all", "--cases",
                                         "6", "--shrink-time", "0", "--case-timeout", "1s"}),
                         {"MLAFUZZ_TEST_FAULT=hang:8", kTestWorkerEnv});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const Report rep = load_report(dir + "/report/report.json");
  EXPECT_EQ(rep.cases, 6);
  ASSERT_FALSE(rep.findings.empty()) << r.output;
  for (const auto& f : rep.findings) {
    EXPECT_EQ(f.property, "fault");
    EXPECT_NE(f.summary.find("hang"), std::string::npos) << f.summary;
  }
}

TEST(FuzzCli, FaultFindingsAreShrunkThroughAFreshWorker) {
  const std::string dir = test::fresh_dir("shrink-fault");
  const auto r =
      run_cli(fuzz_args(dir, {"--backends", "cpu-simt", "--isolate", "all", "--cases", "3",
                              "--shrink-evals", "40", "--shrink-time", "10m", "--jobs", "1"}),
              {"MLAFUZZ_TEST_FAULT=crash:3", kTestWorkerEnv});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const Report rep = load_report(dir + "/report/report.json");
  ASSERT_FALSE(rep.findings.empty()) << r.output;
  for (const auto& f : rep.findings) {
    const CorpusEntry e = load_corpus_entry(f.corpus_path);
    const Case original = generate_case(7, f.case_index, GenConfig{}, nullptr);
    // The fault needs >= 3 heads: the shrunk case still has them, and is no larger.
    EXPECT_TRUE(f.shrunk) << f.corpus_path;
    EXPECT_GE(e.c.heads, 3) << f.corpus_path;
    EXPECT_LE(e.c.heads, original.heads);
    EXPECT_LE(e.c.batch, original.batch);
    EXPECT_LE(e.c.batch * e.c.heads * e.c.topk, original.batch * original.heads * original.topk);
  }
}

// A snapshot report.json that loads and satisfies `enough`. The campaign writes it atomically
// every --report-interval while it runs.
bool snapshot_shows(const std::string& path, const std::function<bool(const Report&)>& enough) {
  try {
    return fs::exists(path) && enough(load_report(path));
  } catch (const std::exception&) {
    return false;
  }
}

TEST(FuzzCli, SigtermStopsCleanlyWithReportAndCorpus) {
  const std::string dir = test::fresh_dir("sigterm");
  const std::string log = dir + "/log.txt";
  const pid_t pid =
      test::start_cli(fuzz_args(dir, {"--backends", "cpu-simt", "--isolate", "all", "--time", "5m",
                                      "--shrink-evals", "20", "--report-interval", "0.2s"}),
                      {"MLAFUZZ_TEST_FAULT=crash:6", kTestWorkerEnv}, log);
  // Stopped once a snapshot shows a finding: the corpus then has something to keep consistent.
  const bool found = test::wait_for(
      [&] {
        return snapshot_shows(dir + "/report/report.json",
                              [](const Report& r) { return r.cases > 0 && !r.findings.empty(); });
      },
      240);
  EXPECT_TRUE(found) << "no snapshot with a finding";
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const auto r = test::wait_cli(pid, log, 120);
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.output;
  const Report rep = load_report(dir + "/report/report.json");
  EXPECT_TRUE(rep.complete);
  EXPECT_EQ(rep.stop_reason, "signal");
  EXPECT_GT(rep.cases, 0);
  expect_corpus_loads(dir + "/corpus", rep.findings.size());
  EXPECT_TRUE(fs::exists(dir + "/report/junit.xml"));
  EXPECT_TRUE(fs::exists(dir + "/report/report.html"));
}

TEST(FuzzCli, SigkillLeavesThePreviousReportLoadable) {
  const std::string dir = test::fresh_dir("sigkill");
  const std::string log = dir + "/log.txt";
  const pid_t pid =
      test::start_cli(fuzz_args(dir, {"--backends", "cpu-simt,cpu-mma", "--time", "5m",
                                      "--shrink-evals", "20", "--report-interval", "0.2s"}),
                      {}, log);
  // Killed once a snapshot with cases in it is on disk, while the campaign goes on rewriting it:
  // the report and corpus must load.
  EXPECT_TRUE(test::wait_for(
      [&] {
        return snapshot_shows(dir + "/report/report.json",
                              [](const Report& r) { return r.cases > 0; });
      },
      240))
      << "no snapshot with cases";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  test::wait_cli(pid, log, 60);
  const Report rep = load_report(dir + "/report/report.json");
  EXPECT_FALSE(rep.complete);  // a snapshot, marked as such
  EXPECT_EQ(rep.stop_reason, "running");
  EXPECT_NO_THROW(list_corpus(dir + "/corpus"));
  for (const auto& p : list_corpus(dir + "/corpus")) EXPECT_NO_THROW(load_corpus_entry(p));
  // No temporary files are mistaken for reports.
  for (const auto& e : fs::directory_iterator(dir + "/report")) {
    const std::string n = e.path().filename().string();
    if (n.rfind('.', 0) == 0) continue;  // a torn temporary, never read
    EXPECT_TRUE(n == "report.json" || n == "junit.xml" || n == "report.html" || n == "workers.log")
        << n;
  }
}

// The signatures of the findings of a killed campaign that its resumed run does not have, one
// per line; a record still being shrunk is found again, shrunk to its end (not looked for).
std::string lost_on_resume(const Report& killed, const Report& resumed) {
  std::string lost;
  for (const auto& f : killed.findings) {
    if (f.shrink_note.rfind("being shrunk", 0) == 0) continue;
    const bool kept = std::any_of(resumed.findings.begin(), resumed.findings.end(),
                                  [&](const Finding& g) { return g.signature == f.signature; });
    if (!kept) lost += f.signature + "\n";
  }
  return lost;
}

// A shard killed mid-run and resumed (--resume, as a requeued Slurm task does) ends with the
// statistics and findings of the same shard run in one go: done cases are not run again, cases
// in flight are, and no finding is lost.
TEST(FuzzCli, ResumeAfterSigkillLosesNothing) {
  const std::string dir = test::fresh_dir("resume");
  const std::vector<std::string> campaign = {
      "--backends",     "cpu-simt,cpu-mma~unmasked-pad-columns",
      "--properties",   "run,tolerance",
      "--cases",        "24",
      "--jobs",         "1",
      "--shrink-evals", "100",
      "--shard",        "1/2"};
  auto with = [&](const std::string& report, std::vector<std::string> extra,
                  const std::string& seed = "3") {
    std::vector<std::string> a = {"fuzz",   "--report", report,       "--corpus", dir + "/corpus",
                                  "--seed", seed,       "--progress", "plain"};
    a.insert(a.end(), campaign.begin(), campaign.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto r = run_cli(with(dir + "/whole", {}));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  const Report whole = load_report(dir + "/whole/report.json");
  ASSERT_FALSE(whole.findings.empty()) << r.output;

  const std::string log = dir + "/killed.txt";
  const pid_t pid = test::start_cli(with(dir + "/run", {"--report-interval", "0.2s"}), {}, log);
  int64_t before = 0;
  size_t found_before = 0;
  EXPECT_TRUE(test::wait_for(
      [&] {
        return snapshot_shows(dir + "/run/report.json", [&](const Report& s) {
          before = s.cases;
          found_before = s.findings.size();
          return s.cases >= 4 && !s.findings.empty();
        });
      },
      240))
      << "no snapshot with a finding";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  test::wait_cli(pid, log, 60);
  const Report killed = load_report(dir + "/run/report.json");
  ASSERT_LT(killed.cases, 24) << "the campaign ended before it was killed";

  r = run_cli(with(dir + "/run", {"--resume"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("resuming " + dir + "/run/report.json: " + std::to_string(killed.cases) +
                          " case(s) done"),
            std::string::npos)
      << r.output;
  const Report resumed = load_report(dir + "/run/report.json");
  EXPECT_EQ(resumed.cases, 24);
  EXPECT_EQ(statistics_difference(whole, resumed), "")
      << "killed after " << killed.cases << " cases (" << before << " seen, " << found_before
      << " findings)\n"
      << r.output;
  EXPECT_EQ(lost_on_resume(killed, resumed), "");
  EXPECT_EQ(resumed.start, killed.start);
  EXPECT_GE(resumed.duration_s, killed.duration_s);
  expect_corpus_loads(dir + "/corpus", whole.findings.size());

  // Nothing left to run: the report stays, no case runs twice.
  r = run_cli(with(dir + "/run", {"--resume"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(statistics_difference(whole, load_report(dir + "/run/report.json")), "");
  // Another campaign's report is refused, naming what differs.
  r = run_cli(with(dir + "/run", {"--resume"}, "4"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is a campaign with seed 3, this one has 4"), std::string::npos)
      << r.output;
  // No report yet: the shard starts at case 0.
  r = run_cli({"fuzz", "--report", dir + "/fresh", "--corpus", dir + "/corpus-fresh", "--resume",
               "--backends", "cpu-simt", "--properties", "run", "--cases", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(load_report(dir + "/fresh/report.json").cases, 2);
  EXPECT_NE(r.output.find("resume: no report in " + dir + "/fresh yet"), std::string::npos)
      << r.output;
}

// One planted bug, one finding: every failing case of the mutant, whatever its shape, folds into
// one group (a raw failure class per shape class behind it), saved as one corpus entry.
TEST(FuzzCli, MutantGivesOneFinding) {
  const std::string dir = test::fresh_dir("mutant");
  const auto r = run_cli(fuzz_args(
      dir, {"--backends", "cpu-mma~unmasked-pad-columns", "--properties", "tolerance", "--cases",
            "40", "--shrink-evals", "1000", "--shrink-time", "10m", "--profile", "default"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const Report rep = load_report(dir + "/report/report.json");
  ASSERT_EQ(rep.findings.size(), 1u) << r.output;
  const Finding& f = rep.findings[0];
  EXPECT_EQ(f.backend, "cpu-mma~unmasked-pad-columns");
  EXPECT_EQ(f.property, "tolerance");
  EXPECT_EQ(f.signature,
            "cpu-mma~unmasked-pad-columns | bound excess | padded nope (nope_dim not a power of "
            "two)");
  EXPECT_EQ(f.properties, std::vector<std::string>{"tolerance"});
  EXPECT_FALSE(f.locus.empty());
  const PropertyStats* tol = rep.find_stats("cpu-mma~unmasked-pad-columns", "tolerance");
  ASSERT_NE(tol, nullptr);
  EXPECT_EQ(f.count, tol->failures);  // every failing case is counted in the one group
  EXPECT_GT(f.raw.size(), 1u) << "raw failures of several shape classes";
  int64_t raw = 0;
  for (const auto& c : f.raw) raw += c.count;
  EXPECT_EQ(raw, f.count);
  // One corpus entry, naming the group.
  const auto entries = list_corpus(dir + "/corpus");
  ASSERT_EQ(entries.size(), 1u);
  const CorpusEntry e = load_corpus_entry(entries[0]);
  EXPECT_EQ(e.f.signature, f.signature);
  EXPECT_EQ(e.f.causes, f.causes);
  // The summary leads with it.
  EXPECT_NE(r.output.find("1 finding(s), one per bug"), std::string::npos) << r.output;
}

TEST(FuzzCli, EnvironmentSharding) {
  const std::string dir = test::fresh_dir("env-shard");
  auto r = run_cli(
      fuzz_args(dir + "/g", {"--backends", "cpu-simt", "--cases", "2", "--properties", "run"}),
      {"GTEST_SHARD_INDEX=1", "GTEST_TOTAL_SHARDS=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Report rep = load_report(dir + "/g/report/report.json");
  ASSERT_EQ(rep.shards.size(), 1u);
  EXPECT_EQ(rep.shards[0].index, 1);
  EXPECT_EQ(rep.shards[0].count, 3);
  EXPECT_EQ(rep.find_stats("cpu-simt", "run")->worst.back().case_index % 3, 1u);
  r = run_cli(
      fuzz_args(dir + "/s", {"--backends", "cpu-simt", "--cases", "2", "--properties", "run"}),
      {"SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  rep = load_report(dir + "/s/report/report.json");
  EXPECT_EQ(rep.shards[0].index, 3);
  EXPECT_EQ(rep.shards[0].count, 4);
  r = run_cli(
      fuzz_args(dir + "/k", {"--backends", "cpu-simt", "--cases", "2", "--properties", "run"}),
      {"JOB_COMPLETION_INDEX=2", "MLAFUZZ_SHARD_COUNT=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("shard 2/5 (JOB_COMPLETION_INDEX)"), std::string::npos) << r.output;
  rep = load_report(dir + "/k/report/report.json");
  EXPECT_EQ(rep.shards[0].index, 2);
  EXPECT_EQ(rep.shards[0].count, 5);
}

TEST(ReportCli, MergeCompareHtml) {
  const std::string dir = test::fresh_dir("merge");
  for (const char* s : {"0/2", "1/2"}) {
    const std::string sub = dir + "/shard" + std::string(1, s[0]);
    const auto r = run_cli(fuzz_args(sub, {"--backends", "cpu-simt", "--cases", "3", "--properties",
                                           "run,tolerance", "--shard", s}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string a = dir + "/shard0/report/report.json", b = dir + "/shard1/report/report.json";
  auto r = run_cli(
      {"report", "merge", a, b, "-o", dir + "/merged.json", "--html", dir + "/merged.html"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Report m = load_report(dir + "/merged.json");
  EXPECT_EQ(m.cases, 6);
  EXPECT_EQ(m.shards.size(), 2u);
  EXPECT_TRUE(fs::exists(dir + "/merged.html"));
  // Merging a shard with itself is refused.
  r = run_cli({"report", "merge", a, a, "-o", dir + "/twice.json"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Identical nights: no regression.
  r = run_cli({"report", "--compare", a, a});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A night with a new finding: regression.
  Report worse = load_report(a);
  Finding f;
  f.signature = "poison|cpu-simt|model1 B1 H1 T1-2";
  f.property = "poison";
  f.backend = "cpu-simt";
  f.count = 1;
  worse.findings.push_back(f);
  save_report(worse, dir + "/worse.json");
  r = run_cli({"report", "--compare", a, dir + "/worse.json"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("new finding"), std::string::npos) << r.output;
  r = run_cli({"report", "html", a, "-o", dir + "/again.html"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(dir + "/again.html").find("http"), std::string::npos);
  r = run_cli({"report", a});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cpu-simt"), std::string::npos);
}

TEST(FuzzCli, ReplayRegeneratesACase) {
  const auto r = run_cli({"fuzz", "--seed", "7", "--replay-index", "4", "--backends", "cpu-simt",
                          "--properties", "run,tolerance"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("case 4 of seed 7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cpu-simt / tolerance"), std::string::npos) << r.output;
}

TEST(FuzzCli, BadUsageExits2WithAClearMessage) {
  const std::string dir = test::fresh_dir("bad");
  struct Bad {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {{"fuzz", "--time", "10x"}, "10x"},
      {{"fuzz", "--shard", "3/2"}, "3/2"},
      {{"fuzz", "--backends", "no-such", "--cases", "1", "--report", dir + "/r1"}, "no-such"},
      {{"fuzz", "--properties", "nope", "--cases", "1", "--report", dir + "/r2"}, "nope"},
      {{"fuzz", "--profile", "nightly"}, "nightly"},
      {{"fuzz", "--backends", "cpu-mma~no-such-mutant", "--cases", "1"}, "no-such-mutant"},
      {{"report", "--compare", dir + "/missing.json", dir + "/missing.json"}, "missing.json"},
      {{"report", "merge", dir + "/missing.json", "-o", dir + "/m.json"}, "missing.json"},
  };
  for (const auto& b : bad) {
    const auto r = run_cli(b.args);
    EXPECT_EQ(r.exit_code, 2) << b.args[1] << ": " << r.output;
    EXPECT_NE(r.output.find(b.needle), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace mlafuzz::campaign

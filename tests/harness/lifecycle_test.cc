// Finding groups across nights: the state machine with a stand-in replay, the lifecycle file,
// and `mlafuzz nights` on real campaigns of a planted bug (cpu-mma~unmasked-pad-columns) that
// is then fixed (plain cpu-mma).
#include "harness/campaign/lifecycle.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fileio.h"
#include "tests/core/test_util.h"
#include "tests/harness/cli_helpers.h"

namespace mlafuzz::campaign {
namespace {

using test::run_cli;

Finding finding(const std::string& sig, const std::string& case_path) {
  Finding f;
  f.signature = sig;
  f.backend = "backend of " + sig;
  f.property = "tolerance";
  f.corpus_path = case_path;
  return f;
}

const GroupState& group(const Lifecycle& l, const std::string& sig) {
  for (const auto& g : l.groups) {
    if (g.signature == sig) return g;
  }
  throw std::runtime_error("no group " + sig);
}

TEST(Lifecycle, GroupsMoveThroughNewOpenFixedVerifiedRegressed) {
  std::map<std::string, int> verdict;  // case -> replay result (1 passes, 0 fails)
  NightOptions o;
  o.flaky_runs = 3;
  // Night 1: A and B found; B's replays fail once in three (flaky).
  int b_calls = 0;
  o.replay = [&](const std::string& c) {
    if (c == "b.json") return (b_calls++ % 3 == 0) ? 0 : 1;
    return verdict.count(c) ? verdict[c] : 0;
  };
  Report r1;
  r1.findings = {finding("A", "a.json"), finding("B", "b.json")};
  const Lifecycle l1 = advance_night("n1", {}, r1, o);
  EXPECT_EQ(group(l1, "A").state, "new");
  EXPECT_EQ(group(l1, "A").flaky_runs, 3);
  EXPECT_EQ(group(l1, "A").flaky_failures, 3);
  EXPECT_EQ(group(l1, "B").flaky_failures, 1);
  EXPECT_EQ(r1.findings[1].state, "new");
  EXPECT_EQ(r1.findings[1].flaky_failures, 1);
  EXPECT_NE(render_lifecycle(l1).find("[flaky: failed 1 of 3 replays]"), std::string::npos);

  // Night 2: A met again (open since n1); B not met and its case still fails (open).
  o.replay = [&](const std::string& c) { return verdict.count(c) ? verdict[c] : 0; };
  Report r2;
  r2.findings = {finding("A", "a.json")};
  const Lifecycle l2 = advance_night("n2", l1, r2, o);
  EXPECT_EQ(group(l2, "A").state, "open");
  EXPECT_EQ(group(l2, "A").since, "n1");
  EXPECT_EQ(group(l2, "B").state, "open");
  EXPECT_EQ(group(l2, "B").last_seen, "n1");

  // Night 3: A fixed (not met, passes); B could not be replayed (state stays).
  verdict["a.json"] = 1;
  verdict["b.json"] = -1;
  Report r3;
  const Lifecycle l3 = advance_night("n3", l2, r3, o);
  EXPECT_EQ(group(l3, "A").state, "fixed");
  EXPECT_EQ(group(l3, "A").since, "n3");
  EXPECT_EQ(group(l3, "B").state, "open");
  // Night 4: A passes again: verified. Night 5: A fails again: regressed.
  Report r4;
  const Lifecycle l4 = advance_night("n4", l3, r4, o);
  EXPECT_EQ(group(l4, "A").state, "verified");
  EXPECT_EQ(group(l4, "A").since, "n4");
  Report r5;
  r5.findings = {finding("A", "a2.json")};
  const Lifecycle l5 = advance_night("n5", l4, r5, o);
  EXPECT_EQ(group(l5, "A").state, "regressed");
  EXPECT_EQ(group(l5, "A").case_path, "a2.json");
  EXPECT_EQ(r5.findings[0].state, "regressed");
  EXPECT_EQ(r5.findings[0].state_since, "n5");

  // The file round-trips; a bad state is refused naming the field.
  const std::string dir = test::fresh_dir("lifecycle-file");
  save_lifecycle(l5, dir + "/l.json");
  const Lifecycle back = load_lifecycle(dir + "/l.json");
  ASSERT_EQ(back.groups.size(), l5.groups.size());
  EXPECT_EQ(group(back, "A").state, "regressed");
  EXPECT_EQ(back.previous, "n4");
  std::string text = read_file(dir + "/l.json");
  text.replace(text.find("\"regressed\""), 11, "\"closed\"");
  write_file_atomic(dir + "/bad.json", text);
  try {
    load_lifecycle(dir + "/bad.json");
    ADD_FAILURE() << "accepted a bad state";
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("state: unknown state \"closed\""), std::string::npos)
        << e.what();
  }
}

std::vector<std::string> campaign(const std::string& nights, const std::string& night,
                                  const std::string& backend) {
  // 8 under MLAFUZZ_TEST_QUICK: the bug's first finding is case 0 of seed 7.
  const std::string cases = mlafuzz::testing::full_or_quick<std::string>("30", "8");
  return {"fuzz",
          "--backends",
          backend,
          "--properties",
          "tolerance",
          "--cases",
          cases,
          "--seed",
          "7",
          "--jobs",
          "1",
          "--progress",
          "plain",
          "--report",
          nights + "/" + night,
          "--corpus",
          nights + "/" + night + "/corpus"};
}

// Night 1 finds the bug (new, not flaky); night 2 meets it again with a ledger entry (open,
// known: exit 0); the fix lands (the entry's backend is now the plain host model): night 3
// fixed, night 4 verified.
TEST(NightsCli, ThreeNightsOfAPlantedBug) {
  const std::string dir = test::fresh_dir("nights");
  const std::string bug = "cpu-mma~unmasked-pad-columns";
  auto r = run_cli(campaign(dir, "2026-12-01", bug));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  r = run_cli({"nights", dir});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("night 2026-12-01 (first night)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("new       since 2026-12-01"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("flaky"), std::string::npos) << r.output;
  const Report n1 = load_report(dir + "/2026-12-01/report.json");
  ASSERT_FALSE(n1.findings.empty());
  EXPECT_EQ(n1.findings.front().state, "new");
  EXPECT_EQ(n1.findings.front().flaky_runs, 3);
  EXPECT_EQ(n1.findings.front().flaky_failures, 3);

  nlohmann::json ledger = {
      {"format", "mlafuzz-known"},
      {"version", 1},
      {"known",
       {{{"id", "T-7"}, {"note", "pad columns"}, {"backend", bug}, {"property", "tolerance"}}}}};
  write_file_atomic(dir + "/known.json", ledger.dump());
  r = run_cli(campaign(dir, "2026-12-02", bug));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  r = run_cli({"nights", dir, "--known", dir + "/known.json"});
  EXPECT_EQ(r.exit_code, 0) << r.output;  // open, but known
  EXPECT_NE(r.output.find("open      since 2026-12-01"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[known: T-7]"), std::string::npos) << r.output;

  // The fix: every corpus entry of the bug now names the fixed kernel.
  namespace fs = std::filesystem;
  for (const auto& night : {"2026-12-01", "2026-12-02"}) {
    for (const auto& e : fs::directory_iterator(dir + "/" + night + "/corpus")) {
      nlohmann::json j = nlohmann::json::parse(read_file(e.path().string()));
      j["finding"]["backend"] = "cpu-mma";
      j["finding"]["backend_source"] = "cpu-mma";
      write_file_atomic(e.path().string(), j.dump(2));
    }
  }
  r = run_cli(campaign(dir, "2026-12-03", "cpu-mma"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli({"nights", dir});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fixed     since 2026-12-03"), std::string::npos) << r.output;
  r = run_cli(campaign(dir, "2026-12-04", "cpu-mma"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli({"nights", dir});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("verified  since 2026-12-04"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/2026-12-04/lifecycle.json"));

  r = run_cli({"nights", dir, "--night", "2026-12-09"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("2026-12-09: no such night"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mlafuzz::campaign

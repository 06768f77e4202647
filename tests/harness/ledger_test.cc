// The known-failure ledger: reading and checking the file, matching findings, and `fuzz --known`
// / `report --known` on a planted bug (the cpu-mma~unmasked-pad-columns host-model mutant).
#include "harness/campaign/ledger.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fileio.h"
#include "harness/campaign/report.h"
#include "tests/core/test_util.h"
#include "tests/harness/cli_helpers.h"

namespace mlafuzz::campaign {
namespace {

using test::run_cli;

std::string write_ledger(const std::string& dir, const nlohmann::json& known,
                         const std::string& name = "known.json") {
  nlohmann::json j = {{"format", "mlafuzz-known"}, {"version", 1}, {"known", known}};
  const std::string path = dir + "/" + name;
  write_file_atomic(path, j.dump(2));
  return path;
}

void expect_ledger_error(const nlohmann::json& known, const std::string& expected) {
  const std::string dir = test::fresh_dir("ledger-bad");
  const std::string path = write_ledger(dir, known);
  try {
    load_ledger(path);
    ADD_FAILURE() << "accepted: " << known.dump();
  } catch (const LedgerError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
}

TEST(Ledger, BadEntriesAreRefusedNamingTheField) {
  const nlohmann::json ok = {{"id", "T-1"}, {"note", "n"}, {"property", "tolerance"}};
  auto without = [&](const std::string& key) {
    nlohmann::json e = ok;
    e.erase(key);
    return nlohmann::json::array({e});
  };
  expect_ledger_error(without("id"), "known[0].id: missing");
  expect_ledger_error(without("property"), "known[0]: give at least one of");
  nlohmann::json e = ok;
  e["note"] = "";
  expect_ledger_error(nlohmann::json::array({e}), "known[0].note: empty");
  e = ok;
  e["expires"] = "2027-13-01";
  expect_ledger_error(nlohmann::json::array({ok, e}),
                      "known[1].expires: expected a date YYYY-MM-DD");
  e = ok;
  e["ticket"] = "x";
  expect_ledger_error(nlohmann::json::array({e}), "known[0].ticket: unknown field");
  e = ok;
  e["causes"] = "sink";
  expect_ledger_error(nlohmann::json::array({e}), "known[0].causes: expected an array");

  const std::string dir = test::fresh_dir("ledger-bad-file");
  write_file_atomic(dir + "/v2.json", R"({"format": "mlafuzz-known", "version": 2, "known": []})");
  EXPECT_THROW(load_ledger(dir + "/v2.json"), LedgerError);
  write_file_atomic(dir + "/text.json", "not json");
  EXPECT_THROW(load_ledger(dir + "/text.json"), LedgerError);
  EXPECT_THROW(load_ledger(dir + "/missing.json"), LedgerError);
}

TEST(Ledger, EntriesMatchByEveryPatternTheyGive) {
  Finding f;
  f.backend = "python:/k/flashmla_sparse.py:decode";
  f.property = "row-alone";
  f.properties = {"row-alone", "permute"};
  f.causes = {"batch of 2 rows", "sink = -inf"};
  f.signature =
      "python:/k/flashmla_sparse.py:decode | bitwise difference | batch of 2 rows; "
      "sink = -inf";
  KnownEntry e;
  e.property = "row-alone";
  EXPECT_TRUE(entry_matches(e, f));  // backend "*"
  e.backend = "python:*flashmla*";
  EXPECT_TRUE(entry_matches(e, f));
  e.backend = "cuda-mma";
  EXPECT_FALSE(entry_matches(e, f));
  e.backend = "*";
  e.property = "tolerance";
  EXPECT_FALSE(entry_matches(e, f));
  e.property.clear();
  e.property = "permute";  // any property the finding fails
  EXPECT_TRUE(entry_matches(e, f));
  e.property.clear();
  e.signature = "python:* | bitwise difference | *";
  EXPECT_TRUE(entry_matches(e, f));
  e.causes = {"batch of *"};
  EXPECT_TRUE(entry_matches(e, f));
  e.causes = {"batch of *", "sink*"};  // every cause pattern must match one cause
  EXPECT_TRUE(entry_matches(e, f));
  e.causes = {"batch of *", "page*"};
  EXPECT_FALSE(entry_matches(e, f));
}

TEST(Ledger, ApplyMarksKnownFindingsAndListsExpiredAndUnseenEntries) {
  Ledger l;
  l.path = "known.json";
  KnownEntry a;
  a.id = "T-1";
  a.note = "first";
  a.property = "tolerance";
  KnownEntry b = a;
  b.id = "T-2";
  b.property = "poison";
  b.expires = "2026-12-05";
  l.entries = {a, b};
  std::vector<Finding> fs(2);
  fs[0].property = "tolerance";
  fs[0].backend = "cpu-mma";
  fs[1].property = "permute";
  fs[1].backend = "cpu-mma";
  fs[1].known = "stale";  // cleared: only the ledger marks findings
  LedgerResult r = apply_ledger(l, fs, "2026-12-04");
  EXPECT_EQ(r.known, 1);
  EXPECT_EQ(r.unknown, 1);
  EXPECT_EQ(fs[0].known, "T-1");
  EXPECT_EQ(fs[0].known_note, "first");
  EXPECT_EQ(fs[1].known, "");
  EXPECT_TRUE(r.expired.empty());
  EXPECT_EQ(r.unseen, std::vector<size_t>{1});
  r = apply_ledger(l, fs, "2026-12-05");  // the expiry day itself fails
  EXPECT_EQ(r.expired, std::vector<size_t>{1});
  const std::string text = render_ledger(l, r, {-1});
  EXPECT_NE(text.find("1 known finding(s), 1 new"), std::string::npos) << text;
  EXPECT_NE(text.find("entry 1 (T-2) expired on 2026-12-05"), std::string::npos) << text;
  EXPECT_NE(text.find("no case recorded"), std::string::npos) << text;
}

std::vector<std::string> night(const std::string& dir, const std::string& name,
                               const std::string& backend, std::vector<std::string> extra = {}) {
  // 8 under MLAFUZZ_TEST_QUICK: the bug's first finding is case 0 of seed 7.
  const std::string cases = mlafuzz::testing::full_or_quick<std::string>("30", "8");
  std::vector<std::string> a = {"fuzz",
                                "--backends",
                                backend,
                                "--properties",
                                "tolerance",
                                "--cases",
                                cases,
                                "--seed",
                                "7",
                                "--report",
                                dir + "/" + name,
                                "--corpus",
                                dir + "/corpus-" + name,
                                "--jobs",
                                "1",
                                "--progress",
                                "plain"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Night 1 finds the planted bug; a ledger entry makes night 2 pass with the finding known; an
// expired entry fails; an entry whose case now passes is "fixed?", failing under --strict-known.
TEST(LedgerCli, KnownFindingsDoNotFailTheRun) {
  const std::string dir = test::fresh_dir("ledger-cli");
  const std::string bug = "cpu-mma~unmasked-pad-columns";
  auto r = run_cli(night(dir, "night1", bug));
  ASSERT_EQ(r.exit_code, 1) << r.output;
  const Report n1 = load_report(dir + "/night1/report.json");
  ASSERT_FALSE(n1.findings.empty()) << r.output;
  const std::string case_path = n1.findings.front().corpus_path;

  const std::string ledger = write_ledger(dir, {{{"id", "https://example.org/issues/7"},
                                                 {"note", "pad columns read unmasked"},
                                                 {"backend", "cpu-mma~unmasked-*"},
                                                 {"property", "tolerance"},
                                                 {"case", case_path}}});
  r = run_cli(night(dir, "night2", bug, {"--known", ledger}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("known finding(s), 0 new"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[known: https://example.org/issues/7]"), std::string::npos) << r.output;
  const Report n2 = load_report(dir + "/night2/report.json");
  ASSERT_FALSE(n2.findings.empty());
  for (const auto& f : n2.findings) EXPECT_EQ(f.known, "https://example.org/issues/7");

  // `report --known` and `report --compare --known` on night 1's report.
  r = run_cli({"report", dir + "/night1/report.json", "--known", ledger});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_cli({"report", dir + "/night1/report.json", "--known", dir + "/none.json"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("none.json"), std::string::npos) << r.output;
  r = run_cli(night(dir, "clean", "cpu-mma"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cli({"report", "--compare", dir + "/clean/report.json", dir + "/night1/report.json"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  r = run_cli({"report", "--compare", dir + "/clean/report.json", dir + "/night1/report.json",
               "--known", ledger});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("known new finding"), std::string::npos) << r.output;

  // An expired entry fails the run even though it knows the finding.
  const std::string expired = write_ledger(
      dir, {{{"id", "T-9"}, {"note", "n"}, {"property", "tolerance"}, {"expires", "2000-01-01"}}},
      "expired.json");
  r = run_cli(night(dir, "night3", bug, {"--known", expired}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("entry 0 (T-9) expired on 2000-01-01"), std::string::npos) << r.output;

  // The bug is gone (the plain host model): the entry is unseen and its case, replayed on the
  // fixed backend, passes.
  nlohmann::json entry = nlohmann::json::parse(read_file(case_path));
  entry["finding"]["backend"] = "cpu-mma";
  entry["finding"]["backend_source"] = "cpu-mma";
  write_file_atomic(dir + "/fixed_case.json", entry.dump(2));
  const std::string fixed = write_ledger(dir,
                                         {{{"id", "T-3"},
                                           {"note", "n"},
                                           {"backend", "cpu-mma*"},
                                           {"property", "tolerance"},
                                           {"case", "fixed_case.json"}}},
                                         "fixed.json");
  r = run_cli(night(dir, "night4", "cpu-mma", {"--known", fixed}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("now passes: fixed? remove the entry"), std::string::npos) << r.output;
  r = run_cli(night(dir, "night5", "cpu-mma", {"--known", fixed, "--strict-known"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--strict-known"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mlafuzz::campaign

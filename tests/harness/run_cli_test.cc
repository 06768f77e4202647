// The mlafuzz binary end to end: exit codes, --help, list-backends, run, --dump, and the
// independent numpy check of a dump (scripts/check_dump.py) when numpy is importable.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

#include "core/case.h"
#include "core/fileio.h"
#include "tests/core/build_paths.h"
#include "tests/core/test_util.h"

namespace mlafuzz {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

struct Output {
  int rc = -1;
  std::string text;  // stdout and stderr together
};

Output sh(const std::string& cmd) {
  Output o;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) o.text.append(buf, n);
  const int status = ::pclose(p);
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

Output mlafuzz(const std::string& args) {
  return sh(std::string(mlafuzz::build_paths::kMlafuzz) + " " + args);
}

std::string corpus(const std::string& name) {
  return std::string(mlafuzz::build_paths::kSourceDir) + "/corpus/cases/" + name;
}

TEST(Cli, HelpEverywhere) {
  for (const char* args : {"--help", "run --help", "list-backends --help"}) {
    const Output o = mlafuzz(args);
    EXPECT_EQ(o.rc, 0) << args << "\n" << o.text;
    EXPECT_NE(o.text.find("Usage"), std::string::npos) << args << "\n" << o.text;
  }
  EXPECT_EQ(mlafuzz("").rc, 2);  // a subcommand is required
  EXPECT_EQ(mlafuzz("no-such-command").rc, 2);
  EXPECT_EQ(mlafuzz("run").rc, 2);  // --case is required
}

TEST(Cli, ListBackends) {
  const Output o = mlafuzz("list-backends");
  EXPECT_EQ(o.rc, 0) << o.text;
  for (const char* name :
       {"oracle", "oracle-loop", "cpu-simt", "cpu-mma", "cuda-simt", "cuda-mma"}) {
    EXPECT_NE(o.text.find(name), std::string::npos) << name << "\n" << o.text;
  }
  EXPECT_NE(o.text.find("float64"), std::string::npos);
  // The columns line up whatever the names: every row's precision starts at the same column.
  std::set<size_t> columns;
  std::istringstream lines(o.text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == ' ') continue;
    columns.insert(line.find_first_not_of(' ', line.find(' ')));
  }
  EXPECT_EQ(columns.size(), 1u) << o.text;
}

TEST(Cli, RunsEveryCorpusCaseWithTheOracle) {
  int cases = 0;
  for (const auto& e :
       fs::directory_iterator(std::string(mlafuzz::build_paths::kSourceDir) + "/corpus/cases")) {
    if (e.path().extension() != ".json") continue;
    ++cases;
    const Output o = mlafuzz("run --case " + e.path().string());
    EXPECT_EQ(o.rc, 0) << e.path() << "\n" << o.text;
    EXPECT_NE(o.text.find("oracle"), std::string::npos) << o.text;
  }
  EXPECT_GE(cases, 10);
}

TEST(Cli, BadInputExitsTwoAndWritesNothing) {
  TempDir dir;
  write_file_atomic(dir.file("bad.json"), R"({"version": 1, "geometry": {"page_strde": 0}})");
  const std::string dump = dir.file("dump");
  Output o = mlafuzz("run --case " + dir.file("bad.json") + " --dump " + dump);
  EXPECT_EQ(o.rc, 2) << o.text;
  EXPECT_NE(o.text.find("geometry.page_strde"), std::string::npos) << o.text;
  EXPECT_FALSE(fs::exists(dump));

  o = mlafuzz("run --case " + dir.file("missing.json") + " --dump " + dump);
  EXPECT_EQ(o.rc, 2) << o.text;
  EXPECT_NE(o.text.find("missing.json"), std::string::npos) << o.text;
  EXPECT_FALSE(fs::exists(dump));

  o = mlafuzz("run --case " + corpus("edge_all_invalid.json") +
              " --backends no-such-backend --dump " + dump);
  EXPECT_EQ(o.rc, 2) << o.text;
  EXPECT_NE(o.text.find("no-such-backend"), std::string::npos) << o.text;
  EXPECT_FALSE(fs::exists(dump));
}

TEST(Cli, OracleLoopAgreesWithOracle) {
  const Output o = mlafuzz("run --case " + corpus("edge_p61_padded_permuted.json") +
                           " --backends oracle,oracle-loop");
  EXPECT_EQ(o.rc, 0) << o.text;
  EXPECT_NE(o.text.find("oracle-loop vs oracle: B="), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("out: all "), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("verdict PASS"), std::string::npos) << o.text;
}

// A run whose verdict passes never says FAIL: FlashMLA's fixed tolerances flag an element of the
// correct MMA pipeline on this case, printed as information.
TEST(Cli, FixedToleranceLinesAreInformationWhenTheVerdictPasses) {
  const Output o = mlafuzz("run --case " + corpus("edge_v32.json") + " --backends cpu-mma");
  EXPECT_EQ(o.rc, 0) << o.text;
  EXPECT_NE(o.text.find("out: info: 1 of 16384 elements outside FlashMLA's fixed tolerance"),
            std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("verdict PASS"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("FAIL"), std::string::npos) << o.text;
}

TEST(Cli, DumpWritesLoadableFiles) {
  TempDir dir;
  const std::string dump = dir.file("d");
  const Output o = mlafuzz("run --case " + corpus("edge_sink_inf.json") + " --dump " + dump);
  ASSERT_EQ(o.rc, 0) << o.text;
  for (const char* f :
       {"q.npy", "kv_cache.npy", "indices.npy", "topk_length.npy", "sink.npy", "out.npy",
        "out64.npy", "lse.npy", "lse64.npy", "case.json", "params.json"}) {
    EXPECT_TRUE(fs::exists(dump + "/" + f)) << f;
  }
  EXPECT_EQ(read_file(dump + "/q.npy").substr(0, 6), std::string("\x93NUMPY", 6));
  // The dumped recipe is the case that ran.
  EXPECT_EQ(to_json(load_case(dump + "/case.json")),
            to_json(load_case(corpus("edge_sink_inf.json"))));
}

// Finds a python3 that can import numpy: scripts/check_dump.py needs it.
std::string python_with_numpy() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    if (sh(std::string(py) + " -c 'import numpy'").rc == 0) return py;
  }
  return "";
}

TEST(Cli, DumpAgreesWithAnIndependentNumpyOracle) {
  const std::string py = python_with_numpy();
  if (py.empty()) GTEST_SKIP() << "no python3 with numpy here (install python3-numpy)";
  for (const char* name : {"edge_sink_inf.json", "edge_v32.json", "edge_p61_padded_permuted.json",
                           "edge_topk_length.json", "edge_head_padding.json"}) {
    TempDir dir;
    const std::string dump = dir.file("d");
    const Output run = mlafuzz("run --case " + corpus(name) + " --dump " + dump);
    ASSERT_EQ(run.rc, 0) << run.text;
    const Output o =
        sh(py + " " + mlafuzz::build_paths::kSourceDir + "/scripts/check_dump.py " + dump);
    EXPECT_EQ(o.rc, 0) << name << "\n" << o.text;
    EXPECT_NE(o.text.find("max"), std::string::npos) << o.text;
  }
  // The check can fail: a perturbation far below bf16 resolution is caught.
  TempDir dir;
  const std::string dump = dir.file("d");
  ASSERT_EQ(mlafuzz("run --case " + corpus("edge_v32.json") + " --dump " + dump).rc, 0);
  ASSERT_EQ(sh(py + " -c \"import numpy as np; p='" + dump +
               "/out64.npy'; a=np.load(p); a[1,2,3]*=1+1e-7; np.save(p,a)\"")
                .rc,
            0);
  const Output o =
      sh(py + " " + mlafuzz::build_paths::kSourceDir + "/scripts/check_dump.py " + dump);
  EXPECT_EQ(o.rc, 1) << o.text;
}

}  // namespace
}  // namespace mlafuzz

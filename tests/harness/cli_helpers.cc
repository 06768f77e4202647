#include "tests/harness/cli_helpers.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/core/build_paths.h"

namespace mlafuzz::test {

pid_t start_cli(const std::vector<std::string>& args, const std::vector<std::string>& env,
                const std::string& output_path) {
  std::vector<std::string> argv_store = {mlafuzz::build_paths::kMlafuzz};
  argv_store.insert(argv_store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);  // or the child flushes the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const char* v : {"GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", "SLURM_ARRAY_TASK_ID",
                          "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "JOB_COMPLETION_INDEX",
                          "MLAFUZZ_SHARD_COUNT", "MLAFUZZ_TEST_FAULT"}) {
      ::unsetenv(v);
    }
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::FILE* f = std::freopen(output_path.c_str(), "w", stdout);
    if (!f) ::_exit(126);
    ::dup2(STDOUT_FILENO, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

bool wait_for(const std::function<bool()>& happened, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (!happened()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // between polls
  }
  return true;
}

CliRun wait_cli(pid_t pid, const std::string& output_path, double timeout_s) {
  CliRun r;
  int st = 0;
  if (!wait_for([&] { return ::waitpid(pid, &st, WNOHANG) == pid; }, timeout_s)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    ADD_FAILURE() << "mlafuzz did not finish within " << timeout_s << " s";
  }
  if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
  std::ifstream in(output_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

CliRun run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env,
               double timeout_s) {
  static int counter = 0;
  const std::string out =
      (std::filesystem::temp_directory_path() /
       ("mlafuzz-cli-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log"))
          .string();
  const pid_t pid = start_cli(args, env, out);
  CliRun r = wait_cli(pid, out, timeout_s);
  std::filesystem::remove(out);
  return r;
}

std::string fresh_dir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "x";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mlafuzz-campaign-" + std::to_string(::getpid())) / test / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace mlafuzz::test

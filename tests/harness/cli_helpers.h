// Running the built mlafuzz binary from tests: fork/exec with extra environment, a time limit,
// output captured to a file.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mlafuzz::test {

struct CliRun {
  int exit_code = -1;  // -1: killed by a signal (see signal)
  int signal = 0;
  std::string output;  // stdout and stderr
};

// Sharding variables of the test's own environment are removed, then `env` ("K=V") is added.
pid_t start_cli(const std::vector<std::string>& args, const std::vector<std::string>& env,
                const std::string& output_path);
CliRun wait_cli(pid_t pid, const std::string& output_path, double timeout_s);

// Polls `happened` until it returns true (then true) or `timeout_s` passes (then false). The
// timeout only guards against a hang: a test waits for an event, never for a length of time.
bool wait_for(const std::function<bool()>& happened, double timeout_s);
CliRun run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
               double timeout_s = 240);

// A fresh empty folder under the test temp dir.
std::string fresh_dir(const std::string& name);

}  // namespace mlafuzz::test

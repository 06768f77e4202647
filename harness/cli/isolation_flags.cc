// --in-process and --case-timeout of `run` and `repro` (commands.h).
#include <cstdlib>
#include <string>

#include "harness/backends/python_backend.h"
#include "harness/campaign/options.h"
#include "harness/cli/commands.h"

namespace mlafuzz::cli {

void add_isolation_flags(CLI::App* sub, IsolationFlags& f) {
  sub->add_flag("--in-process", f.in_process,
                "load plugins into this process instead of a worker process (debugging: a "
                "crash or exit() in the plugin then ends mlafuzz)");
  sub->add_option("--case-timeout", f.case_timeout,
                  "a plugin or python: kernel call running longer is a hang: killed, a fault "
                  "outcome (e.g. 30s, 2m; default MLAFUZZ_PYTHON_TIMEOUT seconds, else 60 s)");
}

campaign::IsolationOptions isolation_options(const IsolationFlags& f) {
  campaign::IsolationOptions o;
  o.in_process = f.in_process;
  if (f.case_timeout.empty()) {
    o.case_timeout_s = python_call_timeout();  // MLAFUZZ_PYTHON_TIMEOUT, else 60 s
    return o;
  }
  o.case_timeout_s = campaign::parse_duration(f.case_timeout);
  if (!(o.case_timeout_s > 0)) throw std::invalid_argument("--case-timeout must be > 0");
  ::setenv("MLAFUZZ_PYTHON_TIMEOUT", std::to_string(o.case_timeout_s).c_str(), 1);
  return o;
}

}  // namespace mlafuzz::cli

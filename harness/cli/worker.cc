// `mlafuzz worker` (internal): serves one backend to a campaign over stdin/stdout, or answers
// a device query. Campaigns start it; people do not need to.
#include "harness/campaign/worker.h"

#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>

#include "harness/backends/device_query.h"
#include "harness/cli/commands.h"

namespace mlafuzz::cli {
namespace {

struct WorkerOptions {
  std::string backend;
  int shm_fd = -1;
  int arena_fd = -1;
  bool device_info = false;
  bool count_devices = false;
};

int worker_command(const WorkerOptions& o) {
  if (o.device_info || o.count_devices) {
    const DeviceInfo d = query_devices();
    if (o.count_devices) {
      std::cout << d.count << '\n';
    } else {
      std::cout << device_info_to_json(d);
    }
    return kExitOk;
  }
  if (o.backend.empty()) {
    std::cerr << "mlafuzz worker: --backend NAME, --device-info or --count-devices required\n";
    return kExitBadInput;
  }
  return campaign::run_worker(o.backend, STDIN_FILENO, STDOUT_FILENO, o.shm_fd, o.arena_fd);
}

}  // namespace

void register_worker(CLI::App& app, CommandTable& table) {
  auto o = std::make_shared<WorkerOptions>();
  CLI::App* sub = app.add_subcommand(
      "worker", "Internal: serve one backend to a campaign over stdin/stdout (fault isolation).");
  sub->group("");  // hidden from --help
  sub->add_option("--backend", o->backend, "backend to construct with make_backend()");
  sub->add_option("--shm-fd", o->shm_fd, "inherited shared memory for large vectors");
  sub->add_option("--arena-fd", o->arena_fd, "the campaign's shared arena, read-only");
  sub->add_flag("--device-info", o->device_info, "print the GPUs, driver and CUDA versions");
  sub->add_flag("--count-devices", o->count_devices, "print the number of GPUs");
  table.push_back({sub, [o] { return worker_command(*o); }});
}

}  // namespace mlafuzz::cli

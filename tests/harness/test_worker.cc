// mlafuzz_test_worker: `mlafuzz worker` with test hooks, started by the isolation tests in place of
// mlafuzz (WorkerSpec::exe, or MLAFUZZ_WORKER_EXE for a campaign run as a binary), so that fault
// isolation and the overlapped batch loop are tested without a GPU. Read from its environment:
//   MLAFUZZ_TEST_FAULT=crash|abort|hang|sticky[:MIN_HEADS]: segfault, abort, hang, or report a
//     sticky device error where a case with at least MIN_HEADS heads (default 1) runs;
//   MLAFUZZ_TEST_OVERLAP=1: the backend wrapped so that it overlaps two calls as the CUDA
//     backends do (a PipelinedBackend: begin_case keeps a copy of the case, finish_case runs it).
// Usage: as `mlafuzz worker`: worker --backend NAME [--shm-fd N] [--arena-fd N].
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/settings.h"
#include "harness/campaign/worker.h"

namespace mlafuzz::campaign {
namespace {

class OverlapForTests final : public ForwardingBackend<PipelinedBackend> {
 public:
  explicit OverlapForTests(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}

 protected:
  std::unique_ptr<Pending> begin_case(const MaterializedCase& m) override {
    if (++in_flight_ > 2) throw std::logic_error("more than two calls begun");
    auto p = std::make_unique<Copied>();
    p->m = m;
    return p;
  }
  RunResult finish_case(std::unique_ptr<Pending> pending) override {
    auto* p = dynamic_cast<Copied*>(pending.get());
    if (p == nullptr) throw std::logic_error("finish_case of a call begun elsewhere");
    --in_flight_;
    return ForwardingBackend::run_case(p->m);
  }

 private:
  struct Copied final : Pending {
    MaterializedCase m;
  };
  int in_flight_ = 0;
};

WorkerHooks hooks_from_env() {
  WorkerHooks h;
  if (settings::flag("MLAFUZZ_TEST_OVERLAP", false)) {
    h.wrap_backend = [](std::unique_ptr<Backend> b) {
      return std::make_unique<OverlapForTests>(std::move(b));
    };
  }
  const auto fault = settings::text("MLAFUZZ_TEST_FAULT");
  if (!fault) return h;
  std::string kind = *fault;
  int min_heads = 1;
  if (const auto colon = kind.find(':'); colon != std::string::npos) {
    min_heads = std::atoi(kind.c_str() + colon + 1);
    kind.resize(colon);
  }
  if (kind == "sticky") {
    h.sticky_error = [min_heads](int32_t heads) -> std::optional<std::string> {
      if (heads < min_heads) return std::nullopt;
      return "cudaErrorIllegalAddress: an illegal memory access was encountered (test hook)";
    };
  } else if (kind == "crash" || kind == "abort" || kind == "hang") {
    h.before_run = [kind, min_heads](int32_t heads) {
      if (heads < min_heads) return;
      if (kind == "crash") {
        ::signal(SIGSEGV, SIG_DFL);
        ::raise(SIGSEGV);
      } else if (kind == "abort") {
        std::abort();
      }
      while (true) ::pause();
    };
  } else {
    throw std::invalid_argument("MLAFUZZ_TEST_FAULT=" + *fault +
                                ": give crash, abort, hang or sticky[:MIN_HEADS]");
  }
  return h;
}

}  // namespace
}  // namespace mlafuzz::campaign

int main(int argc, char** argv) {
  std::string backend;
  int shm_fd = -1, arena_fd = -1;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--backend") {
      backend = value;
    } else if (flag == "--shm-fd") {
      shm_fd = std::atoi(value.c_str());
    } else if (flag == "--arena-fd") {
      arena_fd = std::atoi(value.c_str());
    }
  }
  if (argc < 2 || std::strcmp(argv[1], "worker") != 0 || backend.empty()) {
    std::fprintf(stderr, "usage: %s worker --backend NAME [--shm-fd N] [--arena-fd N]\n", argv[0]);
    return 2;
  }
  try {
    return mlafuzz::campaign::run_worker(backend, STDIN_FILENO, STDOUT_FILENO, shm_fd, arena_fd,
                                         mlafuzz::campaign::hooks_from_env());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlafuzz_test_worker: %s\n", e.what());
    return 2;
  }
}

// Speed of the host models cpu-simt and cpu-mma on the original test's production shapes
// (H = 64, MODEL1, P = 256: B 1 to 32, topk 128 and 512). Moved here from the unit suite, which
// measures no speed.
//
// Usage: bench_host_models [--min-seconds S]
// Prints one markdown table row per (backend, shape): ms per case and cases per second in CPU
// time of this thread (the machine may be shared: wall time would measure the neighbours).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "core/materialize.h"
#include "harness/backends/registry.h"

namespace {

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Shape {
  int32_t batch, topk;
};

}  // namespace

int main(int argc, char** argv) {
  double min_seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min-seconds" && i + 1 < argc) {
      min_seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_host_models [--min-seconds S]\n"
                   "times cpu-simt and cpu-mma on H=64 MODEL1 P=256 production shapes\n");
      return a == "--help" ? 0 : 2;
    }
  }
  std::printf("| backend | B | topk | runs | ms/case | cases/s |\n|---|---|---|---|---|---|\n");
  for (const Shape s :
       {Shape{1, 128}, Shape{4, 512}, Shape{16, 512}, Shape{32, 128}, Shape{32, 512}}) {
    mlafuzz::Case c;
    c.geom.page_size = 256;
    c.geom.num_pages = 32;
    c.batch = s.batch;
    c.heads = 64;
    c.topk = s.topk;
    c.data_seed = 7;
    const mlafuzz::MaterializedCase m = mlafuzz::materialize(c);
    for (const std::string name : {"cpu-simt", "cpu-mma"}) {
      auto backend = mlafuzz::make_backend(name);
      int runs = 0;
      const double start = thread_cpu_seconds();
      double elapsed = 0;
      while (runs < 2 || elapsed < min_seconds) {
        const mlafuzz::RunResult r = backend->run(m);
        if (!r.ok() || !std::isfinite(r.out[0]) || !std::isfinite(r.lse[0])) {
          std::fprintf(stderr, "%s failed on B=%d topk=%d\n", name.c_str(), s.batch, s.topk);
          return 1;
        }
        ++runs;
        elapsed = thread_cpu_seconds() - start;
      }
      std::printf("| %s | %d | %d | %d | %.2f | %.1f |\n", name.c_str(), s.batch, s.topk, runs,
                  1e3 * elapsed / runs, runs / elapsed);
      std::fflush(stdout);
    }
  }
  return 0;
}

// Speed of the float64 oracles on the production shapes (docs/SPEC.md section 3: H = 64, MODEL1,
// topk 128 with P = 256 and topk 512 with P = 64), single- and multi-threaded.
//
// Usage: bench_oracle [--min-seconds S] [--loop-max-batch N] [--threads N]
// Prints one table row per (shape, B, oracle, threads): ms per case, GFLOP/s counting
// 2*B*H*n_valid*(d_qk + d_v) flops (the two products), cases per second, and the same per CPU
// second of all threads (CPU time stays meaningful on a machine shared with other jobs).
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "core/materialize.h"
#include "oracle/oracle.h"

namespace {

using mlafuzz::MaterializedCase;
using Clock = std::chrono::steady_clock;

struct Shape {
  int page_size, topk, num_pages;
};

MaterializedCase make_case(const Shape& s, int batch) {
  mlafuzz::Case c;
  c.name = "bench";
  c.geom.layout = mla::Layout::kModel1;
  c.geom.page_size = s.page_size;
  c.geom.num_pages = s.num_pages;
  c.geom.page_stride = 0;  // the layout's minimum
  c.batch = batch;
  c.heads = 64;
  c.topk = s.topk;
  c.data_seed = 2026;
  return mlafuzz::materialize(c);
}

int64_t valid_entries(const MaterializedCase& m) {
  int64_t n = 0;
  for (int b = 0; b < m.batch; ++b) {
    const int32_t len = m.topk_length.empty() ? -1 : m.topk_length[b];
    for (int k = 0; k < m.topk; ++k) {
      n += mla::index_valid(m.indices[b * m.topk + k], k, len, m.conv) ? 1 : 0;
    }
  }
  return n;
}

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double wall;  // median wall seconds per call
  double cpu;   // median CPU seconds per call, all threads (robust to a loaded machine)
};

// Runs f once to warm up (optional), then until min_seconds have passed (at least once).
template <class F>
Timing time_it(F&& f, double min_seconds, bool warm_up = true) {
  if (warm_up) f();  // first-touch of the output buffers, thread start-up paths, caches
  std::vector<double> wall, cpu;
  const auto start = Clock::now();
  do {
    const double c0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    f();
    wall.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    cpu.push_back(process_cpu_seconds() - c0);
  } while (std::chrono::duration<double>(Clock::now() - start).count() < min_seconds &&
           wall.size() < 1000);
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  double min_seconds = 0.5;
  int loop_max_batch = 16;  // the loop oracle is ~40x slower: keep the run short
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min-seconds" && i + 1 < argc) {
      min_seconds = std::atof(argv[++i]);
    } else if (a == "--loop-max-batch" && i + 1 < argc) {
      loop_max_batch = std::atoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_oracle [--min-seconds S] [--loop-max-batch N] [--threads N]\n"
                   "times the float64 oracles on H=64 MODEL1 production shapes\n");
      return a == "--help" ? 0 : 2;
    }
  }
  // A long-running campaign reaches a steady state where glibc's adaptive mmap threshold has
  // grown past Eigen's GEMM packing buffers (~0.3-2 MB). A fresh process frees and re-faults
  // them on every product instead (measured: 2.7-4.5 ms instead of 0.6 ms per B=1, topk=128
  // case). Fix the thresholds so every row below measures the steady state.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  const Shape shapes[] = {{256, 128, 64}, {64, 512, 256}};
  std::printf("hardware threads: %u\n", std::thread::hardware_concurrency());
  std::printf(
      "| P | topk | B | oracle | threads | ms/case | GFLOP/s | cases/s | CPU ms/case | "
      "GFLOP/s per core |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    for (int batch : {1, 16, 32, 64}) {
      const MaterializedCase m = make_case(s, batch);
      const double flops =
          2.0 * static_cast<double>(valid_entries(m)) * m.heads * (m.d_qk() + m.d_v());
      auto row = [&](const char* name, int th, Timing t) {
        std::printf("| %d | %d | %d | %s | %d | %.3f | %.1f | %.1f | %.3f | %.1f |\n", s.page_size,
                    s.topk, batch, name, th, t.wall * 1e3, flops / t.wall * 1e-9, 1.0 / t.wall,
                    t.cpu * 1e3, flops / t.cpu * 1e-9);
        std::fflush(stdout);
      };
      std::vector<int> counts = {1};
      if (threads > 1) counts.push_back(threads);
      for (int th : counts) {
        row("eigen", th, time_it([&] { (void)mlafuzz::run_oracle_eigen(m, th); }, min_seconds));
      }
      if (batch <= loop_max_batch) {
        row("loop", 1, time_it([&] { (void)mlafuzz::run_oracle_loop(m); }, 0.0, false));
      }
    }
  }
  return 0;
}

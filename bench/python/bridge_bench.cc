// Per-call cost of the python: bridge on the original shapes (docs/SPEC.md section 1: H = 64,
// MODEL1; topk 128 with P = 256 and topk 512 with P = 64; B in {1, 4, 16, 32}), with a kernel that
// returns at once, so that every microsecond is the bridge's. Per shape and call, a freshly
// materialized case (its own data seed) is run three times:
//   cold:    its first call (a device="cuda" worker has not seen its buffers: copies them all);
//   warm:    the same case again (the device cache's identities match: nothing is copied);
//   variant: a copy of the case (MaterializedCase copy, as property variants start), which
//            inherits the buffers' identities (SharedArena::inherit): warm for a device cache.
// Prints the median run() of each, what any in-process bf16 backend pays for the same outputs
// (canary-filled buffers, widened into the RunResult: "outputs"), and the bridge: run() less
// outputs less the kernel's own time (request, pipe, the worker's views, copies, reply).
// MLAFUZZ_DEVICE_CACHE=0 measures the bridge without the device cache (cold = warm).
//
//   bridge_bench [BACKEND] [CALLS] [SHAPES]
//   default BACKEND python:examples/python/numpy_decode.py:decode_noop (run from the source
//   root); on the GPU machine: python:examples/python/torch_decode.py:decode_noop. SHAPES, e.g.
//   "1:128,32:512", keeps only those B:topk pairs (with MLAFUZZ_WORKER_PROFILE=DIR, a profile
//   of the worker on those shapes alone).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/case.h"
#include "core/materialize.h"
#include "core/shared_arena.h"
#include "harness/backends/registry.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "1:128,32:512" -> {(1, 128), (32, 512)}; empty: every shape. Exits 2 on a malformed list.
std::set<std::pair<int, int>> parse_shapes(const char* text) {
  std::set<std::pair<int, int>> shapes;
  if (text == nullptr) return shapes;
  const std::string s = text;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t end = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, end - at);
    int b = 0, k = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d:%d%c", &b, &k, &tail) != 2 || b < 1 || k < 1) {
      std::fprintf(stderr, "bridge_bench: SHAPES item '%s': give B:topk, e.g. 32:512\n",
                   item.c_str());
      std::exit(2);
    }
    shapes.emplace(b, k);
    at = end + 1;
  }
  return shapes;
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string case_json(int batch, int topk, int page_size, int seed) {
  const int pages = (2 * batch * topk + page_size - 1) / page_size;
  char buf[2048];
  std::snprintf(buf, sizeof buf, R"({
  "format": "mlafuzz-case", "version": 1, "name": "bench",
  "geometry": {"layout": "model1", "nope_dim": 448, "rope_dim": 64, "scale_tile": 64,
               "page_size": %d, "page_stride": 0, "num_pages": %d},
  "batch": %d, "heads": 64, "topk": %d,
  "index_spec": {"rule": "random", "invalid_fraction": 0.0, "duplicate_fraction": 0.0},
  "conventions": {"invalid_index": "minus_one_only", "empty_lse": "+inf", "sink_in_lse": false},
  "q_head_pad": 0, "out_head_pad": 0,
  "q_values": {"dist": "normal", "magnitude": 1.0, "special_fraction": 0.0},
  "kv_values": {"dist": "normal", "magnitude": 1.0, "special_fraction": 0.0},
  "rope_values": {"dist": "normal", "magnitude": 1.0, "special_fraction": 0.0},
  "scales": {"mode": "writer", "exp_lo": 127, "exp_hi": 127},
  "pad_fill": "zero", "data_seed": %d})",
                page_size, pages, batch, topk, seed);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend =
      argc > 1 ? argv[1] : "python:examples/python/numpy_decode.py:decode_noop";
  const int calls = argc > 2 ? std::atoi(argv[2]) : 50;
  const std::set<std::pair<int, int>> only = parse_shapes(argc > 3 ? argv[3] : nullptr);
  auto b = mlafuzz::make_backend(backend);
  std::printf("backend %s, %d calls per shape (median per call, ms)\n", backend.c_str(), calls);
  std::printf("arena %s\n", mlafuzz::SharedArena::get() != nullptr ? "on" : "off");
  std::printf("%-24s %9s | %9s %9s %9s | %9s | %9s %9s %9s | %9s\n", "shape", "inputs MB", "cold",
              "warm", "variant", "outputs", "bridge c", "bridge w", "bridge v", "kernel");
  for (const int topk : {128, 512}) {
    for (const int batch : {1, 4, 16, 32}) {
      if (!only.empty() && only.count({batch, topk}) == 0) continue;
      const int page_size = topk == 128 ? 256 : 64;
      size_t in_bytes = 0;
      std::vector<double> run_s[3], kernel_s[3], outputs_s;
      for (int i = -3; i < calls; ++i) {  // the first three warm up: worker started, maps made
        const mlafuzz::MaterializedCase m = mlafuzz::materialize(
            mlafuzz::case_from_json(case_json(batch, topk, page_size, 100 + i)));
        in_bytes = m.q.size() * 2 + m.cache.size() + m.indices.size() * 4;
        for (int k = 0; k < 3; ++k) {
          const mlafuzz::MaterializedCase variant = k == 2 ? m : mlafuzz::MaterializedCase{};
          const auto t0 = Clock::now();
          const mlafuzz::RunResult r = b->run(k == 2 ? variant : m);
          const double s = since(t0);
          if (r.status == mlafuzz::RunStatus::kError || r.status == mlafuzz::RunStatus::kFault) {
            std::fprintf(stderr, "run failed: %s\n", r.message.c_str());
            return 1;
          }
          if (i >= 0) {
            run_s[k].push_back(s);
            kernel_s[k].push_back(r.seconds);
          }
        }  // freed before the next measurement, so that both see the same heap
        // What an in-process bf16 backend pays around its kernel.
        const auto t1 = Clock::now();
        mlafuzz::OutputBuffers bufs(m);
        mlafuzz::RunResult o = mlafuzz::collect_outputs(m, std::move(bufs));
        mlafuzz::finish_outputs(m, o, /*raw_outputs=*/false);
        if (i >= 0) outputs_s.push_back(since(t1));
        if (o.out.empty()) return 1;
      }
      const double outputs = median(outputs_s);
      double run[3], bridge[3];
      for (int k = 0; k < 3; ++k) {
        run[k] = median(run_s[k]);
        bridge[k] = run[k] - outputs - median(kernel_s[k]);
      }
      char shape[64];
      std::snprintf(shape, sizeof shape, "B=%d H=64 topk=%d P=%d", batch, topk, page_size);
      std::printf("%-24s %9.2f | %9.3f %9.3f %9.3f | %9.3f | %9.3f %9.3f %9.3f | %9.3f\n", shape,
                  in_bytes / 1e6, 1e3 * run[0], 1e3 * run[1], 1e3 * run[2], 1e3 * outputs,
                  1e3 * bridge[0], 1e3 * bridge[1], 1e3 * bridge[2], 1e3 * median(kernel_s[1]));
      std::fflush(stdout);
    }
  }
  return 0;
}

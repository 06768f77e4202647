// Per-call cost of the python: bridge on the original shapes (SPEC.md section 1: H = 64, MODEL1;
// topk 128 with P = 256 and topk 512 with P = 64; B in {1, 4, 16, 32}), with a kernel that
// returns at once, so that every microsecond is the bridge's. Prints, per shape, the median time
// of Backend::run(), of what any in-process bf16 backend pays for the same outputs (canary-filled
// buffers, widened into the RunResult: "outputs"), and the difference less the kernel's own time:
// the bridge (request, pipe, the worker's numpy views, reply, and whatever is copied).
// MLAFUZZ_SHARED_ARENA=0 measures the bridge without the shared arena (inputs copied into the
// call's shared memory, as before it existed).
//
//   bridge_bench [BACKEND] [CALLS]
//   default BACKEND python:examples/python/numpy_decode.py:decode_noop (run from the source
//   root); on the GPU machine: python:examples/python/torch_decode.py:decode_noop
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness/backends/registry.h"
#include "harness/core/backend.h"
#include "harness/core/case.h"
#include "harness/core/materialize.h"
#include "harness/core/shared_arena.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string case_json(int batch, int topk, int page_size) {
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
  "pad_fill": "zero", "data_seed": 5})",
                page_size, pages, batch, topk);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend =
      argc > 1 ? argv[1] : "python:examples/python/numpy_decode.py:decode_noop";
  const int calls = argc > 2 ? std::atoi(argv[2]) : 50;
  auto b = mlafuzz::make_backend(backend);
  std::printf("backend %s, %d calls per shape (median per call, ms)\n", backend.c_str(), calls);
  std::printf("arena %s\n", mlafuzz::SharedArena::get() != nullptr ? "on" : "off");
  std::printf("%-24s %9s %9s | %9s %9s %9s\n", "shape", "inputs MB", "run()", "outputs", "bridge",
              "kernel");
  for (const int topk : {128, 512}) {
    for (const int batch : {1, 4, 16, 32}) {
      const int page_size = topk == 128 ? 256 : 64;
      const mlafuzz::MaterializedCase m =
          mlafuzz::materialize(mlafuzz::case_from_json(case_json(batch, topk, page_size)));
      const size_t in_bytes = m.q.size() * 2 + m.cache.size() + m.indices.size() * 4;
      for (int i = 0; i < 3; ++i) (void)b->run(m);  // warm: worker started, memory mapped
      std::vector<double> run_s, kernel_s, outputs_s;
      for (int i = 0; i < calls; ++i) {
        {
          const auto t0 = Clock::now();
          const mlafuzz::RunResult r = b->run(m);
          run_s.push_back(since(t0));
          kernel_s.push_back(r.seconds);
          if (r.status == mlafuzz::RunStatus::kError || r.status == mlafuzz::RunStatus::kFault) {
            std::fprintf(stderr, "run failed: %s\n", r.message.c_str());
            return 1;
          }
        }  // freed before the next measurement, so that both see the same heap
        // What an in-process bf16 backend pays around its kernel.
        const auto t1 = Clock::now();
        mlafuzz::OutputBuffers bufs(m);
        const mlafuzz::RunResult o = mlafuzz::collect_outputs(m, std::move(bufs));
        outputs_s.push_back(since(t1));
        if (o.out.empty()) return 1;
      }
      const double run = median(run_s), outputs = median(outputs_s), kernel = median(kernel_s);
      char shape[64];
      std::snprintf(shape, sizeof shape, "B=%d H=64 topk=%d P=%d", batch, topk, page_size);
      std::printf("%-24s %9.2f %9.3f | %9.3f %9.3f %9.3f\n", shape, in_bytes / 1e6, 1e3 * run,
                  1e3 * outputs, 1e3 * (run - outputs - kernel), 1e3 * kernel);
    }
  }
  return 0;
}

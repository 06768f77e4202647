// Speed of the tolerance model against the oracle's, on the cases a campaign evaluates: the
// production shapes (H = 64 MODEL1, topk 128 over P = 256 and 512 over P = 64) and the first
// cases of a generated campaign (default or production profile).
//
// Usage: bench_bounds [--min-seconds S] [--seed N] [--cases N] [--profile default|production]
// Per shape or case set: the oracle alone (run_oracle_eigen), the oracle with the bounds' terms
// computed as it runs (BoundTermsBuilder: the difference is the terms'), and the bounds a
// cpu-mma + cpu-simt campaign derives from the terms (float64, bf16_mma and fp32_simt, each also
// over insert-invalid's and move-to-extra's longer lists: joint_bounds), in thread CPU ms per
// case (the fastest of the repeats: CPU time on a machine shared with other jobs only grows), the
// bounds' ratio to the oracle, the check_bounds calls of the campaign's bounded properties (on
// the oracle's output rounded to bf16) and their ratio to the oracle, and a hash of every
// bound's bits (two builds meant to give the same bounds give the same hash).
#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "harness/core/materialize.h"
#include "kernels/common/fp_formats.h"
#include "oracle/oracle.h"
#include "properties/evaluate.h"
#include "properties/tolerance.h"

namespace {

using mlafuzz::MaterializedCase;

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

MaterializedCase shape_case(int page_size, int topk, int num_pages, int batch) {
  mlafuzz::Case c;
  c.name = "bench";
  c.geom.layout = mla::Layout::kModel1;
  c.geom.page_size = page_size;
  c.geom.num_pages = num_pages;
  c.geom.page_stride = 0;  // the layout's minimum
  c.batch = batch;
  c.heads = 64;
  c.topk = topk;
  c.data_seed = 2026;
  return mlafuzz::materialize(c);
}

// FNV-1a over the bits of every bound.
void hash_into(uint64_t& h, const std::vector<double>& v) {
  for (const double x : v) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    for (int i = 0; i < 8; ++i) {
      h ^= (bits >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
}

struct Times {
  double oracle = 0, terms = 0, bounds = 0, checks = 0;
  uint64_t hash = 1469598103934665603ull;
};

// One evaluation of every case: the oracle alone, then the oracle with the terms, then the
// campaign's bounds from the terms.
Times run_once(const std::vector<MaterializedCase>& cases) {
  using mlafuzz::Precision;
  Times t;
  for (const MaterializedCase& m : cases) {
    double t0 = cpu_now();
    (void)mlafuzz::run_oracle_eigen(m, 1);
    t.oracle += cpu_now() - t0;
    mlafuzz::BoundTermsBuilder builder(m);
    t0 = cpu_now();
    const mlafuzz::OracleResult ref = mlafuzz::run_oracle_eigen(m, 1, &builder);
    t.terms += cpu_now() - t0;  // less the oracle's own time, below
    const mlafuzz::BoundTerms terms = builder.take();
    t0 = cpu_now();
    const int extra = m.has_extra ? m.extra_topk : 0;
    // As the campaign asks: the clean case's set, then move-to-extra's.
    const mlafuzz::Pipeline p64 = mlafuzz::pipeline_for(Precision::kFloat64);
    const mlafuzz::Pipeline mma = mlafuzz::pipeline_for(Precision::kMmaBf16);
    const mlafuzz::Pipeline simt = mlafuzz::pipeline_for(Precision::kSimtFp32);
    std::vector<mlafuzz::Bounds> set = mlafuzz::joint_bounds(terms, ref,
                                                             {{p64, m.topk, extra},
                                                              {mma, m.topk, extra},
                                                              {mma, m.topk + 2, extra},
                                                              {simt, m.topk, extra},
                                                              {simt, m.topk + 2, extra}},
                                                             nullptr);
    for (mlafuzz::Bounds& b : mlafuzz::joint_bounds(
             terms, ref, {{mma, m.topk - 1, extra + 1}, {simt, m.topk - 1, extra + 1}}, nullptr)) {
      set.push_back(std::move(b));
    }
    t.bounds += cpu_now() - t0;
    // The checks of a cpu-mma + cpu-simt case's bounded properties: per backend tolerance (a
    // bf16 run against the oracle), permute, insert-invalid and move-to-extra (two bf16 runs),
    // and mma-vs-simt once; the runs are the oracle's output rounded to bf16.
    std::vector<double> run(ref.out.size());
    for (size_t i = 0; i < run.size(); ++i) {
      run[i] = mla::bf16_to_float(mla::float_to_bf16(static_cast<float>(ref.out[i])));
    }
    const mlafuzz::Side bf{&run, &ref.lse, true}, exact{&ref.out, &ref.lse, false};
    const int32_t rows = m.query_rows(), H = m.heads, dv = m.d_v();
    t0 = cpu_now();
    for (int be = 0; be < 2; ++be) {
      const mlafuzz::Bounds& mine = set[1 + 2 * be];
      (void)mlafuzz::check_bounds(bf, exact, mine, &set[0], rows, H, dv);
      (void)mlafuzz::check_bounds(bf, bf, mine, &mine, rows, H, dv);
      (void)mlafuzz::check_bounds(bf, bf, mine, &set[2 + 2 * be], rows, H, dv);
      (void)mlafuzz::check_bounds(bf, bf, mine, &set[5 + be], rows, H, dv);
    }
    (void)mlafuzz::check_bounds(bf, bf, set[1], &set[3], rows, H, dv);
    t.checks += cpu_now() - t0;
    for (const mlafuzz::Bounds& b : set) {
      hash_into(t.hash, b.out);
      hash_into(t.hash, b.lse);
    }
  }
  return t;
}

void report(const char* what, const std::vector<MaterializedCase>& cases, double min_seconds) {
  std::vector<Times> runs;
  const double start = cpu_now();
  do {
    runs.push_back(run_once(cases));
  } while (cpu_now() - start < min_seconds && runs.size() < 200);
  const auto fastest = [&](double Times::*f) {
    std::vector<double> v;
    for (const Times& r : runs) v.push_back(r.*f);
    std::sort(v.begin(), v.end());
    return v.front();
  };
  const double n = static_cast<double>(cases.size());
  const double o = fastest(&Times::oracle), b = fastest(&Times::bounds);
  const double te = fastest(&Times::terms) - o, ch = fastest(&Times::checks);
  std::printf("| %s | %zu | %.3f | %.3f | %.3f | %.2f | %.3f | %.2f | %016llx |\n", what,
              cases.size(), 1e3 * o / n, 1e3 * te / n, 1e3 * b / n, o > 0 ? (te + b) / o : 0.0,
              1e3 * ch / n, o > 0 ? ch / o : 0.0, static_cast<unsigned long long>(runs[0].hash));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  double min_seconds = 1;
  uint64_t seed = 21;
  int cases = 0;
  std::string profile = "default";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min-seconds" && i + 1 < argc) {
      min_seconds = std::atof(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--cases" && i + 1 < argc) {
      cases = std::atoi(argv[++i]);
    } else if (a == "--profile" && i + 1 < argc) {
      profile = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: bench_bounds [--min-seconds S] [--seed N] [--cases N] "
                   "[--profile default|production]\n"
                   "the tolerance model's thread CPU time against the oracle's: production "
                   "shapes, or with --cases the first N generated cases of a campaign\n");
      return a == "--help" ? 0 : 2;
    }
  }
  // The steady state of a long campaign (bench_oracle.cc says why).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  std::printf(
      "| cases | n | oracle ms/case | terms ms/case | bounds ms/case | (terms + bounds) / oracle "
      "| checks ms/case | checks / oracle | bits hash |\n|---|---|---|---|---|---|---|---|---|\n");
  if (cases > 0) {
    mlafuzz::GenConfig cfg;
    if (profile != "default") cfg.families = {profile};
    std::vector<MaterializedCase> ms;
    for (int i = 0; i < cases; ++i) {
      ms.push_back(mlafuzz::materialize(
          mlafuzz::generate_case(seed, static_cast<uint64_t>(i), cfg, nullptr)));
    }
    const std::string what = "seed " + std::to_string(seed) + " " + profile;
    report(what.c_str(), ms, min_seconds);
    return 0;
  }
  for (const auto& [p, topk, pages] : {std::tuple{256, 128, 64}, std::tuple{64, 512, 256}}) {
    for (int batch : {1, 16, 64}) {
      const std::string what = "P=" + std::to_string(p) + " topk=" + std::to_string(topk) +
                               " B=" + std::to_string(batch);
      report(what.c_str(), {shape_case(p, topk, pages, batch)}, min_seconds);
    }
  }
  return 0;
}

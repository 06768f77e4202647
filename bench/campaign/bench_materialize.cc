// materialize() on its own, on a fixed set of cases: the first N generated cases of a seed
// (default profile, or production shapes only), as evaluate_case's first step materializes them.
//
// Usage: bench_materialize [--seed N] [--cases N] [--profile default|production] [--repeats R]
// Prints ms per case (thread CPU; per case the fastest of R repeats, so a loaded machine only
// adds to the figure) and a hash of every materialized case's content_hash (every input buffer's
// bytes, pads and guards included, and the scalar fields): two builds meant to materialize alike
// give the same hash.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench/common/case_set.h"
#include "core/materialize.h"
#include "properties/evaluate.h"

int main(int argc, char** argv) {
  mlafuzz::bench::CaseSetArgs args;
  CLI::App app{"materialize() on the first N generated cases"};
  mlafuzz::bench::add_case_set_options(app, args);
  if (const auto rc = mlafuzz::bench::parse_args(app, argc, argv)) return *rc;
  mlafuzz::bench::use_campaign_allocator();
  const std::vector<mlafuzz::Case> cs = mlafuzz::bench::generated_cases(args);
  std::vector<double> best(cs.size(), 1e300);
  uint64_t hash = 0;
  for (int r = 0; r < args.repeats; ++r) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < cs.size(); ++i) {
      const double t0 = mlafuzz::thread_cpu_seconds();
      const mlafuzz::MaterializedCase m = mlafuzz::materialize(cs[i]);
      best[i] = std::min(best[i], mlafuzz::thread_cpu_seconds() - t0);
      h = (h ^ mlafuzz::content_hash(m)) * 1099511628211ull;
    }
    if (r > 0 && h != hash) {
      std::fprintf(stderr, "bench_materialize: repeat %d materialized differently\n", r);
      return 1;
    }
    hash = h;
  }
  double ms = 0;
  for (const double s : best) ms += 1e3 * s / static_cast<double>(cs.size());
  std::printf(
      "seed %llu %s, %d cases, fastest of %d: materialize %.3f ms per case; content hash "
      "%016llx\n",
      static_cast<unsigned long long>(args.seed), args.profile.c_str(), args.cases, args.repeats,
      ms, static_cast<unsigned long long>(hash));
  return 0;
}

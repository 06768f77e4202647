// The tolerance model's speed against the oracle's on the cases a campaign evaluates: the first
// N generated cases of a seed (default profile, or production shapes only), bounded as a
// cpu-mma + cpu-simt campaign bounds them (compute_bounds_set: float64, bf16_mma and fp32_simt,
// and the two backends' pipelines again at insert-invalid's longer list).
//
// Usage: bench_bounds [--seed N] [--cases N] [--profile default|production] [--repeats R]
//                     [--merged] [--shared]
// --merged adds the two pipelines again as LSE-merged extra-cache pipelines (the production
// decode's SGLang path; they differ from the joint ones only in cases with an extra cache).
// --shared also times the oracle run with a BoundsSetVisitor (the bounds formed from the oracle's
// own rows while it runs): its time less the oracle's is the bounds' cost in that form, and its
// bounds' hash must equal compute_bounds_set's.
// Prints thread CPU ms per case (the fastest of R repeats: on a shared machine CPU time only
// grows), the bounds' ratio to the oracle, and a hash of every bound's bits (two builds meant
// to give the same bounds give the same hash).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench/common/case_set.h"
#include "core/materialize.h"
#include "oracle/oracle.h"
#include "properties/tolerance.h"

namespace {

using mlafuzz::MaterializedCase;

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
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

}  // namespace

int main(int argc, char** argv) {
  mlafuzz::bench::CaseSetArgs args;
  args.cases = 100;
  CLI::App app{"the tolerance model's thread CPU against the oracle's"};
  mlafuzz::bench::add_case_set_options(app, args);
  bool merged = false;
  app.add_flag("--merged", merged, "also the two pipelines as LSE-merged ones");
  bool shared = false;
  app.add_flag("--shared", shared, "also time the oracle with the bounds as its row visitor");
  if (const auto rc = mlafuzz::bench::parse_args(app, argc, argv)) return *rc;
  mlafuzz::bench::use_campaign_allocator();
  std::vector<MaterializedCase> ms;
  for (const mlafuzz::Case& c : mlafuzz::bench::generated_cases(args)) {
    ms.push_back(mlafuzz::materialize(c));
  }
  const int repeats = args.repeats;
  using mlafuzz::Precision;
  double best_oracle = 1e300, best_bounds = 1e300, best_joint = 1e300;
  uint64_t hash = 1469598103934665603ull, shared_hash = hash;
  for (int r = 0; r < repeats; ++r) {
    double oracle = 0, bounds = 0, joint = 0;
    hash = shared_hash = 1469598103934665603ull;
    for (const MaterializedCase& m : ms) {
      double t0 = cpu_now();
      const mlafuzz::OracleResult ref = mlafuzz::run_oracle_eigen(m, 1);
      oracle += cpu_now() - t0;
      const int insert = m.topk + 2;
      const mlafuzz::Pipeline mma = mlafuzz::pipeline_for(Precision::kMmaBf16);
      const mlafuzz::Pipeline simt = mlafuzz::pipeline_for(Precision::kSimtFp32);
      std::vector<mlafuzz::BoundsRequest> requests = {
          {mlafuzz::pipeline_for(Precision::kFloat64), 0},
          {mma, 0},
          {simt, 0},
          {mma, insert},
          {simt, insert}};
      if (merged) {
        mlafuzz::Pipeline mma_merged = mma, simt_merged = simt;
        mma_merged.lse_merged = simt_merged.lse_merged = true;
        requests.push_back({mma_merged, 0});
        requests.push_back({simt_merged, 0});
      }
      t0 = cpu_now();
      const std::vector<mlafuzz::Bounds> set = mlafuzz::compute_bounds_set(m, ref, requests);
      bounds += cpu_now() - t0;
      for (const mlafuzz::Bounds& b : set) {
        hash_into(hash, b.out);
        hash_into(hash, b.lse);
      }
      if (shared) {
        t0 = cpu_now();
        mlafuzz::BoundsSetVisitor visitor(m, requests);
        const mlafuzz::OracleResult ref2 = mlafuzz::run_oracle_eigen(m, 1, &visitor);
        const std::vector<mlafuzz::Bounds> set2 = visitor.take();
        joint += cpu_now() - t0;
        for (const mlafuzz::Bounds& b : set2) {
          hash_into(shared_hash, b.out);
          hash_into(shared_hash, b.lse);
        }
      }
    }
    best_oracle = std::min(best_oracle, oracle);
    best_bounds = std::min(best_bounds, bounds);
    best_joint = std::min(best_joint, joint);
  }
  const double n = static_cast<double>(ms.size());
  std::printf(
      "seed %llu %s, %d cases: oracle %.3f ms/case, bounds %.3f ms/case (%.2fx the oracle), "
      "bits hash %016llx\n",
      static_cast<unsigned long long>(args.seed), args.profile.c_str(), args.cases,
      1e3 * best_oracle / n, 1e3 * best_bounds / n, best_bounds / best_oracle,
      static_cast<unsigned long long>(hash));
  if (shared) {
    std::printf(
        "shared with the oracle: oracle + bounds %.3f ms/case, bounds %.3f ms/case (%.2fx the "
        "oracle), bits hash %016llx\n",
        1e3 * best_joint / n, 1e3 * (best_joint - best_oracle) / n,
        (best_joint - best_oracle) / best_oracle, static_cast<unsigned long long>(shared_hash));
  }
  return 0;
}

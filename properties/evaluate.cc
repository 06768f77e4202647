// evaluate_case: every selected property on every backend, the oracle run once per case.
#include "properties/evaluate.h"

#include <time.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "core/compare.h"
#include "core/rng.h"
#include "oracle/oracle.h"
#include "properties/properties.h"
#include "properties/property_table.h"
#include "properties/tolerance.h"

namespace mlafuzz {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool selected(const std::vector<std::string>& props, const std::string& p) {
  return props.empty() || std::find(props.begin(), props.end(), p) != props.end();
}

// Where the outcome's figures come from, for tolerance-style checks.
void fill_from_check(PropertyOutcome& o, const BoundCheck& bc) {
  o.passed = bc.passed;
  o.detail = bc.describe();
  o.worst_b = bc.b;
  o.worst_h = bc.h;
  o.worst_d = bc.d;
  o.error = bc.error;
  o.bound = bc.bound;
  o.max_abs = bc.max_abs;
  o.mean_abs = bc.mean_abs;
  o.max_rel = bc.max_rel;
  o.lse_max_abs = bc.lse_max_abs;
  o.tightness = bc.tightness;
  o.nonfinite_mismatch = !bc.nonfinite_match;
  o.out_max_ref = bc.out_max_ref;
}

// Element count above which a failed comparison is not located element by element (a finding's
// locus is taken on its minimal case; a production-size case would cost seconds).
constexpr size_t kMaxLocatedElements = size_t{1} << 18;

bool same_value(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

// Whether the pair (a, b) is within `bound` under check_bounds' rule for one element (an out
// element when `out`, else an lse element).
bool within_one(double a, double b, double bound, bool out, bool a_bf16, bool b_bf16) {
  const std::vector<double> av{a}, bv{b}, zero{0.0};
  const Side sa{out ? &av : &zero, out ? &zero : &av, a_bf16};
  const Side sb{out ? &bv : &zero, out ? &zero : &bv, b_bf16};
  const Bounds one{out ? std::vector<double>{bound} : zero,
                   out ? zero : std::vector<double>{bound}};
  return check_bounds(sa, sb, one, 1, 1, 1).passed;
}

// Fills o.wrong from a failed comparison: `got` holds rows.size() x heads.size() rows of d_v
// (and lse) values, `want` (and `bound`, when the comparison is bounded) the full
// [query rows, H] arrays the check picked `rows` and `heads` of. Without a bound, elements
// whose bits differ are wrong (NaNs of any sign or payload equal).
void note_wrong(PropertyOutcome& o, const RunResult& got, bool got_bf16,
                const std::vector<double>& want_out, const std::vector<double>& want_lse,
                bool want_bf16, const Bounds* bound, int heads, int dv,
                const std::vector<int>& rows, const std::vector<int>& head_ids) {
  const size_t nh = head_ids.size();
  if (rows.size() * nh * static_cast<size_t>(dv) > kMaxLocatedElements) return;
  if (got.out.size() < rows.size() * nh * static_cast<size_t>(dv) ||
      got.lse.size() < rows.size() * nh) {
    return;
  }
  std::set<int32_t> columns;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < nh; ++j) {
      const size_t full = static_cast<size_t>(rows[i]) * static_cast<size_t>(heads) +
                          static_cast<size_t>(head_ids[j]);
      const size_t part = i * nh + j;
      bool row_wrong = false;
      for (int d = 0; d < dv; ++d) {
        const double a = got.out[part * static_cast<size_t>(dv) + static_cast<size_t>(d)];
        const size_t at = full * static_cast<size_t>(dv) + static_cast<size_t>(d);
        const double b = want_out[at];
        const bool ok = bound != nullptr
                            ? within_one(a, b, bound->out[at], true, got_bf16, want_bf16)
                            : same_value(a, b);
        if (!ok) {
          row_wrong = true;
          columns.insert(d);
        }
      }
      if (row_wrong) o.wrong.out_rows.emplace_back(rows[i], head_ids[j]);
      const double a = got.lse[part], b = want_lse[full];
      const bool ok = bound != nullptr
                          ? within_one(a, b, bound->lse[full], false, got_bf16, want_bf16)
                          : same_value(a, b);
      if (!ok) o.wrong.lse_rows.emplace_back(rows[i], head_ids[j]);
    }
  }
  o.wrong.out_columns.assign(columns.begin(), columns.end());
}

// An oracle row visitor that forwards each row to another and adds up the time the rows take
// there (one oracle thread: no two visits at once), so that a case's breakdown keeps the oracle's
// time and the bounds' apart.
class TimedRows final : public OracleRowVisitor {
 public:
  explicit TimedRows(OracleRowVisitor& inner) : inner_(inner) {}
  void visit(const OracleRowView& row) override {
    const auto t = Clock::now();
    inner_.visit(row);
    seconds += since(t);
  }
  double seconds = 0;

 private:
  OracleRowVisitor& inner_;
};

// Per-case state shared by all backends: the case, the oracle, the bounds per pipeline.
struct CaseContext {
  CaseContext() = default;
  CaseContext(const CaseContext&) = delete;  // variants and bounds are found by address
  CaseContext& operator=(const CaseContext&) = delete;
  // The bounds' megabytes go back for the next case's (recycle_bounds).
  ~CaseContext() {
    recycle_bounds(std::move(b64));
    for (auto& kv : bounds) recycle_bounds(std::move(kv.second));
    for (auto& kv : variant_bounds_) recycle_bounds(std::move(kv.second));
  }
  MaterializedCase m;
  OracleResult ref;
  Bounds b64;  // the oracle's own error
  // What a backend's bound depends on besides the case: its pipeline (pipeline_of: precision,
  // the extra cache's pipeline, the token tile) and the list lengths the bound's rounding terms
  // count (the case's own lists, or a transformed case's: tile_topk and extra_topk of
  // compute_bounds, 0 and -1 standing for the case's own). Two backends share a bound exactly
  // when their keys are equal (cuda-mma and cuda-mma-small do not: 64- and 32-token tiles).
  using BoundsKey = std::tuple<Precision, bool, int, int, int>;
  static BoundsKey bounds_key(const Backend& be, int tile_topk, int extra_topk = -1) {
    const Pipeline pl = pipeline_of(be);
    return {pl.precision, pl.lse_merged, pl.token_tile, tile_topk, extra_topk};
  }
  BoundsKey own_key(const Backend& be, int tile_topk, int extra_topk) const {
    const int own_extra = m.has_extra ? m.extra_topk : 0;
    return bounds_key(be, tile_topk == m.topk ? 0 : tile_topk,
                      extra_topk == own_extra ? -1 : extra_topk);
  }
  std::map<BoundsKey, Bounds> bounds;
  const Bounds& pipeline_bounds(const Backend& be, int tile_topk = 0, int extra_topk = -1) {
    const BoundsKey key = own_key(be, tile_topk, extra_topk);
    auto it = bounds.find(key);
    if (it == bounds.end()) {
      const auto t0 = Clock::now();
      it = bounds
               .emplace(key,
                        compute_bounds(m, ref, pipeline_of(be), std::get<3>(key), std::get<4>(key)))
               .first;
      bounds_seconds += since(t0);
    }
    return it->second;
  }
  // The oracle's own bound and every pipeline bound the properties will ask for (each backend's
  // pipeline; with `insert_topk`, also at insert-invalid's longer list; with `moved_extra` >= 0,
  // each joint pipeline's also at move-to-extra's longer extra list, moved_bounds), as the
  // requests of one bounds pass over the case, each pipeline bound's with its key
  // (store_prefetched takes the pass's result): the same values as computing each when first
  // asked.
  struct BoundsPrefetch {
    std::vector<BoundsRequest> requests;  // the oracle's own bound first
    std::vector<BoundsKey> keys;          // keys[i] is the key of requests[i + 1]
  };
  BoundsPrefetch prefetch_requests(const std::vector<const Backend*>& bes, int insert_topk,
                                   int moved_extra) {
    ran_backends = bes;
    BoundsPrefetch p;
    p.requests.push_back({pipeline_for(Precision::kFloat64), 0});
    const auto add = [&](const Backend& be, int tile_topk, int extra_topk) {
      const BoundsKey key = own_key(be, tile_topk, extra_topk);
      if (std::find(p.keys.begin(), p.keys.end(), key) != p.keys.end()) return;
      p.keys.push_back(key);
      p.requests.push_back({pipeline_of(be), std::get<3>(key), std::get<4>(key)});
    };
    for (const Backend* be : bes) {
      if (be->traits().precision == Precision::kCustom) continue;
      add(*be, 0, -1);
      if (insert_topk >= 0) add(*be, insert_topk, -1);
      if (moved_extra >= 0 && !pipeline_of(*be).lse_merged) add(*be, 0, moved_extra);
    }
    return p;
  }
  void store_prefetched(const std::vector<BoundsKey>& keys, std::vector<Bounds> got) {
    b64 = std::move(got[0]);
    for (size_t i = 0; i < keys.size(); ++i) bounds.emplace(keys[i], std::move(got[i + 1]));
  }
  // The extra list's length of move-to-extra's variant when it moves entries (not a swap).
  int moved_extra_topk() const { return move_to_extra_topk(m, move_count()); }
  // The bound of move-to-extra's variant for backend be's pipeline. The variant has the case's
  // valid tokens and exact result in other lists; a joint pipeline's bound reads the lists only
  // through their lengths (the list length T and tile count nt of its rounding terms), so it is
  // the case's bound at the variant's lengths, formed from the case's rows (prefetch_requests)
  // with its sums over V derived from the case's own; a swap of the caches has the same T and nt:
  // the case's bound itself. These equal the bound computed on the variant up to the order of
  // its sums (Tolerance.MovedToExtraBoundIsTheCaseBoundAtTheVariantLengths). An LSE-merged
  // pipeline bounds each list alone: its bound is computed on the variant (variant_bounds).
  const Bounds& moved_bounds(const Backend& be) {
    if (pipeline_of(be).lse_merged) return variant_bounds(moved_to_extra(), be);
    return move_swaps() ? pipeline_bounds(be) : pipeline_bounds(be, 0, moved_extra_topk());
  }
  // The bound of a transformed case v for backend be's LSE-merged pipeline (v's own lists and
  // tiles, the same exact result): computed at the first request for every LSE-merged pipeline
  // of the backends prefetch_requests saw, in one compute_bounds_set pass over v.
  std::map<std::pair<const MaterializedCase*, BoundsKey>, Bounds> variant_bounds_;
  const Bounds& variant_bounds(const MaterializedCase& v, const Backend& be) {
    const auto key_of = [](const Backend& b) { return bounds_key(b, 0); };
    if (auto it = variant_bounds_.find({&v, key_of(be)}); it != variant_bounds_.end()) {
      return it->second;
    }
    std::vector<const Backend*> want{&be};
    for (const Backend* b : ran_backends) {
      if (b->traits().precision != Precision::kCustom && pipeline_of(*b).lse_merged &&
          key_of(*b) != key_of(be))
        want.push_back(b);
    }
    std::vector<BoundsRequest> req;
    std::vector<BoundsKey> keys;
    for (const Backend* b : want) {
      if (variant_bounds_.count({&v, key_of(*b)}) != 0 ||
          std::find(keys.begin(), keys.end(), key_of(*b)) != keys.end()) {
        continue;
      }
      keys.push_back(key_of(*b));
      req.push_back({pipeline_of(*b), 0});
    }
    const auto t0 = Clock::now();
    std::vector<Bounds> got = compute_bounds_set(v, ref, req);
    bounds_seconds += since(t0);
    for (size_t i = 0; i < keys.size(); ++i) {
      variant_bounds_.emplace(std::make_pair(&v, keys[i]), std::move(got[i]));
    }
    return variant_bounds_.at({&v, key_of(be)});
  }
  // The backends whose clean run succeeded (set by prefetch_requests).
  std::vector<const Backend*> ran_backends;
  // Seconds spent computing bounds on demand (pipeline_bounds, variant_bounds), for the
  // evaluation's steps: the checks' time less this is the checks' own.
  double bounds_seconds = 0;

  // The bound of a backend against the exact result (custom: its declared tolerances), computed
  // at the first request.
  std::map<const Backend*, Bounds> custom_bounds_;
  const Bounds& backend_bounds(const Backend& be) {
    if (be.traits().precision != Precision::kCustom) return pipeline_bounds(be);
    auto it = custom_bounds_.find(&be);
    if (it == custom_bounds_.end()) {
      it = custom_bounds_.emplace(&be, custom_bounds(ref, be.traits().abs_tol, be.traits().rel_tol))
               .first;
    }
    return it->second;
  }
  // The tolerance property's bound: the backend's own plus the oracle's.
  Bounds tolerance_bound(const Backend& be) { return add_bounds(backend_bounds(be), b64); }

  // What every backend of the evaluation accepts (the intersection of their envelopes): the
  // shared variants stay inside it (relocation's new stride, insert-invalid's longer lists).
  Envelope env;

  // The transformed cases of the properties, built once per case and shared by every backend
  // (node-based maps: a variant's address identifies it while the case is evaluated).
  std::map<int, MaterializedCase> poisoned, batches_alone, heads_alone, queries_alone;
  std::optional<MaterializedCase> relocated, permuted, inserted, moved;
  int inserted_count = 0;
  template <typename Build>
  static const MaterializedCase& memo(std::map<int, MaterializedCase>& in, int key, Build build) {
    auto it = in.find(key);
    if (it == in.end()) it = in.emplace(key, build()).first;
    return it->second;
  }
  template <typename Build>
  static const MaterializedCase& memo(std::optional<MaterializedCase>& in, Build build) {
    if (!in) in.emplace(build());
    return *in;
  }
  const MaterializedCase& poison_variant(int v) {
    return memo(poisoned, v, [&] { return poison_case(m, v); });
  }
  const MaterializedCase& relocation() {
    return memo(relocated, [&] {
      return relocate_pages(m, m.recipe.data_seed + 17, env.page_stride_multiple);
    });
  }
  const MaterializedCase& batch_alone_case(int b) {
    return memo(batches_alone, b, [&] { return batch_alone(m, b); });
  }
  const MaterializedCase& head_alone_case(int h) {
    return memo(heads_alone, h, [&] { return head_alone(m, h); });
  }
  // Query row r = b * s_q + s alone (s_q > 1).
  const MaterializedCase& query_alone_case(int r) {
    return memo(queries_alone, r, [&] { return query_alone(m, r / m.s_q, r % m.s_q); });
  }
  // move-to-extra: with an extra cache, half the cases swap the two caches; otherwise up to 4
  // valid entries per query token move into the extra list.
  bool move_swaps() const {
    return m.has_extra && CounterRng(m.recipe.data_seed, Stream::kPoison, 12).bernoulli(0.5);
  }
  int move_count() const {
    return 1 +
           static_cast<int>(CounterRng(m.recipe.data_seed, Stream::kPoison, 13).uniform_int(0, 3));
  }
  const MaterializedCase& moved_to_extra() {
    return memo(moved, [&] {
      return move_swaps() ? swap_caches(m)
                          : move_to_extra(m, m.recipe.data_seed + 37, move_count());
    });
  }
  std::string move_to_extra_what() const {
    if (move_swaps()) return "swapping the main and extra caches";
    return "moving up to " + std::to_string(move_count()) +
           " valid entries per query token into the extra list";
  }
  // split-agree: the case with a forced split count (launch parameter; the inputs are the same).
  std::map<int, MaterializedCase> split_forced;
  const MaterializedCase& split_variant(int splits) {
    return memo(split_forced, splits, [&] {
      MaterializedCase v = m;
      v.split_override = splits;
      return v;
    });
  }
  const MaterializedCase& permutation() {
    return memo(permuted, [&] { return permute_indices(m, m.recipe.data_seed + 29); });
  }
  int insert_count() const {
    const int count =
        1 + static_cast<int>(CounterRng(m.recipe.data_seed, Stream::kPoison, 10).uniform_int(0, 2));
    // A longer list the backends accept (topk a multiple of 64: 64 more entries).
    if (!env.topk.contains(m.topk + count)) {
      if (const auto t = env.topk.nearest(m.topk + count, m.topk + 1, m.topk + 4096)) {
        return *t - m.topk;
      }
    }
    return count;
  }
  const MaterializedCase& insertion() {
    return memo(inserted,
                [&] { return insert_invalid(m, m.recipe.data_seed + 31, insert_count()); });
  }
};

Side side_of(const RunResult& r, bool bf16) { return Side{&r.out, &r.lse, bf16}; }

// Whether run r's raw buffers have the sizes of case m's (a bf16 backend's run).
bool raw_fits(const RunResult& r, const MaterializedCase& m) {
  return !r.out_raw.empty() && r.out_raw.size() == OutputBuffers::out_elements(m) &&
         r.lse_raw.size() == OutputBuffers::lse_elements(m);
}

// Run r of case m as a bound check reads it: a bf16 backend's raw buffers in place (a quarter of
// the widened values' bytes), else the widened values.
Side check_side(const RunResult& r, const MaterializedCase& m, bool bf16) {
  return bf16 && raw_fits(r, m) ? raw_side(r, m) : side_of(r, bf16);
}

bool is_bf16(const Backend& be) {
  return be.traits().precision == Precision::kSimtFp32 ||
         be.traits().precision == Precision::kMmaBf16;
}

struct BackendState {
  Backend* be = nullptr;
  bool ran = false;  // clean run ok
  RunResult clean;
};

class Evaluator {
 public:
  Evaluator(CaseContext& ctx, const std::vector<std::string>& props, const EvalOptions& opt,
            CaseEvaluation& ev)
      : ctx_(ctx), props_(props), opt_(opt), ev_(ev) {}

  // Phase 1: the clean run (before the oracle allocates anything).
  void start(BackendState& st) {
    Backend& be = *st.be;
    const std::string name = be.traits().name;
    const Availability av = be.traits().availability;
    PropertyOutcome run = make(PropertyId::kRun, name);
    if (!av.available) {
      not_applicable_all(name, "backend not available: " + av.reason);
      return;
    }
    // unsupported() and the run in one call (one request for a worker proxy).
    std::vector<CheckedRun> clean = be.run_batch({&ctx_.m});
    if (clean.size() != 1) throw std::logic_error(name + ": run_batch lost the clean run");
    if (clean[0].unsupported) {
      not_applicable_all(name, "case outside the backend's envelope: " + *clean[0].unsupported);
      return;
    }
    st.clean = std::move(clean[0].result);
    run.seconds = clean[0].seconds;
    record_clean(st, run);
  }

  // The "run" outcome of a clean run made (st.clean): ok, unsupported or failed.
  void record_clean(BackendState& st, PropertyOutcome run) {
    const std::string name = st.be->traits().name;
    if (st.clean.status == RunStatus::kUnsupported) {
      not_applicable_all(name, "backend reported unsupported: " + st.clean.message);
      return;
    }
    if (!st.clean.ok()) {
      run.passed = false;
      run.run_failed = true;
      run.detail = std::string(st.clean.status == RunStatus::kFault ? "fault: " : "error: ") +
                   st.clean.message;
      ev_.outcomes.push_back(run);
      return;
    }
    st.ran = true;
    ev_.outcomes.push_back(run);
  }

  // Phase 2: every property of a backend whose clean run succeeded. Which properties run is
  // decided first, then every transformed case they need is run in one run_batch (one
  // request for a worker proxy), then the checks consume the results in the table's order.
  void properties(BackendState& st) {
    if (!st.ran) return;
    const std::string name = st.be->traits().name;
    std::vector<std::pair<const PerBackend*, std::optional<std::string>>> wanted;
    for (const PerBackend& p : per_backend()) {
      const PropertyInfo& prop = property_info(p.id);
      if (selected(props_, prop.name)) wanted.emplace_back(&p, off_by_design(prop, *st.be));
    }
    std::vector<const MaterializedCase*> plan;
    const auto t_plan = Clock::now();
    for (const auto& [p, off] : wanted) {
      if (!off && p->plan) (this->*p->plan)(st, plan);
    }
    ev_.steps[CaseStep::kVariants] += since(t_plan);
    batch_.clear();
    if (!plan.empty()) {
      // Raw results: the bitwise properties compare the raw buffers, run_variant widens the
      // ones a property reads values from (a production case's output is 2^25 elements).
      const auto t_runs = Clock::now();
      RunOptions raw;
      raw.raw_outputs = true;
      std::vector<CheckedRun> runs = st.be->run_batch(plan, raw);
      ev_.steps[CaseStep::kVariantRuns] += since(t_runs);
      for (size_t i = 0; i < plan.size() && i < runs.size(); ++i) {
        batch_.emplace(plan[i], std::move(runs[i]));
      }
    }
    const auto t_checks = Clock::now();
    const double bounds_before = ctx_.bounds_seconds;
    for (const auto& [p, off] : wanted) {
      if (off) {
        PropertyOutcome o = make(p->id, name);
        o.applicable = false;
        o.detail = *off;
        ev_.outcomes.push_back(o);
        continue;
      }
      (this->*p->check)(st);
    }
    batch_.clear();
    const double bounds_s = ctx_.bounds_seconds - bounds_before;
    ev_.steps[CaseStep::kBounds] += bounds_s;
    ev_.steps[CaseStep::kChecks] += since(t_checks) - bounds_s;
  }

  void mma_vs_simt(std::vector<BackendState>& states) {
    const PropertyInfo& prop = property_info(PropertyId::kMmaVsSimt);
    if (!selected(props_, prop.name)) return;
    const auto t0 = Clock::now();
    const double bounds_before = ctx_.bounds_seconds;
    mma_vs_simt_pairs(states, prop);
    const double bounds_s = ctx_.bounds_seconds - bounds_before;
    ev_.steps[CaseStep::kBounds] += bounds_s;
    ev_.steps[CaseStep::kChecks] += since(t0) - bounds_s;
  }

 private:
  void mma_vs_simt_pairs(std::vector<BackendState>& states, const PropertyInfo& prop) {
    for (auto& a : states) {
      if (!a.ran || a.be->traits().precision != Precision::kMmaBf16) continue;
      const std::string partner = a.be->traits().simt_partner;
      if (partner.empty()) continue;
      for (auto& b : states) {
        if (!b.ran || b.be->traits().name != partner ||
            b.be->traits().precision != Precision::kSimtFp32) {
          continue;
        }
        PropertyOutcome o = make(prop.name, a.be->traits().name + "|" + b.be->traits().name);
        const BoundCheck bc =
            check_bounds(check_side(a.clean, ctx_.m, true), check_side(b.clean, ctx_.m, true),
                         ctx_.backend_bounds(*a.be), &ctx_.backend_bounds(*b.be),
                         ctx_.m.query_rows(), ctx_.m.heads, ctx_.m.d_v());
        fill_from_check(o, bc);
        locate(o, a.clean, true, b.clean.out, b.clean.lse, true, &ctx_.backend_bounds(*a.be),
               &ctx_.backend_bounds(*b.be));
        ev_.outcomes.push_back(o);
      }
    }
  }

  bool locating(const PropertyOutcome& o) const {
    return opt_.locus && o.applicable && !o.passed && !o.run_failed;
  }

  // o.wrong of a failed comparison of `got` with `want` over the whole case.
  void locate(PropertyOutcome& o, const RunResult& got, bool got_bf16,
              const std::vector<double>& want_out, const std::vector<double>& want_lse,
              bool want_bf16, const Bounds* bound, const Bounds* plus = nullptr) {
    if (!locating(o)) return;
    // The bound the check applied: bound + *plus, summed here only when a failure is located.
    Bounds sum;
    if (bound && plus) sum = add_bounds(*bound, *plus);
    note_wrong(o, got, got_bf16, want_out, want_lse, want_bf16, bound && plus ? &sum : bound,
               ctx_.m.heads, ctx_.m.d_v(), all(ctx_.m.query_rows()), all(ctx_.m.heads));
  }

  // o.wrong of a bitwise comparison of the raw-only run `r` of variant v with the clean run.
  void locate_raw(PropertyOutcome& o, const MaterializedCase& v, const RunResult& r,
                  const RunResult& clean) {
    if (!locating(o)) return;
    RunResult w = r;
    widen_raw_outputs(v, w);
    locate(o, w, false, clean.out, clean.lse, false, nullptr);
  }

  // o.wrong of a bitwise comparison of a part run (rows x heads of the case) with the clean run.
  void locate_part(PropertyOutcome& o, const RunResult& part, const RunResult& clean,
                   const std::vector<int>& rows, const std::vector<int>& heads) {
    if (!locating(o)) return;
    note_wrong(o, part, false, clean.out, clean.lse, false, nullptr, ctx_.m.heads, ctx_.m.d_v(),
               rows, heads);
  }

  PropertyOutcome make(const std::string& prop, const std::string& backend) {
    PropertyOutcome o;
    o.property = prop;
    o.backend = backend;
    return o;
  }
  PropertyOutcome make(PropertyId id, const std::string& backend) {
    return make(property_info(id).name, backend);
  }

  void not_applicable_all(const std::string& name, const std::string& why) {
    for (const PropertyInfo& p : property_table()) {
      if (p.needs_simt_partner || (p.id != PropertyId::kRun && !selected(props_, p.name))) {
        continue;
      }
      PropertyOutcome o = make(p.name, name);
      o.applicable = false;
      o.detail = why;
      ev_.outcomes.push_back(o);
    }
  }

  int poison_count() const { return std::clamp(opt_.poison_variants, 1, kPoisonVariants); }
  // Rotate the variants with the case so that every fill gets its turn across a campaign.
  int poison_fill(int i) const {
    return (static_cast<int>(ctx_.m.recipe.data_seed % kPoisonVariants) + i) % kPoisonVariants;
  }

  // The transformed cases property `id` runs when every check passes (the checks stop at the
  // first failure; the extra runs are then unused), in the order the check asks for them.
  // The transformed cases of each property that needs some (planned into the backend's batch).
  using Plan = std::vector<const MaterializedCase*>;
  void plan_determinism(const BackendState&, Plan& plan) { plan.push_back(&ctx_.m); }
  void plan_poison(const BackendState& st, Plan& plan) {
    if (st.clean.guard_violations != 0) return;
    for (int i = 0; i < poison_count(); ++i) plan.push_back(&ctx_.poison_variant(poison_fill(i)));
  }
  void plan_relocate(const BackendState&, Plan& plan) { plan.push_back(&ctx_.relocation()); }
  void plan_batch_alone(const BackendState&, Plan& plan) {
    if (ctx_.m.batch == 1) return;
    for (int b : probes(ctx_.m.batch, ctx_.m.recipe.data_seed)) {
      plan.push_back(&ctx_.batch_alone_case(b));
    }
  }
  void plan_head_alone(const BackendState&, Plan& plan) {
    if (ctx_.m.heads == 1) return;
    for (int h : probes(ctx_.m.heads, ctx_.m.recipe.data_seed + 1)) {
      plan.push_back(&ctx_.head_alone_case(h));
    }
  }
  void plan_permute(const BackendState&, Plan& plan) { plan.push_back(&ctx_.permutation()); }
  void plan_insert(const BackendState&, Plan& plan) { plan.push_back(&ctx_.insertion()); }
  void plan_query_alone(const BackendState&, Plan& plan) {
    if (ctx_.m.s_q == 1) return;
    for (int r : probes(ctx_.m.query_rows(), ctx_.m.recipe.data_seed + 2)) {
      plan.push_back(&ctx_.query_alone_case(r));
    }
  }
  void plan_move_to_extra(const BackendState&, Plan& plan) {
    if (ctx_.env.refuses_feature(kFeatureExtraCache)) return;
    plan.push_back(&ctx_.moved_to_extra());
  }
  void plan_split_agree(const BackendState&, Plan& plan) {
    for (int splits : kSplitAgreeCounts) plan.push_back(&ctx_.split_variant(splits));
  }

  // The properties of one backend in the order they are reported: each row plans its
  // transformed cases (null: it needs none) and checks them. Names, kinds and descriptions are
  // the property table's (property_table.cc); mma-vs-simt compares two backends and runs after.
  struct PerBackend {
    PropertyId id;
    void (Evaluator::*plan)(const BackendState&, Plan&);
    void (Evaluator::*check)(BackendState&);
  };
  static std::span<const PerBackend> per_backend() {
    static constexpr PerBackend kTable[] = {
        {PropertyId::kTolerance, nullptr, &Evaluator::tolerance},
        {PropertyId::kDeterminism, &Evaluator::plan_determinism, &Evaluator::determinism},
        {PropertyId::kPoison, &Evaluator::plan_poison, &Evaluator::poison},
        {PropertyId::kRelocate, &Evaluator::plan_relocate, &Evaluator::relocate},
        {PropertyId::kBatchAlone, &Evaluator::plan_batch_alone, &Evaluator::batch_alone_prop},
        {PropertyId::kHeadAlone, &Evaluator::plan_head_alone, &Evaluator::head_alone_prop},
        {PropertyId::kPermute, &Evaluator::plan_permute, &Evaluator::permute},
        {PropertyId::kInsertInvalid, &Evaluator::plan_insert, &Evaluator::insert},
        {PropertyId::kQueryAlone, &Evaluator::plan_query_alone, &Evaluator::query_alone_prop},
        {PropertyId::kMoveToExtra, &Evaluator::plan_move_to_extra, &Evaluator::move_to_extra_prop},
        {PropertyId::kSplitAgree, &Evaluator::plan_split_agree, &Evaluator::split_agree}};
    return kTable;
  }

  // Runs a transformed case (its result from the backend's batch when planned, else a call now);
  // a failed run becomes a failed outcome of the property. With `values` false the result may
  // keep only its raw outputs (outputs_pending; its sizes checked): for bitwise_equal,
  // which compares those; otherwise it is widened here.
  bool run_variant(Backend& be, const MaterializedCase& v, RunResult& r, PropertyOutcome& o,
                   bool values = true) {
    CheckedRun c;
    if (auto it = batch_.find(&v); it != batch_.end()) {
      c = std::move(it->second);
      batch_.erase(it);
    } else {
      std::vector<CheckedRun> one = be.run_batch({&v});
      if (one.size() == 1) c = std::move(one[0]);
    }
    if (c.unsupported) {
      o.applicable = false;
      o.detail = "transformed case outside the backend's envelope: " + *c.unsupported;
      return false;
    }
    r = std::move(c.result);
    if (values) widen_raw_outputs(v, r);
    o.seconds += c.seconds;
    if (r.status == RunStatus::kUnsupported) {
      o.applicable = false;
      o.detail = "backend reported the transformed case unsupported: " + r.message;
      return false;
    }
    if (!r.ok()) {
      o.passed = false;
      o.run_failed = true;
      o.detail = "run of the transformed case failed: " + r.message;
      return false;
    }
    return true;
  }

  void tolerance(BackendState& st) {
    Backend& be = *st.be;
    PropertyOutcome o = make(PropertyId::kTolerance, be.traits().name);
    const Side ref{&ctx_.ref.out, &ctx_.ref.lse, false};
    // The tolerance bound (tolerance_bound: the backend's own plus the oracle's), summed in the
    // check.
    const BoundCheck bc =
        check_bounds(check_side(st.clean, ctx_.m, is_bf16(be)), ref, ctx_.backend_bounds(be),
                     &ctx_.b64, ctx_.m.query_rows(), ctx_.m.heads, ctx_.m.d_v());
    fill_from_check(o, bc);
    locate(o, st.clean, is_bf16(be), ctx_.ref.out, ctx_.ref.lse, false, &ctx_.backend_bounds(be),
           &ctx_.b64);
    if (opt_.reference_metrics) {
      const AllcloseResult oc = check_allclose(st.clean.out, ctx_.ref.out, kFlashMlaOutTol);
      const AllcloseResult lc = check_allclose(st.clean.lse, ctx_.ref.lse, kFlashMlaLseTol);
      o.flashmla_pass = oc.passed && lc.passed;
      o.cos_diff = oc.cos_diff;
    }
    ev_.outcomes.push_back(o);
  }

  void determinism(BackendState& st) {
    PropertyOutcome o = make(PropertyId::kDeterminism, st.be->traits().name);
    RunResult again;
    if (!exact(st, kInvariantDeterministic)) {
      if (run_variant(*st.be, ctx_.m, again, o)) {
        bounded(st, o, again, st.clean, all(ctx_.m.batch), all(ctx_.m.heads), "a second run");
      }
      ev_.outcomes.push_back(o);
      return;
    }
    if (run_variant(*st.be, ctx_.m, again, o, /*values=*/false)) {
      std::string where;
      if (!bitwise_equal(ctx_.m, st.clean, again, &where, &o.worst_b, &o.worst_h, &o.worst_d)) {
        o.passed = false;
        o.detail = "two runs of the same case differ: " + where;
        locate_raw(o, ctx_.m, again, st.clean);
      }
    }
    ev_.outcomes.push_back(o);
  }

  void poison(BackendState& st) {
    PropertyOutcome o = make(PropertyId::kPoison, st.be->traits().name);
    if (st.clean.guard_violations != 0) {
      o.passed = false;
      o.guard_written = true;
      o.wrong.guard_written = st.clean.guard_violations;
      o.detail = std::to_string(st.clean.guard_violations) +
                 " output guard elements overwritten (canaries before/after/between rows)";
      ev_.outcomes.push_back(o);
      return;
    }
    for (int i = 0; i < poison_count() && o.passed && o.applicable; ++i) {
      const int v = poison_fill(i);
      const MaterializedCase& pm = ctx_.poison_variant(v);
      RunResult r;
      if (!run_variant(*st.be, pm, r, o, /*values=*/false)) break;
      std::string where;
      if (r.guard_violations != 0) {
        o.passed = false;
        o.guard_written = true;
        o.wrong.guard_written = r.guard_violations;
        o.detail = "poison fill " + std::to_string(v) + ": " + std::to_string(r.guard_violations) +
                   " output guard elements overwritten";
      } else if (!bitwise_equal(ctx_.m, st.clean, r, &where, &o.worst_b, &o.worst_h, &o.worst_d)) {
        o.passed = false;
        o.detail = "poison fill " + std::to_string(v) +
                   " (bytes a correct kernel never reads) changed the output: " + where;
        locate_raw(o, pm, r, st.clean);
      }
    }
    ev_.outcomes.push_back(o);
  }

  void relocate(BackendState& st) {
    PropertyOutcome o = make(PropertyId::kRelocate, st.be->traits().name);
    const MaterializedCase& rm = ctx_.relocation();
    RunResult r;
    if (!exact(st, kInvariantPagePlacement)) {
      if (run_variant(*st.be, rm, r, o)) {
        bounded(st, o, r, st.clean, all(ctx_.m.batch), all(ctx_.m.heads), "relocating the pages");
      }
      ev_.outcomes.push_back(o);
      return;
    }
    if (run_variant(*st.be, rm, r, o, /*values=*/false)) {
      std::string where;
      if (!bitwise_equal(ctx_.m, st.clean, r, &where, &o.worst_b, &o.worst_h, &o.worst_d)) {
        o.passed = false;
        o.detail = "pages relocated (order and stride " + std::to_string(rm.geom.page_stride) +
                   ", indices remapped) changed the output: " + where;
        locate_raw(o, rm, r, st.clean);
      }
    }
    ev_.outcomes.push_back(o);
  }

  // Up to three probes out of n: first, last and one in between.
  static std::vector<int> probes(int n, uint64_t seed) {
    std::vector<int> p{0};
    if (n > 1) p.push_back(n - 1);
    if (n > 2)
      p.push_back(1 + static_cast<int>(CounterRng(seed, Stream::kPoison, 9).uniform_int(0, n - 3)));
    return p;
  }

  void batch_alone_prop(BackendState& st) {
    PropertyOutcome o = make(PropertyId::kBatchAlone, st.be->traits().name);
    if (ctx_.m.batch == 1) {
      o.applicable = false;
      o.detail = "B = 1: the row is already alone";
      ev_.outcomes.push_back(o);
      return;
    }
    const bool exact_rows = exact(st, kInvariantBatch);
    for (int b : probes(ctx_.m.batch, ctx_.m.recipe.data_seed)) {
      RunResult r;
      if (!run_variant(*st.be, ctx_.batch_alone_case(b), r, o)) break;
      // Every query token of the row (flat query row b * s_q + s of the whole run).
      const int S = ctx_.m.s_q, H = ctx_.m.heads;
      if (!exact_rows) {
        std::vector<int> rows;
        for (int s = 0; s < S; ++s) rows.push_back(b * S + s);
        bounded(st, o, r, st.clean, rows, all(H), "batch row " + std::to_string(b) + " alone");
        if (!o.passed) break;
        continue;
      }
      for (int i = 0; i < S * H && o.passed; ++i) {
        const int s = i / H, h = i % H;
        std::string where;
        if (!rows_bitwise_equal(st.clean, H, ctx_.m.d_v(), b * S + s, h, r, i, &where)) {
          o.passed = false;
          o.worst_b = b * S + s;
          o.worst_h = h;
          o.detail = "batch row " + std::to_string(b) + " alone differs: " + where;
        }
      }
      if (!o.passed) {
        std::vector<int> rows;
        for (int s = 0; s < S; ++s) rows.push_back(b * S + s);
        locate_part(o, r, st.clean, rows, all(H));
      }
      if (!o.passed) break;
    }
    ev_.outcomes.push_back(o);
  }

  void head_alone_prop(BackendState& st) {
    PropertyOutcome o = make(PropertyId::kHeadAlone, st.be->traits().name);
    if (ctx_.m.heads == 1) {
      o.applicable = false;
      o.detail = "H = 1: the head is already alone";
      ev_.outcomes.push_back(o);
      return;
    }
    const bool exact_heads = exact(st, kInvariantHead);
    for (int h : probes(ctx_.m.heads, ctx_.m.recipe.data_seed + 1)) {
      RunResult r;
      if (!run_variant(*st.be, ctx_.head_alone_case(h), r, o)) break;
      if (!exact_heads) {
        bounded(st, o, r, st.clean, all(ctx_.m.query_rows()), {h},
                "head " + std::to_string(h) + " alone");
        if (!o.passed) break;
        continue;
      }
      for (int b = 0; b < ctx_.m.query_rows() && o.passed; ++b) {
        std::string where;
        if (!rows_bitwise_equal(st.clean, ctx_.m.heads, ctx_.m.d_v(), b, h, r, b, &where)) {
          o.passed = false;
          o.worst_b = b;
          o.worst_h = h;
          o.detail = "head " + std::to_string(h) + " alone differs: " + where;
        }
      }
      if (!o.passed) locate_part(o, r, st.clean, all(ctx_.m.query_rows()), {h});
      if (!o.passed) break;
    }
    ev_.outcomes.push_back(o);
  }

  // Each query token of a row computed alone (s_q > 1), probed like batch-alone.
  void query_alone_prop(BackendState& st) {
    PropertyOutcome o = make(PropertyId::kQueryAlone, st.be->traits().name);
    const int S = ctx_.m.s_q, H = ctx_.m.heads;
    if (S == 1) {
      o.applicable = false;
      o.detail = "s_q = 1: the query token is already alone";
      ev_.outcomes.push_back(o);
      return;
    }
    const bool exact_queries = exact(st, kInvariantQuery);
    for (int r0 : probes(ctx_.m.query_rows(), ctx_.m.recipe.data_seed + 2)) {
      const int b = r0 / S, s = r0 % S;
      RunResult r;
      if (!run_variant(*st.be, ctx_.query_alone_case(r0), r, o)) break;
      if (!exact_queries) {
        bounded(
            st, o, r, st.clean, {r0}, all(H),
            "query token " + std::to_string(s) + " of batch row " + std::to_string(b) + " alone");
        if (!o.passed) break;
        continue;
      }
      for (int h = 0; h < H && o.passed; ++h) {
        std::string where;
        if (!rows_bitwise_equal(st.clean, H, ctx_.m.d_v(), r0, h, r, h, &where)) {
          o.passed = false;
          o.worst_b = r0;
          o.worst_h = h;
          o.detail = "query token " + std::to_string(s) + " of batch row " + std::to_string(b) +
                     " alone differs: " + where;
        }
      }
      if (!o.passed) locate_part(o, r, st.clean, {r0}, all(H));
      if (!o.passed) break;
    }
    ev_.outcomes.push_back(o);
  }

  // docs/SPEC.md section 8: moving valid entries from the main list to the extra list (or swapping
  // the caches) leaves the mathematical result; within the sum of both runs' bounds.
  void move_to_extra_prop(BackendState& st) {
    if (ctx_.env.refuses_feature(kFeatureExtraCache)) {
      PropertyOutcome o = make(PropertyId::kMoveToExtra, st.be->traits().name);
      o.applicable = false;
      o.detail = "the backends' envelope refuses an extra cache";
      ev_.outcomes.push_back(o);
      return;
    }
    within_bound(st, PropertyId::kMoveToExtra, ctx_.moved_to_extra(), 0, ctx_.move_to_extra_what(),
                 true);
  }

  static std::vector<int> all(int n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
    return v;
  }

  // Whether the backend promises invariant `inv` bit for bit (Backend::inexact_invariants).
  static bool exact(const BackendState& st, uint32_t inv) {
    return (st.be->traits().inexact_invariants & inv) == 0;
  }

  // The bound of a run of the backend against another run of it: its own bound twice.
  Bounds self_bounds(const Backend& be) {
    if (be.traits().precision == Precision::kCustom) {
      return add_bounds(ctx_.backend_bounds(be), ctx_.backend_bounds(be));
    }
    return add_bounds(ctx_.pipeline_bounds(be), ctx_.pipeline_bounds(be));
  }

  // An invariant the kernel does not claim exact: the rows `rows` and heads `heads` of the clean
  // run (in that order) against the variant run `r` (whose shape is rows x heads) within the
  // tolerance bound, as permute is checked. The outcome says so whether it passes or fails.
  void bounded(BackendState& st, PropertyOutcome& o, const RunResult& r, const RunResult& clean,
               const std::vector<int>& rows, const std::vector<int>& heads,
               const std::string& what) {
    static const std::string kWhy = "bounded: not claimed exact by the kernel";
    const int H = ctx_.m.heads, dv = ctx_.m.d_v();
    const Bounds whole = self_bounds(*st.be);
    Bounds bound{pick(whole.out, H, dv, rows, heads), pick(whole.lse, H, 1, rows, heads)};
    const std::vector<double> cout = pick(clean.out, H, dv, rows, heads);
    const std::vector<double> clse = pick(clean.lse, H, 1, rows, heads);
    const bool bf16 = is_bf16(*st.be);
    const BoundCheck bc =
        check_bounds(Side{&r.out, &r.lse, bf16}, Side{&cout, &clse, bf16}, bound,
                     static_cast<int32_t>(rows.size()), static_cast<int32_t>(heads.size()), dv);
    const double seconds = o.seconds;
    if (!bc.passed && opt_.locus) {
      PropertyOutcome w;
      w.passed = false;
      note_wrong(w, r, bf16, clean.out, clean.lse, bf16, &whole, H, dv, rows, heads);
      o.wrong = std::move(w.wrong);
    }
    // The worst of the probes so far stays in the outcome.
    if (!bc.passed || bc.tightness >= o.tightness) {
      fill_from_check(o, bc);
      if (o.worst_b >= 0 && o.worst_b < static_cast<int>(rows.size())) {
        o.worst_b = rows[static_cast<size_t>(o.worst_b)];
      }
      if (o.worst_h >= 0 && o.worst_h < static_cast<int>(heads.size())) {
        o.worst_h = heads[static_cast<size_t>(o.worst_h)];
      }
    }
    o.seconds = seconds;
    o.detail = o.passed
                   ? kWhy
                   : kWhy + "; " + what + " moved the output beyond the bound: " + bc.describe();
  }

  // Elements [b, h, 0..inner) of a [B, H, inner] array for b in rows and h in heads, in order.
  static std::vector<double> pick(const std::vector<double>& v, int H, int inner,
                                  const std::vector<int>& rows, const std::vector<int>& heads) {
    std::vector<double> out;
    out.reserve(rows.size() * heads.size() * static_cast<size_t>(inner));
    for (const int b : rows) {
      for (const int h : heads) {
        const size_t at =
            (static_cast<size_t>(b) * static_cast<size_t>(H) + static_cast<size_t>(h)) *
            static_cast<size_t>(inner);
        out.insert(out.end(), v.begin() + static_cast<std::ptrdiff_t>(at),
                   v.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(inner)));
      }
    }
    return out;
  }

  // Tolerance-style metamorphic check of a transformed run against the clean run. With
  // `moved`, v is move-to-extra's variant and its bound CaseContext::moved_bounds.
  void within_bound(BackendState& st, PropertyId prop, const MaterializedCase& v, int tile_topk,
                    const std::string& what, bool moved = false) {
    Backend& be = *st.be;
    PropertyOutcome o = make(prop, be.traits().name);
    RunResult r;
    // A bf16 run is read in its raw buffers (not widened) when they fit.
    const bool bf16 = is_bf16(be);
    if (run_variant(be, v, r, o, /*values=*/!bf16)) {
      if (bf16 && !raw_fits(r, v)) widen_raw_outputs(v, r);
      // The clean run's bound plus the variant's (summed in the check).
      const Bounds& clean = ctx_.backend_bounds(be);
      const Bounds* variant = &clean;
      if (be.traits().precision != Precision::kCustom) {
        variant = moved ? &ctx_.moved_bounds(be) : &ctx_.pipeline_bounds(be, tile_topk);
      }
      const BoundCheck bc =
          check_bounds(check_side(r, v, bf16), check_side(st.clean, ctx_.m, bf16), clean, variant,
                       ctx_.m.query_rows(), ctx_.m.heads, ctx_.m.d_v());
      const double seconds = o.seconds;
      fill_from_check(o, bc);
      o.seconds = seconds;
      locate(o, r, is_bf16(be), st.clean.out, st.clean.lse, is_bf16(be), &clean, variant);
      if (!o.passed) o.detail = what + " moved the output beyond the bound: " + o.detail;
    }
    ev_.outcomes.push_back(o);
  }

  // split-agree: the backend rerun with one split per row and with one split per tile (the
  // most the kernel cuts; mla::kSplitMax), each against the clean run (its own setting) within
  // the backend's bound twice. The split pipeline's own error (fp32 partials, the merge) is in
  // the bound (properties/tolerance.h), so any two split counts must agree within it.
  static constexpr int kSplitAgreeCounts[] = {1, -1};
  void split_agree(BackendState& st) {
    Backend& be = *st.be;
    PropertyOutcome o = make(PropertyId::kSplitAgree, be.traits().name);
    // The backend's bound twice (self_bounds), summed in the check.
    const Bounds& bound = ctx_.backend_bounds(be);
    double seconds = 0;
    const bool bf16 = is_bf16(be);
    for (int splits : kSplitAgreeCounts) {
      RunResult r;
      const MaterializedCase& v = ctx_.split_variant(splits);
      if (!run_variant(be, v, r, o, /*values=*/!bf16)) break;
      if (bf16 && !raw_fits(r, v)) widen_raw_outputs(v, r);
      seconds = o.seconds;
      const BoundCheck bc =
          check_bounds(check_side(r, v, bf16), check_side(st.clean, ctx_.m, bf16), bound, &bound,
                       ctx_.m.query_rows(), ctx_.m.heads, ctx_.m.d_v());
      if (!bc.passed || bc.tightness >= o.tightness) fill_from_check(o, bc);
      o.seconds = seconds;
      if (!bc.passed) {
        locate(o, r, is_bf16(be), st.clean.out, st.clean.lse, is_bf16(be), &bound, &bound);
        o.detail = std::string(splits == 1 ? "1 split per row" : "one split per tile") +
                   " moved the output beyond the bound: " + o.detail;
        break;
      }
    }
    ev_.outcomes.push_back(o);
  }

  void permute(BackendState& st) {
    within_bound(st, PropertyId::kPermute, ctx_.permutation(), 0, "permuting the index lists");
  }

  void insert(BackendState& st) {
    const int count = ctx_.insert_count();
    within_bound(st, PropertyId::kInsertInvalid, ctx_.insertion(), ctx_.m.topk + count,
                 "inserting " + std::to_string(count) + " -1 entries");
  }

  CaseContext& ctx_;
  const std::vector<std::string>& props_;
  const EvalOptions& opt_;
  CaseEvaluation& ev_;
  // The current backend's batch of transformed-case runs, by the variant they ran.
  std::map<const MaterializedCase*, CheckedRun> batch_;
};

}  // namespace

bool CaseEvaluation::failed() const {
  return std::any_of(outcomes.begin(), outcomes.end(),
                     [](const PropertyOutcome& o) { return o.applicable && !o.passed; });
}

std::vector<const PropertyOutcome*> CaseEvaluation::failures() const {
  std::vector<const PropertyOutcome*> f;
  for (const auto& o : outcomes) {
    if (o.applicable && !o.passed) f.push_back(&o);
  }
  std::stable_sort(f.begin(), f.end(), [](const PropertyOutcome* a, const PropertyOutcome* b) {
    return failure_worse(*a, *b);
  });
  return f;
}

bool failure_worse(const PropertyOutcome& a, const PropertyOutcome& b) {
  // 2: exact failures, nothing to compare (a failed run, a bitwise difference, an excess over a
  // bound of 0: a value that must be exact); 1: a non-finite mismatch; 0: by tightness.
  auto tier = [](const PropertyOutcome& o) {
    if (o.run_failed || !has_error_figures(o.property) || std::isinf(o.tightness)) return 2;
    return o.nonfinite_mismatch ? 1 : 0;
  };
  if (tier(a) != tier(b)) return tier(a) > tier(b);
  return tier(a) == 0 && a.tightness > b.tightness;
}

CaseEvaluation evaluate_case(const Case& c, const std::vector<Backend*>& backends,
                             const std::vector<std::string>& properties) {
  return evaluate_case(c, backends, properties, EvalOptions{});
}

CaseEvaluation evaluate_case(const Case& c, const std::vector<Backend*>& backends,
                             const std::vector<std::string>& properties,
                             const EvalOptions& options) {
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_seconds();
  check_property_names(properties);
  CaseEvaluation ev;
  CaseContext ctx;
  ctx.m = materialize(c);
  ev.steps[CaseStep::kMaterialize] = since(t0);
  for (const Backend* be : backends) ctx.env = intersect(ctx.env, be->traits().envelope);
  Evaluator e(ctx, properties, options, ev);
  // Clean runs before the oracle allocates its result (FlashMLA's order: reused memory cannot
  // fake a pass); the oracle's time is measured on its own.
  std::vector<BackendState> states(backends.size());
  const auto t_clean = Clock::now();
  for (size_t i = 0; i < backends.size(); ++i) {
    states[i].be = backends[i];
    e.start(states[i]);
  }
  ev.steps[CaseStep::kCleanRuns] = since(t_clean);
  // The bounds the clean runs' properties need (insert-invalid's longer list when that property
  // runs), formed from the oracle's rows while it computes them (BoundsSetVisitor: the keys it
  // decoded and the logits it formed are not formed again).
  const auto wants = [&](PropertyId id) { return selected(properties, property_info(id).name); };
  // Only the bitwise properties selected, of backends that claim them all exact: the oracle's
  // own bound (as always), no pipeline bounds.
  bool bounded = wants(PropertyId::kTolerance) || wants(PropertyId::kMmaVsSimt) ||
                 wants(PropertyId::kPermute) || wants(PropertyId::kInsertInvalid) ||
                 wants(PropertyId::kMoveToExtra) || wants(PropertyId::kSplitAgree);
  std::vector<const Backend*> ran;
  for (const auto& st : states) {
    if (st.ran) ran.push_back(st.be);
    if (st.ran && st.be->traits().inexact_invariants != 0) bounded = true;
  }
  if (!bounded) ran.clear();
  const bool insert = wants(PropertyId::kInsertInvalid) && !ran.empty();
  // move-to-extra's moved entries (a swap takes the case's own bound: CaseContext::moved_bounds).
  const bool move = wants(PropertyId::kMoveToExtra) && !ran.empty() &&
                    !ctx.env.refuses_feature(kFeatureExtraCache) && !ctx.move_swaps();
  CaseContext::BoundsPrefetch prefetch = ctx.prefetch_requests(
      ran, insert ? ctx.m.topk + ctx.insert_count() : -1, move ? ctx.moved_extra_topk() : -1);
  const auto t_setup = Clock::now();
  BoundsSetVisitor bounds_rows(ctx.m, std::move(prefetch.requests));  // the bounds' buffers
  const double setup_seconds = since(t_setup);
  TimedRows timed(bounds_rows);
  const auto to = Clock::now();
  ctx.ref = run_oracle_eigen(ctx.m, 1, &timed);
  // The oracle's time on its own: its call less the time its rows spent in the bounds.
  ev.oracle_seconds = since(to) - timed.seconds;
  ev.steps[CaseStep::kOracle] = ev.oracle_seconds;
  const auto t_bounds = Clock::now();
  ctx.store_prefetched(prefetch.keys, bounds_rows.take());
  ev.steps[CaseStep::kBounds] += setup_seconds + timed.seconds + since(t_bounds);
  for (auto& st : states) e.properties(st);
  e.mma_vs_simt(states);
  ev.seconds = since(t0);
  ev.steps.wall = ev.seconds;
  ev.steps.thread_cpu = thread_cpu_seconds() - cpu0;
  return ev;
}

const char* case_step_name(CaseStep s) {
  switch (s) {
    case CaseStep::kGenerate:
      return "generate";
    case CaseStep::kMaterialize:
      return "materialize";
    case CaseStep::kCleanRuns:
      return "clean_runs";
    case CaseStep::kOracle:
      return "oracle";
    case CaseStep::kBounds:
      return "bounds";
    case CaseStep::kVariants:
      return "variants";
    case CaseStep::kVariantRuns:
      return "variant_runs";
    case CaseStep::kChecks:
      return "checks";
    case CaseStep::kCount:
      break;
  }
  return "?";
}

double thread_cpu_seconds() {
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<PropertyOutcome> judge_runs(
    const MaterializedCase& m, const std::vector<std::pair<Backend*, const RunResult*>>& runs,
    const EvalOptions& options) {
  CaseEvaluation ev;
  CaseContext ctx;
  ctx.m = m;
  const std::vector<std::string> props{property_info(PropertyId::kRun).name,
                                       property_info(PropertyId::kTolerance).name};
  Evaluator e(ctx, props, options, ev);
  std::vector<BackendState> states(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    states[i].be = runs[i].first;
    states[i].clean = *runs[i].second;
    PropertyOutcome run;
    run.property = property_info(PropertyId::kRun).name;
    run.backend = runs[i].first->traits().name;
    run.seconds = runs[i].second->seconds;
    e.record_clean(states[i], run);
  }
  ctx.ref = run_oracle_eigen(ctx.m, 1);
  ctx.b64 = compute_bounds(ctx.m, ctx.ref, pipeline_for(Precision::kFloat64));
  for (auto& st : states) e.properties(st);
  return ev.outcomes;
}

ElementBounds tolerance_bounds(const MaterializedCase& m, const OracleResult& ref,
                               const Backend& be) {
  CaseContext ctx;
  ctx.m = m;
  ctx.ref = ref;
  ctx.b64 = compute_bounds(ctx.m, ctx.ref, pipeline_for(Precision::kFloat64));
  Bounds b = ctx.tolerance_bound(be);
  return {std::move(b.out), std::move(b.lse)};
}

std::string format_outcome(const PropertyOutcome& o) {
  std::ostringstream os;
  os << o.property << " on " << o.backend << ": ";
  if (!o.applicable) {
    os << "not applicable (" << o.detail << ")";
  } else {
    os << (o.passed ? "pass" : "FAIL");
    if (!o.detail.empty()) os << ": " << o.detail;
    if (has_error_figures(o.property) && !o.run_failed) {
      os.precision(3);
      os << " [max|d| " << o.max_abs << ", mean " << o.mean_abs << ", rel " << o.max_rel
         << ", lse max|d| " << o.lse_max_abs << ", tightness " << o.tightness
         << (o.nonfinite_mismatch ? ", non-finite mismatch" : "") << "]";
    }
  }
  return os.str();
}

}  // namespace mlafuzz

// From a failing case to a grouped finding (see triage.h).
#include "properties/triage.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "core/materialize.h"
#include "properties/canonical.h"
#include "properties/case_edits.h"
#include "properties/property_table.h"
#include "properties/shrink.h"

namespace mlafuzz {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Position of a property in the table (the pseudo-property "fault" first: it names the group).
int table_rank(const std::string& property) {
  if (property == "fault") return -1;
  const PropertyInfo* p = find_property(property);
  return p == nullptr ? 1 << 20 : static_cast<int>(p->id);
}

// Inline printing limits (the minimal case of a finding is usually far below them).
constexpr int kMaxInlineRows = 2;
constexpr int kMaxInlineHeads = 4;
constexpr int kMaxInlineTopk = 16;
constexpr int kMaxInlineTokens = 4;
constexpr int kMaxListedRows = 3;
// Entries probed for the locus at most (each probe is one evaluation).
constexpr int kMaxEntryProbes = 16;
// Valid entries a realization of move-to-extra moves, one at a time, at most.
constexpr int kMaxRealizedMoves = 8;
// Draws of the values (data_seed 0 .. kCauseDraws - 1) a cause is checked with.
constexpr uint64_t kCauseDraws = 5;
constexpr uint64_t kMoreCauseDraws = 11;
// Moves of a feature (its first) a cause is checked with.
constexpr size_t kCauseMoves = 4;

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// "b0,h1" or "b0,s1,h1" for query row r of a case with s_q tokens per row.
std::string row_head(const Case& c, int32_t r, int32_t h) {
  if (c.s_q == 1) return fmt::format("b{},h{}", r, h);
  return fmt::format("b{},s{},h{}", r / c.s_q, r % c.s_q, h);
}

std::string rows_text(const Case& c, const char* what,
                      const std::vector<std::pair<int32_t, int32_t>>& rows) {
  const auto total = static_cast<size_t>(c.query_rows()) * static_cast<size_t>(c.heads);
  if (rows.size() > kMaxListedRows) {
    if (rows.size() == total) return fmt::format("{} in every (row, head)", what);
    return fmt::format("{} in {} of {} (row, head) pairs", what, rows.size(), total);
  }
  std::vector<std::string> v;
  for (const auto& [r, h] : rows) v.push_back(fmt::format("{}[{}]", what, row_head(c, r, h)));
  return join(v, ", ");
}

// The name of out columns [lo, hi]: scale groups of the nope part, the rope part.
std::string column_name(const Case& c, int32_t lo, int32_t hi) {
  const int32_t nope = c.geom.nope_dim, tile = c.geom.scale_tile;
  if (hi < nope) {
    const int32_t g0 = lo / tile, g1 = hi / tile;
    const bool whole = lo == g0 * tile && hi == (g1 + 1) * tile - 1;
    const std::string groups =
        g0 == g1 ? fmt::format("scale group {}", g0) : fmt::format("scale groups {}..{}", g0, g1);
    return whole ? groups : "in " + groups;
  }
  if (lo >= nope) return hi - lo + 1 == c.geom.rope_dim ? "the rope part" : "in the rope part";
  return "nope and rope";
}

std::string columns_text(const Case& c, const std::vector<int32_t>& cols) {
  if (static_cast<int32_t>(cols.size()) == c.d_v()) return "in every column";
  std::vector<std::string> ranges;
  for (size_t i = 0; i < cols.size();) {
    size_t j = i;
    while (j + 1 < cols.size() && cols[j + 1] == cols[j] + 1) ++j;
    const std::string d =
        cols[i] == cols[j] ? fmt::format("{}", cols[i]) : fmt::format("{}..{}", cols[i], cols[j]);
    ranges.push_back(fmt::format("d {} ({})", d, column_name(c, cols[i], cols[j])));
    i = j + 1;
  }
  if (ranges.size() > 4) {
    // Scattered (equal values in between): by the scale groups or the rope part they lie in.
    const int32_t nope = c.geom.nope_dim, tile = c.geom.scale_tile;
    std::map<int32_t, int> parts;  // scale group (-1: rope) -> wrong columns
    for (const int32_t d : cols) ++parts[d < nope ? d / tile : -1];
    const int32_t all_parts = nope / tile + (c.d_v() > nope ? 1 : 0);
    if (static_cast<int32_t>(parts.size()) >= all_parts || parts.size() > 3) {
      return fmt::format("in {} of {} columns", cols.size(), c.d_v());
    }
    std::vector<std::string> names;
    for (const auto& [g, n] : parts) {
      names.push_back(g < 0 ? fmt::format("the rope part ({} columns)", n)
                            : fmt::format("scale group {} (d {}..{}: {} columns)", g, g * tile,
                                          (g + 1) * tile - 1, n));
    }
    return "only in " + join(names, ", ");
  }
  return "only in " + join(ranges, ", ");
}

// Where logical token t of the main cache lies: "token 127: page 1, slot 63 = last slot of the
// page".
std::string token_place(const Case& c, int32_t t) {
  const int32_t P = c.geom.page_size;
  const int32_t page = t / P, slot = t % P;
  const int32_t phys = c.page_order.empty() ? page : c.page_order[static_cast<size_t>(page)];
  std::string s = fmt::format("token {}: page {}", t, page);
  if (phys != page) s += fmt::format(" (physical page {})", phys);
  s += fmt::format(", slot {}", slot);
  if (P == 1) return s + " = the page's only slot";
  if (slot == 0) return s + " = first slot of the page";
  if (slot == P - 1) return s + " = last slot of the page";
  return s;
}

std::string list_text(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

std::string value_text(const ValueSpec& v) {
  std::string s = fmt::format("{} x{}", value_dist_name(v.dist), number(v.magnitude));
  if (v.special_fraction > 0) s += fmt::format(" ({} special)", number(v.special_fraction));
  return s;
}

}  // namespace

const char* failure_kind_name(FailureKind k) {
  switch (k) {
    case FailureKind::kBoundExcess:
      return "bound excess";
    case FailureKind::kNonfiniteMismatch:
      return "non-finite mismatch";
    case FailureKind::kBitwiseDifference:
      return "bitwise difference";
    case FailureKind::kGuardWrite:
      return "guard write";
    case FailureKind::kRunError:
      return "run error";
    case FailureKind::kFault:
      return "fault";
  }
  return "?";
}

FailureKind failure_kind(const PropertyOutcome& o) {
  if (o.property == "fault") return FailureKind::kFault;
  if (o.run_failed) return FailureKind::kRunError;
  if (o.guard_written) return FailureKind::kGuardWrite;
  if (o.nonfinite_mismatch) return FailureKind::kNonfiniteMismatch;
  return has_error_figures(o.property) ? FailureKind::kBoundExcess
                                       : FailureKind::kBitwiseDifference;
}

const PropertyOutcome* primary_failure(const std::vector<PropertyOutcome>& failures) {
  const PropertyOutcome* best = nullptr;
  for (const auto& o : failures) {
    if (best == nullptr || table_rank(o.property) < table_rank(best->property)) best = &o;
  }
  return best;
}

std::vector<std::string> group_causes(const Case& minimal, const PropertyOutcome& primary,
                                      const Envelope& envelope) {
  std::vector<std::string> causes = cause_set(minimal, envelope);
  const PropertyInfo* p = find_property(primary.property);
  if (p != nullptr && p->transformation != nullptr && !primary.run_failed) {
    causes.push_back(std::string("only when ") + p->transformation);
  }
  return causes;
}

std::string group_signature(const std::string& backend, FailureKind kind,
                            const std::vector<std::string>& causes) {
  return backend + " | " + failure_kind_name(kind) + " | " +
         (causes.empty() ? std::string("fails on the canonical case") : join(causes, "; "));
}

std::vector<Backend*> failure_backends(const std::string& names,
                                       const std::vector<Backend*>& backends) {
  std::vector<Backend*> use;
  size_t start = 0;
  while (start <= names.size()) {
    const size_t bar = names.find('|', start);
    const std::string n =
        names.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    for (Backend* b : backends) {
      if (b->name() == n) use.push_back(b);
    }
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return use;
}

std::function<bool(const Case&)> any_failure_predicate(const PropertyOutcome& failure,
                                                       const std::vector<Backend*>& backends,
                                                       const std::vector<std::string>& properties) {
  const std::vector<Backend*> use = failure_backends(failure.backend, backends);
  const std::string prop = failure.property, backend = failure.backend;
  const std::vector<std::string> all = properties.empty() ? all_properties() : properties;
  return [use, prop, backend, all](const Case& c) {
    const auto fails = [&](const CaseEvaluation& ev) {
      return std::any_of(ev.outcomes.begin(), ev.outcomes.end(), [&](const PropertyOutcome& o) {
        return o.applicable && !o.passed && o.backend == backend;
      });
    };
    if (find_property(prop) != nullptr && fails(evaluate_case(c, use, {prop}))) return true;
    std::vector<std::string> others;
    for (const auto& p : all) {
      if (p != prop) others.push_back(p);
    }
    return fails(evaluate_case(c, use, others));
  };
}

ShrinkResult shrink_canonical(const Case& failing,
                              const std::function<bool(const Case&)>& size_fails,
                              const std::function<bool(const Case&)>& canonical_fails,
                              const ShrinkLimits& limits, const Envelope& envelope,
                              const ShrinkHooks& hooks) {
  const auto t0 = Clock::now();
  // The size within half the evaluations (as triage_failure).
  ShrinkResult size = shrink_case(
      failing, size_fails, {limits.max_evaluations / 2, limits.max_seconds}, envelope, hooks);
  if (size.stopped_by == ShrinkStop::kSeconds || size.stopped_by == ShrinkStop::kStopped) {
    return size;
  }
  const ShrinkLimits left{limits.max_evaluations - size.evaluations,
                          limits.max_seconds - since(t0)};
  ShrinkResult canon =
      canonicalize_case(size.minimal, canonical_fails, left, envelope, nullptr, hooks);
  canon.steps += size.steps;
  canon.evaluations += size.evaluations;
  canon.seconds = since(t0);
  return canon;
}

std::string Locus::text() const {
  std::vector<std::string> parts;
  for (const std::string* p : {&outputs, &entries, &inputs}) {
    if (!p->empty()) parts.push_back(*p);
  }
  return join(parts, "; ");
}

std::string describe_wrong(const Case& c, const WrongOutputs& w) {
  std::vector<std::string> parts;
  if (!w.out_rows.empty()) {
    parts.push_back(rows_text(c, "out", w.out_rows) + " wrong " + columns_text(c, w.out_columns));
  }
  if (!w.lse_rows.empty()) parts.push_back(rows_text(c, "lse", w.lse_rows) + " wrong");
  if (w.guard_written > 0) {
    parts.push_back(fmt::format("{} output guard or gap element(s) written", w.guard_written));
  }
  return join(parts, "; ");
}

std::string needed_entries(const Case& c, const std::function<bool(const Case&)>& still_fails,
                           int max_probes, int* evaluations, std::vector<int32_t>* needed) {
  const Case e = with_explicit_indices(c);
  const int rows = e.query_rows();
  // The entries found needed: row, position, whether invalid, the words.
  struct Needed {
    int q, k;
    bool invalid;
    std::string what;
  };
  std::vector<Needed> found;
  int probes = 0;
  bool cut = false;
  const auto probe = [&](const Case& cand) -> bool {
    // True when removing the entry makes the failure go away.
    try {
      validate(cand);
    } catch (const CaseError&) {
      return false;
    }
    if (probes >= max_probes) {
      cut = true;
      return false;
    }
    ++probes;
    bool fails = true;
    try {
      fails = still_fails(cand);
    } catch (const std::exception&) {
      fails = true;  // not evaluable: say nothing about the entry
    }
    return !fails;
  };
  const auto where = [&](int q, int k, const char* list) {
    const std::string row = rows == 1    ? ""
                            : e.s_q == 1 ? fmt::format("row b{} ", q)
                                         : fmt::format("row b{},s{} ", q / e.s_q, q % e.s_q);
    return row + list + "entry " + std::to_string(k);
  };
  // The tokens first (valid and masked entries, both lists), then the invalid entries.
  const int64_t slots = mla::num_slots(e.geom);
  for (int pass = 0; pass < 2; ++pass) {
    for (int q = 0; q < rows; ++q) {
      const int32_t len = edits::row_len(e, q);
      for (int k = 0; k < e.topk; ++k) {
        const int32_t v = e.indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
        const bool masked = len >= 0 && k >= len;
        const bool in_cache = v >= 0 && v < slots;
        const bool token = edits::entry_valid(e, q, k) || (masked && in_cache);
        if (token != (pass == 0)) continue;
        Case cand = e;
        std::string what;
        if (token) {
          cand.indices[static_cast<size_t>(q)][static_cast<size_t>(k)] = -1;
          what = fmt::format("({}{})", token_place(e, v), masked ? ", masked by topk_length" : "");
        } else if (!masked && rows == 1 && e.topk > 1) {
          std::vector<int> keep;
          for (int j = 0; j < e.topk; ++j) {
            if (j != k) keep.push_back(j);
          }
          cand = edits::select_positions(e, keep);
          what = fmt::format("({}, an invalid entry)", v);
        } else {
          continue;
        }
        if (probe(cand)) {
          found.push_back({q, k, !in_cache && !masked, where(q, k, "") + " " + what});
          if (needed && in_cache) needed->push_back(v);
        }
      }
      if (!e.extra || pass == 1) continue;
      for (int k = 0; k < e.extra->topk; ++k) {
        if (!edits::extra_entry_valid(e, q, k)) continue;
        Case cand = e;
        const int32_t v = cand.extra->indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
        cand.extra->indices[static_cast<size_t>(q)][static_cast<size_t>(k)] = -1;
        if (probe(cand)) {
          found.push_back(
              {q, e.topk + k, false,
               where(q, k, "extra-list ") + " (extra token " + std::to_string(v) + ")"});
        }
      }
    }
  }
  std::stable_sort(found.begin(), found.end(), [](const Needed& a, const Needed& b) {
    return std::tie(a.q, a.k) < std::tie(b.q, b.k);
  });
  if (evaluations) *evaluations += probes;
  std::string s;
  // Runs of invalid entries of one row (spacers keeping tokens in their tiles) in one phrase.
  std::vector<std::string> phrases;
  for (size_t i = 0; i < found.size();) {
    size_t j = i;
    while (found[i].invalid && j + 1 < found.size() && found[j + 1].invalid &&
           found[j + 1].q == found[i].q && found[j + 1].k == found[j].k + 1) {
      ++j;
    }
    if (j > i + 1) {
      std::string run = where(found[i].q, found[i].k, "");
      run.replace(run.rfind("entry "), 6, "entries ");
      phrases.push_back(run + ".." + std::to_string(found[j].k) + " (invalid entries)");
    } else {
      for (size_t x = i; x <= j; ++x) phrases.push_back(found[x].what);
    }
    i = j + 1;
  }
  if (found.empty()) {
    s = "no single entry is needed";
  } else {
    s = "needs " + join(phrases, ", ");
  }
  if (cut) s += " (entries probed: the first " + std::to_string(probes) + ")";
  return s;
}

std::string inline_inputs(const Case& c, const std::vector<int32_t>& tokens) {
  const Case e = with_explicit_indices(c);
  const int32_t extra_topk = e.extra ? e.extra->topk : 0;
  if (e.query_rows() > kMaxInlineRows || e.heads > kMaxInlineHeads || e.topk > kMaxInlineTopk ||
      extra_topk > kMaxInlineTopk) {
    return "";
  }
  const auto& g = e.geom;
  std::vector<std::string> parts;
  std::string geom =
      fmt::format("{} nope {} rope {}, page_size {}, {} page(s)", layout_name(g.layout), g.nope_dim,
                  g.rope_dim, g.page_size, g.num_pages);
  if (const int64_t pad = edits::stride_padding(g); pad > 0) {
    geom += fmt::format(", stride {} (+{} bytes)", g.page_stride, pad);
  }
  if (!e.page_order.empty()) geom += ", page_order " + list_text(e.page_order);
  parts.push_back(geom);
  parts.push_back(fmt::format("B={} s_q={} H={} topk={}", e.batch, e.s_q, e.heads, e.topk));
  std::vector<std::string> lists;
  for (const auto& row : e.indices) lists.push_back(list_text(row));
  parts.push_back("indices " + join(lists, " "));
  if (e.topk_length) parts.push_back("topk_length " + list_text(*e.topk_length));
  if (e.extra) {
    std::vector<std::string> el;
    for (const auto& row : e.extra->indices) el.push_back(list_text(row));
    std::string x = fmt::format("extra (page_size {}, {} page(s)) indices {}", e.extra->page_size,
                                e.extra->num_pages, join(el, " "));
    if (e.extra->topk_length) x += " topk_length " + list_text(*e.extra->topk_length);
    parts.push_back(x);
  }
  if (e.sink) {
    std::vector<std::string> s;
    for (double v : *e.sink) s.push_back(number(v));
    parts.push_back("sink [" + join(s, ", ") + "]");
  }
  if (e.sm_scale) parts.push_back("sm_scale " + number(*e.sm_scale));
  // Scales of the tokens involved, as stored (exponents of 2 per tile).
  std::vector<int32_t> show = tokens;
  if (show.empty()) {
    for (int q = 0; q < e.query_rows(); ++q) {
      for (int k = 0; k < e.topk; ++k) {
        if (edits::entry_valid(e, q, k))
          show.push_back(e.indices[static_cast<size_t>(q)][static_cast<size_t>(k)]);
      }
    }
  }
  std::sort(show.begin(), show.end());
  show.erase(std::unique(show.begin(), show.end()), show.end());
  if (show.size() > kMaxInlineTokens) show.resize(kMaxInlineTokens);
  if (!show.empty()) {
    try {
      const MaterializedCase m = materialize(e);
      std::vector<std::string> ts;
      for (const int32_t t : show) {
        const mla::TokenAddress a = mla::token_address(m.geom, physical_slot(e, t));
        std::vector<std::string> ex;
        for (int32_t i = 0; i < mla::num_scale_tiles(m.geom); ++i) {
          const float s = mla::tile_scale(m.geom, m.cache.data(), a, i);
          int exp = 0;
          const double frac = std::frexp(static_cast<double>(s), &exp);
          ex.push_back(frac == 0.5 ? std::to_string(exp - 1) : number(s));
        }
        ts.push_back(fmt::format("token {} 2^[{}]", t, join(ex, " ")));
      }
      parts.push_back("scales " + join(ts, ", "));
    } catch (const std::exception&) {
      // no scales shown for a case that does not materialize
    }
  }
  parts.push_back(fmt::format("values q {}, K {}, rope {}, data_seed {}", value_text(e.q_values),
                              value_text(e.kv_values), value_text(e.rope_values), e.data_seed));
  if (e.conventions.invalid_index != mla::InvalidIndexRule::kMinusOneOnly ||
      e.conventions.empty_lse != mla::EmptyRowLse::kPosInf || e.conventions.sink_in_lse) {
    std::vector<std::string> conv;
    if (e.conventions.invalid_index != mla::InvalidIndexRule::kMinusOneOnly) {
      conv.push_back("any negative index invalid");
    }
    if (e.conventions.empty_lse != mla::EmptyRowLse::kPosInf) conv.push_back("empty-row LSE -inf");
    if (e.conventions.sink_in_lse) conv.push_back("sink in the LSE");
    parts.push_back("conventions: " + join(conv, ", "));
  }
  return "inputs: " + join(parts, "; ");
}

namespace {

// Cases that apply property p's transformation (or the part of it a recipe can say) to c
// itself, so that a failure that only showed under the transformation may fail the direct
// comparison with the oracle: pages relocated (the tokens on page 1, the stride padded),
// -1 entries inserted, the lists reversed, an entry moved into an extra list, the entries
// topk_length masks pointing at tokens, the pad bytes filled with NaN or garbage.
std::vector<Case> realizations(const Case& c, PropertyId p) {
  std::vector<Case> out;
  const int rows = c.query_rows();
  switch (p) {
    case PropertyId::kRelocate: {
      if (!c.page_order.empty()) break;
      const int32_t P = c.geom.page_size;
      std::optional<Case> page1;
      {
        Case r = c;
        std::map<int32_t, int32_t> to;
        for (int q = 0; q < rows; ++q) {
          for (int k = 0; k < c.topk; ++k) {
            if (!edits::entry_valid(c, q, k)) continue;
            int32_t& v = r.indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
            if (to.count(v) == 0) {
              const auto next = static_cast<int32_t>(to.size());
              to[v] = P + next;
            }
            v = to[v];
          }
        }
        int32_t largest = 0;
        for (const auto& row : r.indices) {
          for (int32_t v : row) largest = std::max(largest, v);
        }
        r.geom.num_pages = std::max(c.geom.num_pages, largest / P + 1);
        if (!to.empty()) page1 = std::move(r);
      }
      const auto padded = [](Case r, int64_t pad) {
        r.geom.page_stride = mla::min_page_stride(r.geom) + pad;
        return r;
      };
      for (const int64_t pad : {int64_t{64}, int64_t{576}}) {
        if (page1) out.push_back(padded(*page1, pad));
      }
      for (const int64_t pad : {int64_t{64}, int64_t{576}}) out.push_back(padded(c, pad));
      if (page1) out.push_back(*page1);
      break;
    }
    case PropertyId::kInsertInvalid:
      for (const bool front : {true, false}) {
        Case r = c;
        r.topk = c.topk + 1;
        for (int q = 0; q < rows; ++q) {
          auto& row = r.indices[static_cast<size_t>(q)];
          const int32_t len = edits::row_len(c, q);
          const int32_t at = front ? 0 : (len < 0 ? c.topk : len);
          row.insert(row.begin() + at, -1);
        }
        if (r.topk_length) {
          for (int32_t& len : *r.topk_length) ++len;
        }
        out.push_back(std::move(r));
      }
      break;
    case PropertyId::kPermute: {
      Case r = c;
      for (int q = 0; q < rows; ++q) {
        auto& row = r.indices[static_cast<size_t>(q)];
        const int32_t len = edits::row_len(c, q);
        std::reverse(row.begin(), row.begin() + (len < 0 ? c.topk : len));
      }
      out.push_back(std::move(r));
      break;
    }
    case PropertyId::kMoveToExtra: {
      if (c.extra) {
        if (auto r = edits::swapped_caches(c)) out.push_back(std::move(*r));
        break;
      }
      // The i-th valid entry of every list (for each i, from the last) moved into a new extra
      // list: of the same tokens (same_values), or, as the property appends moved tokens to new
      // pages of an extra cache of its own paging, to the first slot of page 1 of a
      // 61-token-page cache.
      for (const bool own_pages : {false, true}) {
        for (int i = 0; i < kMaxRealizedMoves; ++i) {
          Case r = c;
          ExtraCache e;
          e.page_size = own_pages ? 61 : c.geom.page_size;
          e.num_pages = own_pages ? 2 : c.geom.num_pages;
          e.topk = 1;
          e.same_values = true;
          bool moved = false;
          for (int q = 0; q < rows; ++q) {
            int32_t token = -1;
            for (int k = c.topk - 1, seen = 0; k >= 0 && token < 0; --k) {
              if (!edits::entry_valid(c, q, k) || seen++ < i) continue;
              token = c.indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
              r.indices[static_cast<size_t>(q)][static_cast<size_t>(k)] = -1;
            }
            moved = moved || token >= 0;
            e.indices.push_back({token < 0 ? -1 : own_pages ? e.page_size : token});
          }
          r.extra = e;
          if (moved) out.push_back(std::move(r));
        }
      }
      break;
    }
    case PropertyId::kPoison:
      // The entries topk_length masks point at tokens (poison points them at poisoned slots).
      if (c.topk_length) {
        Case r = c;
        bool changed = false;
        for (int q = 0; q < rows; ++q) {
          for (int k = std::max(0, edits::row_len(c, q)); k < c.topk; ++k) {
            int32_t& v = r.indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
            if (v >= 0) continue;
            v = edits::unused_token(r);
            changed = changed || v >= 0;
          }
        }
        if (changed) out.push_back(std::move(r));
      }
      for (const Fill f : {Fill::kNaN, Fill::kGarbage}) {
        if (c.pad_fill == f) continue;
        Case r = c;
        r.pad_fill = f;
        out.push_back(std::move(r));
      }
      break;
    default:
      break;
  }
  return out;
}

// Whether the failure's backend fails a property that judges the case as it is (run, tolerance;
// mma-vs-simt for a pair) among `properties`.
std::function<bool(const Case&)> direct_failure_predicate(
    const PropertyOutcome& failure, const std::vector<Backend*>& backends,
    const std::vector<std::string>& properties) {
  std::vector<std::string> direct;
  for (const auto& p : properties.empty() ? all_properties() : properties) {
    const PropertyInfo* info = find_property(p);
    if (info != nullptr && info->transformation == nullptr) direct.push_back(p);
  }
  if (direct.empty()) direct.push_back("run");
  const std::vector<Backend*> use = failure_backends(failure.backend, backends);
  const std::string backend = failure.backend;
  return [use, direct, backend](const Case& c) {
    const CaseEvaluation ev = evaluate_case(c, use, direct);
    return std::any_of(ev.outcomes.begin(), ev.outcomes.end(), [&](const PropertyOutcome& o) {
      return o.applicable && !o.passed && o.backend == backend;
    });
  };
}

// The failed outcomes of the failure's backend on c (every selected property).
std::vector<PropertyOutcome> failures_on(const Case& c, const PropertyOutcome& failure,
                                         const std::vector<Backend*>& backends,
                                         const std::vector<std::string>& properties, bool locus) {
  EvalOptions eo;
  eo.locus = locus;
  const CaseEvaluation ev =
      evaluate_case(c, failure_backends(failure.backend, backends), properties, eo);
  std::vector<PropertyOutcome> out;
  for (const auto& o : ev.outcomes) {
    if (o.applicable && !o.passed && o.backend == failure.backend) out.push_back(o);
  }
  std::stable_sort(out.begin(), out.end(), [](const PropertyOutcome& a, const PropertyOutcome& b) {
    return table_rank(a.property) < table_rank(b.property);
  });
  return out;
}

}  // namespace

std::vector<std::string> robust_causes(const Case& c, const Envelope& envelope,
                                       const std::function<bool(const Case&)>& still_fails,
                                       int max_evaluations, int* evaluations) {
  const Case e = with_explicit_indices(c);
  const std::string json = to_json(e);
  int used = 0;
  // still_fails on k drawn with `seed`; nullopt once the evaluations are spent.
  std::map<std::string, bool> memo;
  const auto fails = [&](Case k, uint64_t seed) -> std::optional<bool> {
    k.data_seed = seed;
    std::string js;
    try {
      validate(k);
      js = to_json(k);
    } catch (const CaseError&) {
      return false;
    }
    if (auto it = memo.find(js); it != memo.end()) return it->second;
    if (used >= max_evaluations) return std::nullopt;
    ++used;
    bool f = false;
    try {
      f = still_fails(k);
    } catch (const std::exception&) {
      f = false;
    }
    memo[js] = f;
    return f;
  };
  // The draws of the values: the case's own and data_seed 0 to 4, and 5 to 10 as well when the
  // case fails with fewer than two thirds of those (a failure the values decide).
  std::vector<uint64_t> draws{e.data_seed};
  const auto add_draws = [&](uint64_t from, uint64_t to) {
    for (uint64_t s = from; s < to; ++s) {
      if (s != e.data_seed) draws.push_back(s);
    }
  };
  const auto failures = [&](const Case& k) {
    int n = 0;
    for (const uint64_t seed : draws) {
      const std::optional<bool> f = seed == e.data_seed && &k == &e ? true : fails(k, seed);
      n += f && *f ? 1 : 0;
    }
    return n;
  };
  add_draws(0, kCauseDraws);
  int base = failures(e);
  if (3 * base < 2 * static_cast<int>(draws.size())) {
    add_draws(kCauseDraws, kMoreCauseDraws);
    base = failures(e);
  }
  // A failure the values decide (fewer than two thirds of the draws fail) has no cause among
  // the features whose moves change the values: those moves draw other values.
  const bool values_decide = 3 * base < 2 * static_cast<int>(draws.size());
  std::vector<std::string> causes;
  const double most_logit = max_abs_logit(e);
  for (const CanonicalFeature& f : canonical_features()) {
    const std::vector<std::string> d = f.describe(e);
    if (d.empty()) continue;
    if (f.changes_values && values_decide) continue;
    std::vector<Case> moves;
    for (Case& cand : f.toward(e)) {
      try {
        validate(cand);
        if (to_json(cand) == json || envelope.rejects(cand)) continue;
      } catch (const CaseError&) {
        continue;
      }
      moves.push_back(std::move(cand));
      if (moves.size() == kCauseMoves) break;
    }
    // A move that changes values also with q scaled back to the case's large or small logits:
    // the feature is no cause when the logit range alone keeps the failure.
    if (f.changes_values) {
      for (size_t i = 0, n = moves.size(); i < n; ++i) {
        if (auto kept = keeping_logit_range(most_logit, moves[i])) moves.push_back(*kept);
      }
    }
    if (moves.empty()) continue;
    // Needed when every move fails with less than half the draws the case fails with: a feature
    // the failure only needs by chance (the values it happens to give) leaves the rate as it is.
    bool needed = true;
    for (const Case& m : moves) {
      if (2 * failures(m) >= base) {
        needed = false;
        break;
      }
    }
    if (needed) causes.insert(causes.end(), d.begin(), d.end());
  }
  if (evaluations) *evaluations += used;
  return causes;
}

Triage triage_failure(const Case& failing, const PropertyOutcome& failure,
                      const std::vector<Backend*>& backends, const TriageOptions& options) {
  const auto t0 = Clock::now();
  const auto stopping = options.stopping;
  const auto guarded = [stopping](std::function<bool(const Case&)> pred) {
    return [stopping, pred = std::move(pred)](const Case& c) {
      return !(stopping && stopping()) && pred(c);
    };
  };
  const auto size_fails = guarded(same_failure_predicate(failure, backends));
  const auto any_fails = guarded(any_failure_predicate(failure, backends, options.properties));
  const auto direct_fails =
      guarded(direct_failure_predicate(failure, backends, options.properties));
  Triage t;
  const auto left = [&] {
    return ShrinkLimits{options.limits.max_evaluations - t.evaluations,
                        options.limits.max_seconds - since(t0)};
  };
  const auto take = [&](const ShrinkResult& r) {
    t.minimal = r.minimal;
    t.steps += r.steps;
    t.evaluations += r.evaluations;
    t.stopped_by = r.stopped_by;
  };
  const auto probe = [&](const std::function<bool(const Case&)>& pred, const Case& c) {
    if (t.evaluations >= options.limits.max_evaluations) return false;
    ++t.evaluations;
    try {
      return pred(c);
    } catch (const std::exception&) {
      return false;
    }
  };
  // A case failing only under transformations: the transformations applied to the case itself,
  // the first that fails the direct comparison (nullopt when none).
  const auto realize = [&](const Case& c) -> std::optional<Case> {
    if (t.evaluations >= options.limits.max_evaluations) return std::nullopt;
    ++t.evaluations;
    for (const PropertyOutcome& o : failures_on(c, failure, backends, options.properties, false)) {
      const PropertyInfo* p = find_property(o.property);
      if (p == nullptr || p->transformation == nullptr) continue;
      for (Case& r : realizations(c, p->id)) {
        try {
          validate(r);
        } catch (const CaseError&) {
          continue;
        }
        if (options.envelope.rejects(r)) continue;
        if (probe(direct_fails, r)) return std::move(r);
      }
    }
    return std::nullopt;
  };

  // 1. The size, the failing property alone, within half the evaluations (a failure a random
  //    transformation shows may keep every candidate failing to reproduce): the walk, the causes
  //    and the locus have the rest.
  const ShrinkLimits size_limits{options.limits.max_evaluations / 2, options.limits.max_seconds};
  take(shrink_case(failing, size_fails, size_limits, options.envelope, options.hooks));
  if (t.stopped_by == ShrinkStop::kEvaluations) t.stopped_by = ShrinkStop::kFixedPoint;
  // 2. The canonical walk: while a direct comparison fails, keeping it failing; a failure that
  //    only shows under a transformation is first turned into a direct one where the recipe can
  //    say the transformation, else walked with any property failing (and tried again after).
  std::function<bool(const Case&)> walk_pred = direct_fails;
  if (!t.stopped_by_limit()) {
    bool direct = probe(direct_fails, t.minimal);
    if (!direct) {
      if (auto r = realize(t.minimal)) {
        t.minimal = std::move(*r);
        direct = true;
      }
    }
    if (!direct && !t.stopped_by_limit()) {
      take(canonicalize_case(t.minimal, any_fails, left(), options.envelope, nullptr,
                             options.hooks));
      walk_pred = any_fails;
      if (!t.stopped_by_limit()) {
        if (auto r = realize(t.minimal)) {
          t.minimal = std::move(*r);
          direct = true;
          walk_pred = direct_fails;
        }
      }
    }
    if (direct && !t.stopped_by_limit()) {
      take(canonicalize_case(t.minimal, direct_fails, left(), options.envelope, nullptr,
                             options.hooks));
    }
  }

  if (t.stopped_by == ShrinkStop::kStopped) {
    t.failures = {failure};
    t.primary = failure;
    t.kind = failure_kind(failure);
    t.causes = cause_set(t.minimal, options.envelope);
    t.signature = group_signature(failure.backend, t.kind, t.causes);
    t.seconds = since(t0);
    return t;
  }
  // 3. Every selected property on the minimal case, where each fails.
  t.failures = failures_on(t.minimal, failure, backends, options.properties, true);
  t.reproduced = !t.failures.empty();
  t.primary = t.reproduced ? t.failures.front() : failure;
  if (!t.reproduced) t.failures.push_back(failure);
  t.kind = failure_kind(t.primary);

  // 4. The causes that hold whatever the values (a walk ends where values let it), the group.
  const int spare = options.limits.max_evaluations - t.evaluations;
  if (t.reproduced && spare > 0 && !(stopping && stopping())) {
    t.causes =
        robust_causes(t.minimal, options.envelope, walk_pred, std::min(spare, 96), &t.evaluations);
  } else {
    t.causes = cause_set(t.minimal, options.envelope);
  }
  const PropertyInfo* p = find_property(t.primary.property);
  if (p != nullptr && p->transformation != nullptr && !t.primary.run_failed) {
    t.causes.push_back(std::string("only when ") + p->transformation);
  }
  t.signature = group_signature(failure.backend, t.kind, t.causes);

  // 5. The locus: the outputs from the primary failure, the entries by removal, the inputs.
  t.locus.outputs = describe_wrong(t.minimal, t.primary.wrong);
  std::vector<int32_t> tokens;
  const int remaining = options.limits.max_evaluations - t.evaluations;
  if (remaining > 0 && !(stopping && stopping())) {
    t.locus.entries = needed_entries(t.minimal, walk_pred, std::min(remaining, kMaxEntryProbes),
                                     &t.evaluations, &tokens);
  }
  t.locus.inputs = inline_inputs(t.minimal, tokens);
  t.seconds = since(t0);
  return t;
}

}  // namespace mlafuzz

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
      if (b->traits().name == n) use.push_back(b);
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

namespace {

// An entry found needed: row, position, whether invalid, the words.
struct NeededEntry {
  int q, k;
  bool invalid;
  std::string what;
};

// "row b1,s0 extra-list entry 3": entry k of query row q of list `list` (no row in a one-row
// case).
std::string entry_place(const Case& e, int q, int k, const char* list) {
  const std::string row = e.query_rows() == 1 ? ""
                          : e.s_q == 1        ? fmt::format("row b{} ", q)
                                              : fmt::format("row b{},s{} ", q / e.s_q, q % e.s_q);
  return row + list + "entry " + std::to_string(k);
}

// e without entry (q, k) of its main list, and the words for the entry: a token (valid, or
// masked by topk_length and in the cache) becomes -1; an invalid entry of a one-row case is
// removed from the list. nullopt where the entry cannot be taken away.
std::optional<Case> without_entry(const Case& e, int q, int k, bool token, std::string* what) {
  const int32_t v = e.indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
  const int32_t len = edits::row_len(e, q);
  const bool masked = len >= 0 && k >= len;
  if (token) {
    Case cand = e;
    cand.indices[static_cast<size_t>(q)][static_cast<size_t>(k)] = -1;
    *what = fmt::format("({}{})", token_place(e, v), masked ? ", masked by topk_length" : "");
    return cand;
  }
  if (masked || e.query_rows() != 1 || e.topk <= 1) return std::nullopt;
  std::vector<int> keep;
  for (int j = 0; j < e.topk; ++j) {
    if (j != k) keep.push_back(j);
  }
  *what = fmt::format("({}, an invalid entry)", v);
  return edits::select_positions(e, keep);
}

// The words for the entries found needed, in row and position order: a run of three or more
// invalid entries of one row (spacers keeping tokens in their tiles) in one phrase.
std::vector<std::string> needed_phrases(const Case& e, std::vector<NeededEntry> found) {
  std::stable_sort(found.begin(), found.end(), [](const NeededEntry& a, const NeededEntry& b) {
    return std::tie(a.q, a.k) < std::tie(b.q, b.k);
  });
  std::vector<std::string> phrases;
  for (size_t i = 0; i < found.size();) {
    size_t j = i;
    while (found[i].invalid && j + 1 < found.size() && found[j + 1].invalid &&
           found[j + 1].q == found[i].q && found[j + 1].k == found[j].k + 1) {
      ++j;
    }
    if (j > i + 1) {
      std::string run = entry_place(e, found[i].q, found[i].k, "");
      run.replace(run.rfind("entry "), 6, "entries ");
      phrases.push_back(run + ".." + std::to_string(found[j].k) + " (invalid entries)");
    } else {
      for (size_t x = i; x <= j; ++x) phrases.push_back(found[x].what);
    }
    i = j + 1;
  }
  return phrases;
}

}  // namespace

std::string needed_entries(const Case& c, const std::function<bool(const Case&)>& still_fails,
                           int max_probes, int* evaluations, std::vector<int32_t>* needed) {
  const Case e = with_explicit_indices(c);
  const int rows = e.query_rows();
  std::vector<NeededEntry> found;
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
        std::string what;
        const std::optional<Case> cand = without_entry(e, q, k, token, &what);
        if (cand && probe(*cand)) {
          found.push_back({q, k, !in_cache && !masked, entry_place(e, q, k, "") + " " + what});
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
               entry_place(e, q, k, "extra-list ") + " (extra token " + std::to_string(v) + ")"});
        }
      }
    }
  }
  if (evaluations) *evaluations += probes;
  std::string s = found.empty() ? "no single entry is needed"
                                : "needs " + join(needed_phrases(e, std::move(found)), ", ");
  if (cut) s += " (entries probed: the first " + std::to_string(probes) + ")";
  return s;
}

namespace {

// "scales token 5 2^[-3 -2], ...": the scales of `tokens` (with none, of the valid entries'
// tokens; kMaxInlineTokens at most) as stored, exponents of 2 per tile; "" for a case that does
// not materialize.
std::string scales_text(const Case& e, const std::vector<int32_t>& tokens) {
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
  if (show.empty()) return "";
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
    return "scales " + join(ts, ", ");
  } catch (const std::exception&) {
    return "";  // no scales shown for a case that does not materialize
  }
}

// "conventions: ..." for the conventions other than the defaults; "" for the defaults.
std::string conventions_text(const mla::Conventions& c) {
  if (c.invalid_index == mla::InvalidIndexRule::kMinusOneOnly &&
      c.empty_lse == mla::EmptyRowLse::kPosInf && !c.sink_in_lse) {
    return "";
  }
  std::vector<std::string> conv;
  if (c.invalid_index != mla::InvalidIndexRule::kMinusOneOnly) {
    conv.push_back("any negative index invalid");
  }
  if (c.empty_lse != mla::EmptyRowLse::kPosInf) conv.push_back("empty-row LSE -inf");
  if (c.sink_in_lse) conv.push_back("sink in the LSE");
  return "conventions: " + join(conv, ", ");
}

}  // namespace

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
  if (std::string scales = scales_text(e, tokens); !scales.empty()) parts.push_back(scales);
  parts.push_back(fmt::format("values q {}, K {}, rope {}, data_seed {}", value_text(e.q_values),
                              value_text(e.kv_values), value_text(e.rope_values), e.data_seed));
  if (std::string conv = conventions_text(e.conventions); !conv.empty()) parts.push_back(conv);
  return "inputs: " + join(parts, "; ");
}

namespace {

// relocate's realizations: the tokens on page 1 (each valid entry's token renumbered, in order
// of first use, from the first slot of page 1), with the stride padded by 64 and 576 bytes, then
// the case itself with those strides, then the tokens on page 1 alone.
std::vector<Case> relocations(const Case& c) {
  std::vector<Case> out;
  if (!c.page_order.empty()) return out;
  const int32_t P = c.geom.page_size;
  std::optional<Case> page1;
  {
    Case r = c;
    std::map<int32_t, int32_t> to;
    for (int q = 0; q < c.query_rows(); ++q) {
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
  return out;
}

// insert-invalid's realizations: a -1 entry inserted at the front of every list, then at the
// end of its valid part.
std::vector<Case> invalid_insertions(const Case& c) {
  std::vector<Case> out;
  for (const bool front : {true, false}) {
    Case r = c;
    r.topk = c.topk + 1;
    for (int q = 0; q < c.query_rows(); ++q) {
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
  return out;
}

// permute's realization: the valid part of every list reversed.
Case reversed_lists(const Case& c) {
  Case r = c;
  for (int q = 0; q < c.query_rows(); ++q) {
    auto& row = r.indices[static_cast<size_t>(q)];
    const int32_t len = edits::row_len(c, q);
    std::reverse(row.begin(), row.begin() + (len < 0 ? c.topk : len));
  }
  return r;
}

// move-to-extra's realizations: for a case with an extra list, the two caches swapped; else the
// i-th valid entry of every list (for each i, from the last) moved into a new extra list: of the
// same tokens (same_values), or, as the property appends moved tokens to new pages of an extra
// cache of its own paging, to the first slot of page 1 of a 61-token-page cache.
std::vector<Case> extra_list_moves(const Case& c) {
  std::vector<Case> out;
  if (c.extra) {
    if (auto r = edits::swapped_caches(c)) out.push_back(std::move(*r));
    return out;
  }
  for (const bool own_pages : {false, true}) {
    for (int i = 0; i < kMaxRealizedMoves; ++i) {
      Case r = c;
      ExtraCache e;
      e.page_size = own_pages ? 61 : c.geom.page_size;
      e.num_pages = own_pages ? 2 : c.geom.num_pages;
      e.topk = 1;
      e.same_values = true;
      bool moved = false;
      for (int q = 0; q < c.query_rows(); ++q) {
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
  return out;
}

// poison's realizations: the entries topk_length masks pointed at tokens (poison points them at
// poisoned slots), then the pad bytes filled with NaN, with garbage.
std::vector<Case> poisonings(const Case& c) {
  std::vector<Case> out;
  if (c.topk_length) {
    Case r = c;
    bool changed = false;
    for (int q = 0; q < c.query_rows(); ++q) {
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
  return out;
}

// Cases that apply property p's transformation (or the part of it a recipe can say) to c
// itself, so that a failure that only showed under the transformation may fail the direct
// comparison with the oracle.
std::vector<Case> realizations(const Case& c, PropertyId p) {
  switch (p) {
    case PropertyId::kRelocate:
      return relocations(c);
    case PropertyId::kInsertInvalid:
      return invalid_insertions(c);
    case PropertyId::kPermute:
      return {reversed_lists(c)};
    case PropertyId::kMoveToExtra:
      return extra_list_moves(c);
    case PropertyId::kPoison:
      return poisonings(c);
    default:
      return {};
  }
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

// The moves feature f's cause check uses on e (same_as_e: its file): its first kCauseMoves
// valid moves inside the envelope that change the case, and, for a feature that changes values,
// each also with q scaled back to the case's large or small logits (the feature is no cause when
// the logit range alone keeps the failure).
std::vector<Case> cause_moves(const CanonicalFeature& f, const Case& e,
                              const SameCaseFile& same_as_e, const Envelope& envelope,
                              double most_logit) {
  std::vector<Case> moves;
  for (Case& cand : f.toward(e)) {
    try {
      validate(cand);
      if (same_as_e(cand) || envelope.rejects(cand)) continue;
    } catch (const CaseError&) {
      continue;
    }
    moves.push_back(std::move(cand));
    if (moves.size() == kCauseMoves) break;
  }
  if (f.changes_values) {
    for (size_t i = 0, n = moves.size(); i < n; ++i) {
      if (auto kept = keeping_logit_range(most_logit, moves[i])) moves.push_back(*kept);
    }
  }
  return moves;
}

}  // namespace

std::vector<std::string> robust_causes(const Case& c, const Envelope& envelope,
                                       const std::function<bool(const Case&)>& still_fails,
                                       int max_evaluations, int* evaluations) {
  const Case e = with_explicit_indices(c);
  const SameCaseFile same_as_e(e);
  const ReuseCaches reuse_caches;  // the moves that keep the caches share them
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
    const std::vector<Case> moves = cause_moves(f, e, same_as_e, envelope, most_logit);
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

namespace {

// One triage of `failure`: its predicates (each false once options.stopping says stop), the
// evaluations and time spent, and the Triage filled step by step.
class TriageRun {
 public:
  using Predicate = std::function<bool(const Case&)>;

  TriageRun(const PropertyOutcome& failure, const std::vector<Backend*>& backends,
            const TriageOptions& options)
      : failure_(failure),
        backends_(backends),
        options_(options),
        t0_(Clock::now()),
        size_fails_(guarded(same_failure_predicate(failure, backends))),
        any_fails_(guarded(any_failure_predicate(failure, backends, options.properties))),
        direct_fails_(guarded(direct_failure_predicate(failure, backends, options.properties))) {}

  // 1. The size, the failing property alone, within half the evaluations (a failure a random
  //    transformation shows may keep every candidate failing to reproduce): the walk, the causes
  //    and the locus have the rest.
  void shrink_size(const Case& failing) {
    const ShrinkLimits size_limits{options_.limits.max_evaluations / 2,
                                   options_.limits.max_seconds};
    take(shrink_case(failing, size_fails_, size_limits, options_.envelope, options_.hooks));
    if (t_.stopped_by == ShrinkStop::kEvaluations) t_.stopped_by = ShrinkStop::kFixedPoint;
  }

  // 2. The canonical walk: while a direct comparison fails, keeping it failing; a failure that
  //    only shows under a transformation is first turned into a direct one where the recipe can
  //    say the transformation, else walked with any property failing (and tried again after).
  //    Returns the predicate the walk kept.
  Predicate walk() {
    Predicate walk_pred = direct_fails_;
    if (t_.stopped_by_limit()) return walk_pred;
    bool direct = probe(direct_fails_, t_.minimal);
    if (!direct) {
      if (auto r = realize(t_.minimal)) {
        t_.minimal = std::move(*r);
        direct = true;
      }
    }
    if (!direct && !t_.stopped_by_limit()) {
      take(canonicalize_case(t_.minimal, any_fails_, left(), options_.envelope, nullptr,
                             options_.hooks));
      walk_pred = any_fails_;
      if (!t_.stopped_by_limit()) {
        if (auto r = realize(t_.minimal)) {
          t_.minimal = std::move(*r);
          direct = true;
          walk_pred = direct_fails_;
        }
      }
    }
    if (direct && !t_.stopped_by_limit()) {
      take(canonicalize_case(t_.minimal, direct_fails_, left(), options_.envelope, nullptr,
                             options_.hooks));
    }
    return walk_pred;
  }

  bool stopped() const { return t_.stopped_by == ShrinkStop::kStopped; }

  // The result of a triage options.stopping ended: the failure as it came, the causes of the
  // case reached.
  Triage interrupted() {
    t_.failures = {failure_};
    t_.primary = failure_;
    t_.kind = failure_kind(failure_);
    t_.causes = cause_set(t_.minimal, options_.envelope);
    t_.signature = group_signature(failure_.backend, t_.kind, t_.causes);
    t_.seconds = since(t0_);
    return t_;
  }

  // Steps 3 to 5 on the minimal case, walk_pred the predicate it was walked with.
  Triage describe(const Predicate& walk_pred) {
    // 3. Every selected property on the minimal case, where each fails.
    t_.failures = failures_on(t_.minimal, failure_, backends_, options_.properties, true);
    t_.reproduced = !t_.failures.empty();
    t_.primary = t_.reproduced ? t_.failures.front() : failure_;
    if (!t_.reproduced) t_.failures.push_back(failure_);
    t_.kind = failure_kind(t_.primary);
    find_causes(walk_pred);
    find_locus(walk_pred);
    t_.seconds = since(t0_);
    return t_;
  }

 private:
  Predicate guarded(Predicate pred) const {
    return [stopping = options_.stopping, pred = std::move(pred)](const Case& c) {
      return !(stopping && stopping()) && pred(c);
    };
  }
  bool stopping() const { return options_.stopping && options_.stopping(); }

  ShrinkLimits left() const {
    return ShrinkLimits{options_.limits.max_evaluations - t_.evaluations,
                        options_.limits.max_seconds - since(t0_)};
  }

  void take(const ShrinkResult& r) {
    t_.minimal = r.minimal;
    t_.steps += r.steps;
    t_.evaluations += r.evaluations;
    t_.stopped_by = r.stopped_by;
  }

  bool probe(const Predicate& pred, const Case& c) {
    if (t_.evaluations >= options_.limits.max_evaluations) return false;
    ++t_.evaluations;
    try {
      return pred(c);
    } catch (const std::exception&) {
      return false;
    }
  }

  // A case failing only under transformations: the transformations applied to the case itself,
  // the first that fails the direct comparison (nullopt when none).
  std::optional<Case> realize(const Case& c) {
    if (t_.evaluations >= options_.limits.max_evaluations) return std::nullopt;
    ++t_.evaluations;
    for (const PropertyOutcome& o :
         failures_on(c, failure_, backends_, options_.properties, false)) {
      const PropertyInfo* p = find_property(o.property);
      if (p == nullptr || p->transformation == nullptr) continue;
      for (Case& r : realizations(c, p->id)) {
        try {
          validate(r);
        } catch (const CaseError&) {
          continue;
        }
        if (options_.envelope.rejects(r)) continue;
        if (probe(direct_fails_, r)) return std::move(r);
      }
    }
    return std::nullopt;
  }

  // 4. The causes that hold whatever the values (a walk ends where values let it), the group.
  void find_causes(const Predicate& walk_pred) {
    const int spare = options_.limits.max_evaluations - t_.evaluations;
    if (t_.reproduced && spare > 0 && !stopping()) {
      t_.causes = robust_causes(t_.minimal, options_.envelope, walk_pred, std::min(spare, 96),
                                &t_.evaluations);
    } else {
      t_.causes = cause_set(t_.minimal, options_.envelope);
    }
    const PropertyInfo* p = find_property(t_.primary.property);
    if (p != nullptr && p->transformation != nullptr && !t_.primary.run_failed) {
      t_.causes.push_back(std::string("only when ") + p->transformation);
    }
    t_.signature = group_signature(failure_.backend, t_.kind, t_.causes);
  }

  // 5. The locus: the outputs from the primary failure, the entries by removal, the inputs.
  void find_locus(const Predicate& walk_pred) {
    t_.locus.outputs = describe_wrong(t_.minimal, t_.primary.wrong);
    std::vector<int32_t> tokens;
    const int remaining = options_.limits.max_evaluations - t_.evaluations;
    if (remaining > 0 && !stopping()) {
      t_.locus.entries = needed_entries(t_.minimal, walk_pred, std::min(remaining, kMaxEntryProbes),
                                        &t_.evaluations, &tokens);
    }
    t_.locus.inputs = inline_inputs(t_.minimal, tokens);
  }

  const PropertyOutcome& failure_;
  const std::vector<Backend*>& backends_;
  const TriageOptions& options_;
  const Clock::time_point t0_;
  const Predicate size_fails_, any_fails_, direct_fails_;
  Triage t_;
};

}  // namespace

Triage triage_failure(const Case& failing, const PropertyOutcome& failure,
                      const std::vector<Backend*>& backends, const TriageOptions& options) {
  TriageRun run(failure, backends, options);
  run.shrink_size(failing);
  const TriageRun::Predicate walk_pred = run.walk();
  if (run.stopped()) return run.interrupted();
  return run.describe(walk_pred);
}

}  // namespace mlafuzz

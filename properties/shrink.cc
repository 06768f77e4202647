// Greedy recipe shrinking (see shrink.h).
#include "properties/shrink.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "core/materialize.h"
#include "properties/case_edits.h"
#include "properties/evaluate.h"
#include "properties/triage.h"

namespace mlafuzz {
namespace {

using namespace edits;

std::vector<Case> fewer_query_tokens(const Case& c) {
  std::vector<Case> out;
  for (const auto& s : subsets(c.s_q, 4)) out.push_back(select_tokens(c, s));
  return out;
}

std::vector<Case> fewer_rows(const Case& c) {
  std::vector<Case> out;
  for (const auto& s : subsets(c.batch, 16)) out.push_back(select_rows(c, s));
  return out;
}

std::vector<Case> fewer_heads(const Case& c) {
  std::vector<Case> out;
  for (const auto& s : subsets(c.heads, 16)) out.push_back(select_heads(c, s));
  return out;
}

// Fewer tokens when the envelope constrains topk (a multiple of 64, a list): halving steps land
// outside it, so keep the first or last T positions for the smallest admissible T and the
// largest admissible T below the current length.
std::vector<Case> fewer_tokens_inside(const Case& c, const Envelope& env) {
  std::vector<Case> out;
  std::vector<int32_t> sizes;
  if (const auto lo = env.topk.nearest(1, 1, c.topk - 1)) sizes.push_back(*lo);
  const std::vector<int32_t> below = env.topk.members(1, c.topk - 1, 4096);
  if (!below.empty() && (sizes.empty() || below.back() != sizes.front())) {
    sizes.push_back(below.back());
  }
  for (const int32_t t : sizes) {
    std::vector<int> first(static_cast<size_t>(t)), last(static_cast<size_t>(t));
    std::iota(first.begin(), first.end(), 0);
    std::iota(last.begin(), last.end(), c.topk - t);
    out.push_back(select_positions(c, first));
    out.push_back(select_positions(c, last));
  }
  return out;
}

// Valid entries turned into -1 in place: chunks of the valid entries (of every row) of halving
// size, down to single entries once at most 64 are left (at most ~128 candidates). Fewer tokens
// without moving the others: removing list positions (fewer_tokens) shifts the remaining entries
// across token-tile boundaries, so a bug that needs tokens in two tiles (a softmax rescale
// forgotten across tiles) vanishes and the case stays at ~100 entries; in place, it keeps one
// token per tile.
std::vector<Case> invalidate_in_place(const Case& c) {
  std::vector<std::pair<int, int>> valid;
  for (int q = 0; q < c.query_rows(); ++q) {
    for (int k = 0; k < c.topk; ++k) {
      if (entry_valid(c, q, k)) valid.emplace_back(q, k);
    }
  }
  const int n = static_cast<int>(valid.size());
  std::vector<Case> out;
  if (n == 0) return out;
  const int smallest = std::max(1, n / 64);
  for (int chunk = std::max(1, n / 2);; chunk = std::max(smallest, chunk / 2)) {
    for (int start = 0; start < n; start += chunk) {
      Case r = c;
      for (int i = start; i < std::min(n, start + chunk); ++i) {
        const auto [b, k] = valid[static_cast<size_t>(i)];
        r.indices[static_cast<size_t>(b)][static_cast<size_t>(k)] = -1;
      }
      out.push_back(std::move(r));
    }
    if (chunk == smallest) break;
  }
  return out;
}

std::vector<Case> no_topk_length(const Case& c) {
  if (!c.topk_length) return {};
  return {without_topk_length(c)};
}

std::vector<Case> fewer_pages(const Case& c) {
  if (auto r = compact_pages(c)) return {std::move(*r)};
  return {};
}

std::vector<Case> one_if(bool change, Case r) {
  if (!change) return {};
  return {std::move(r)};
}

const ValueSpec kSmallInts{ValueDist::kSmallInt, 1.0, 0.0};

bool same_values(const ValueSpec& a, const ValueSpec& b) {
  return a.dist == b.dist && a.magnitude == b.magnitude && a.special_fraction == b.special_fraction;
}

std::vector<Case> simpler_values(const Case& c) {
  std::vector<Case> out;
  Case all = c;
  all.q_values = all.kv_values = all.rope_values = kSmallInts;
  if (!(same_values(c.q_values, kSmallInts) && same_values(c.kv_values, kSmallInts) &&
        same_values(c.rope_values, kSmallInts))) {
    out.push_back(all);
  }
  for (ValueSpec Case::*f : {&Case::q_values, &Case::kv_values, &Case::rope_values}) {
    if (!same_values(c.*f, kSmallInts)) {
      Case r = c;
      r.*f = kSmallInts;
      out.push_back(r);
    }
    if ((c.*f).special_fraction > 0) {
      Case r = c;
      (r.*f).special_fraction = 0;
      out.push_back(r);
    }
  }
  return out;
}

// Scale 1 (or, for fp32 V32 scales, 1.5: the simplest scale that is not a power of two), then
// the writer's; the convention stays (the "power-of-two scales" step resets it).
std::vector<Case> simpler_scales(const Case& c) {
  std::vector<Case> out;
  const ScaleConvention conv = c.scales.convention;
  const double mant = conv == ScaleConvention::kFp32 ? 1.5 : 1.0;
  if (!(c.scales.mode == ScaleMode::kFixed && c.scales.exp_lo == 127 &&
        c.scales.mantissa == mant)) {
    Case r = c;
    r.scales = {ScaleMode::kFixed, 127, 127, conv, mant};
    out.push_back(r);
  }
  if (c.scales.mode == ScaleMode::kRandom) {
    Case r = c;
    r.scales = {ScaleMode::kWriter, 127, 127, conv};
    out.push_back(r);
  }
  return out;
}

std::vector<Case> no_padding(const Case& c) {
  std::vector<Case> out;
  if (c.q_head_pad && c.out_head_pad) {
    Case r = c;
    r.q_head_pad = r.out_head_pad = 0;
    out.push_back(r);
  }
  if (c.q_head_pad) {
    Case r = c;
    r.q_head_pad = 0;
    out.push_back(r);
  }
  if (c.out_head_pad) {
    Case r = c;
    r.out_head_pad = 0;
    out.push_back(r);
  }
  // The batch-row gaps: all at once, then each alone.
  if (c.q_batch_pad || c.out_batch_pad || c.indices_row_pad || c.lse_row_pad) {
    Case r = c;
    r.q_batch_pad = r.out_batch_pad = r.indices_row_pad = r.lse_row_pad = 0;
    out.push_back(r);
  }
  for (int32_t Case::*pad :
       {&Case::q_batch_pad, &Case::out_batch_pad, &Case::indices_row_pad, &Case::lse_row_pad}) {
    if (c.*pad) {
      Case r = c;
      r.*pad = 0;
      out.push_back(r);
    }
  }
  return out;
}

std::vector<ShrinkStep> make_steps() {
  std::vector<ShrinkStep> s;
  s.push_back({"fewer rows", fewer_rows});
  s.push_back({"simpler extra cache", simpler_extra});
  s.push_back({"fewer query tokens", fewer_query_tokens});
  s.push_back({"fewer heads", fewer_heads});
  s.push_back({"fewer tokens", fewer_tokens});
  s.push_back({"no topk_length", no_topk_length});
  s.push_back({"fewer pages", fewer_pages});
  s.push_back({"identity page order", [](const Case& c) {
                 Case r = c;
                 r.page_order.clear();
                 return one_if(!c.page_order.empty(), r);
               }});
  s.push_back({"minimum stride", [](const Case& c) {
                 Case r = c;
                 r.geom.page_stride = 0;
                 return one_if(
                     c.geom.page_stride != 0 && c.geom.page_stride != mla::min_page_stride(c.geom),
                     r);
               }});
  s.push_back({"scale 1", simpler_scales});
  s.push_back({"power-of-two scales", [](const Case& c) {
                 Case r = c;
                 r.scales.convention = ScaleConvention::kPowerOfTwo;
                 r.scales.mantissa = 1.0;
                 return one_if(c.scales.convention != ScaleConvention::kPowerOfTwo, r);
               }});
  s.push_back({"small-integer values", simpler_values});
  s.push_back({"no sink", [](const Case& c) {
                 Case r = c;
                 r.sink.reset();
                 return one_if(c.sink.has_value(), r);
               }});
  s.push_back({"default sm_scale", [](const Case& c) {
                 Case r = c;
                 r.sm_scale.reset();
                 return one_if(c.sm_scale.has_value(), r);
               }});
  s.push_back({"default conventions", default_conventions});
  s.push_back({"zero pad fill", [](const Case& c) {
                 Case r = c;
                 r.pad_fill = Fill::kZero;
                 return one_if(c.pad_fill != Fill::kZero, r);
               }});
  s.push_back({"no padding", no_padding});  // head pads, then the batch-row gaps
  // Last: it only runs once nothing else simplifies, and each accepted candidate starts the
  // other steps again.
  s.push_back({"fewer valid tokens in place", invalidate_in_place});
  return s;
}

}  // namespace

const std::vector<ShrinkStep>& shrink_steps() {
  static const std::vector<ShrinkStep> steps = make_steps();
  return steps;
}

CaseSize case_size(const Case& c) {
  const Case e = with_explicit_indices(c);
  CaseSize s;
  s.rows = e.batch;
  s.heads = e.heads;
  s.topk = e.topk;
  s.pages = e.geom.num_pages;
  for (int32_t q = 0; q < e.query_rows(); ++q) {
    for (int32_t k = 0; k < e.topk; ++k) s.valid_tokens += entry_valid(e, q, k) ? 1 : 0;
  }
  s.s_q = e.s_q;
  if (e.extra) {
    s.extra_topk = e.extra->topk;
    const int32_t* len = e.extra->topk_length ? e.extra->topk_length->data() : nullptr;
    for (int32_t q = 0; q < e.query_rows(); ++q) {
      const auto& row = e.extra->indices[static_cast<size_t>(q)];
      for (int32_t k = 0; k < e.extra->topk; ++k) {
        s.valid_tokens +=
            mla::index_valid_in(row[static_cast<size_t>(k)], k, len ? len[q / e.s_q] : -1,
                                e.conventions, mla::num_slots(e.extra_geom()))
                ? 1
                : 0;
      }
    }
  }
  return s;
}

const char* shrink_stop_name(ShrinkStop s) {
  switch (s) {
    case ShrinkStop::kFixedPoint:
      return "fixed point";
    case ShrinkStop::kEvaluations:
      return "evaluations";
    case ShrinkStop::kSeconds:
      return "seconds";
    case ShrinkStop::kStopped:
      return "stopped";
  }
  return "?";
}

ShrinkResult greedy_shrink(const Case& start, const std::vector<ShrinkStep>& steps,
                           const std::function<bool(const Case&)>& still_fails,
                           const ShrinkLimits& limits, const Envelope& envelope,
                           std::set<std::string>* rejected, const ShrinkHooks& hooks) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // Most candidates keep the case's caches (fewer rows, heads or entries, other q): they share
  // them instead of drawing them again.
  const ReuseCaches reuse_caches;
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  ShrinkResult res;
  // Checked before each evaluation: the count first, so that a shrink both limits would stop
  // names the deterministic one.
  auto limit_reached = [&]() -> std::optional<ShrinkStop> {
    if (res.evaluations >= limits.max_evaluations) return ShrinkStop::kEvaluations;
    if (elapsed() > limits.max_seconds) return ShrinkStop::kSeconds;
    if (hooks.stop && hooks.stop()) return ShrinkStop::kStopped;
    return std::nullopt;
  };
  Case cur = with_explicit_indices(start);
  std::string cur_json = to_json(cur);
  // With a memo, the cases already visited too: a set of moves that could lead back to one of
  // them cannot cycle.
  std::set<std::string> visited{cur_json};
  bool progress = true;
  while (progress && !res.budget_exhausted()) {
    progress = false;
    for (const auto& step : steps) {
      for (Case& cand : step.candidates(cur)) {
        std::string js;
        try {
          validate(cand);
          js = to_json(cand);
        } catch (const CaseError&) {
          continue;  // a step made an invalid recipe (e.g. a constraint it does not know)
        }
        if (js == cur_json) continue;
        if (rejected != nullptr && (rejected->count(js) != 0 || visited.count(js) != 0)) continue;
        // Never leave the envelope the case was generated in (the backends' and the campaign's):
        // a candidate outside it would shrink a failure into "not applicable".
        if (envelope.rejects(cand)) continue;
        if (const auto stop = limit_reached()) {
          res.stopped_by = *stop;
          break;
        }
        ++res.evaluations;
        bool fails = false;
        try {
          fails = still_fails(cand);
        } catch (const std::exception&) {
          fails = false;  // a candidate the harness cannot evaluate is not a simplification
        }
        if (fails) {
          if (rejected != nullptr) visited.insert(js);
          cur = std::move(cand);
          cur_json = std::move(js);
          ++res.steps;
          progress = true;
          if (hooks.on_step) hooks.on_step(cur);
          break;
        }
        if (rejected != nullptr) rejected->insert(std::move(js));
      }
      if (res.budget_exhausted()) break;
    }
  }
  res.minimal = cur;
  res.seconds = elapsed();
  return res;
}

ShrinkResult shrink_case(const Case& failing, const std::function<bool(const Case&)>& still_fails,
                         const ShrinkLimits& limits, const Envelope& envelope,
                         const ShrinkHooks& hooks) {
  std::vector<ShrinkStep> steps = shrink_steps();
  if (envelope.topk.constrained()) {
    steps.push_back({"fewer tokens inside the envelope",
                     [&envelope](const Case& c) { return fewer_tokens_inside(c, envelope); }});
  }
  return greedy_shrink(failing, steps, still_fails, limits, envelope, nullptr, hooks);
}

std::function<bool(const Case&)> same_failure_predicate(const PropertyOutcome& failure,
                                                        const std::vector<Backend*>& backends,
                                                        PropertyOutcome* last_failure) {
  const std::vector<Backend*> use = failure_backends(failure.backend, backends);
  const std::string prop = failure.property, backend = failure.backend;
  return [use, prop, backend, last_failure](const Case& c) {
    const CaseEvaluation ev = evaluate_case(c, use, {prop});
    const auto it = std::find_if(ev.outcomes.begin(), ev.outcomes.end(), [&](const auto& o) {
      return o.applicable && !o.passed && o.backend == backend && o.property == prop;
    });
    if (it == ev.outcomes.end()) return false;
    if (last_failure) *last_failure = *it;
    return true;
  };
}

}  // namespace mlafuzz

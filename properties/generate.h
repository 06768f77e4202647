// Generating case recipes: (seed, case_index, GenConfig) -> Case, the same on every machine and
// compiler. The generators themselves (RapidCheck, dependent steps) are properties/generators.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/case.h"
#include "core/envelope.h"

namespace mlafuzz {

// The envelope of generated cases. Defaults: everything on, production sizes reachable but rare.
// Every generated case stays inside every built-in backend's envelope (nope <= 512, rope <= 64
// and a multiple of 16, nope a multiple of the scale tile), so `unsupported` only fires for
// plugins with a narrower envelope.
struct GenConfig {
  int max_batch = 32;   // B in [1, max_batch]; small (<= 4) most of the time
  int max_heads = 128;  // H in [1, max_heads]; small most of the time, 32/64/128 sometimes
  int max_topk = 512;   // topk in [1, max_topk]
  int max_pages = 64;   // logical pages in the cache
  int max_page_size = 256;
  // The production decode (docs/SPEC.md section 8): query tokens per batch row in [1, max_s_q]
  // (1 most of the time) and an extra cache (about a quarter of the cases) when extra_cache.
  int max_s_q = 4;
  bool extra_cache = true;
  int max_extra_topk = 1024;
  // Work budget of one case, B * s_q * H * (topk + extra_topk): production shapes shrink B to
  // stay within it (a case stays a fraction of a second on the CPU backends).
  int64_t max_work = int64_t{1} << 20;
  // Probability that a case uses a production shape: FlashMLA's MODEL1 decode configurations
  // (H 64 or 128, s_q 1-4, main topk 128 over P = 256, with an extra cache of topk 512 over
  // P = 64 or 1024 over P = 2, or without one; B up to max_batch, a few B = 74, within
  // max_work; MODEL1 448 + 64); clipped to the envelope above.
  double production_probability = 0.05;
  bool model1 = true;  // layouts allowed (at least one must be true)
  bool v32 = true;
  bool other_dims = true;      // nope/rope dims other than the layout's production ones
  bool sinks = true;           // attention sinks (finite, +inf, -inf)
  bool special_values = true;  // special values (0, -0, largest finite, subnormals) in q, K, rope
  bool non_default_conventions = true;  // SGLang/vLLM conventions as well as FlashMLA's
  bool poison_fills = true;             // pad_fill NaN/garbage (q/out head padding, stride padding)
  // Batch-row gaps: index rows longer than topk, LSE rows longer than H, q and out rows beyond
  // H * head stride (every stride of the plugin ABI varied, not only the head strides).
  bool row_pads = true;
  // What the selected backends accept, intersected with `mlafuzz fuzz --envelope` (envelope.h).
  // Each drawn dimension is constrained to it (snapped to the nearest admissible value, so that
  // the edge classes stay reachable inside it), never rejection-sampled; generate_case throws
  // std::invalid_argument when it admits no case (Envelope::empty_reason).
  Envelope envelope;
  // Generator families to draw from (weights fixed in generators.cc); empty = all. Names as
  // all_generator_families() lists them: "general" (dependent random recipe), "edge" (one
  // targeted edge class per case: empty rows, all invalid, topk_length 0, +-inf sinks, page
  // boundaries, large logits, ties, extreme scales, and the extra cache's: an extra list all
  // invalid, extra_topk_length 0, one token in both lists, one cache empty and the other not,
  // extra pages of 1-3 tokens), "production" (production shapes only).
  std::vector<std::string> families;
};

std::vector<std::string> all_generator_families();

// Deterministic: the same (seed, case_index, cfg) gives the same Case on every machine.
// `tags` (may be null) receives classification strings, RC_TAG-like, for distribution reports:
// "layout=model1", "page_size=61", "page_size=pow2", "stride=padded", "page_order=shuffled",
// "has_invalid", "all_invalid", "topk_length=0", "topk%64!=0", "duplicates", "sink=+inf",
// "values=large", "scales=random", "family=edge", "shape=production", ...
Case generate_case(uint64_t seed, uint64_t case_index, const GenConfig& cfg,
                   std::vector<std::string>* tags);

}  // namespace mlafuzz

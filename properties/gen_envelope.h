// The generator's envelope constraint (GenConfig::envelope), kept apart from the generator's
// distributions (generators.cc): each function takes a value a generator step drew and returns
// the admissible value nearest to it. Snapping instead of rejecting keeps the distribution's
// weights on the nearest admissible values, so that the edge classes (tiny pages, tile edges,
// empty rows, infinite sinks, ...) stay reachable inside an envelope whenever it admits them, and
// no case is wasted. Every function throws std::invalid_argument naming the dimension when the
// envelope admits no value in the generator's range (generate_case checks empty_reason first).
#pragma once

#include <cstdint>
#include <vector>

#include "core/case.h"
#include "core/envelope.h"

namespace mlafuzz::genv {

// The layouts (0 MODEL1, 1 V32) the generator may draw: enabled in the config and admitted with
// their scale tile (64, 128) and some nope dim (a multiple of the tile, <= 512).
std::vector<int> layouts(const Envelope& e, bool model1, bool v32);
// Nope dim for `layout` nearest to `drawn` (a multiple of the layout's tile in [tile, 512]).
int32_t nope_dim(const Envelope& e, mla::Layout layout, int32_t drawn);
// Rope dim in [0, 64] nearest to `drawn`.
int32_t rope_dim(const Envelope& e, int32_t drawn);
// A size (B, H, topk, page size) in [1, hi] nearest to `drawn`.
int32_t dim(const IntSet& s, int32_t drawn, int32_t hi, const char* what);
// The page stride for a drawn one (0: the layout's minimum): the smallest multiple of the
// envelope's page_stride_multiple at or above it (0 again when the minimum is one).
int64_t page_stride(const Envelope& e, const mla::CacheGeometry& g, int64_t drawn);
// Conventions the envelope allows: a drawn value that is not allowed becomes the other one.
mla::InvalidIndexRule invalid_index(const Envelope& e, mla::InvalidIndexRule drawn);
void conventions(const Envelope& e, mla::Conventions& c);
// The V32 scale convention the envelope allows: a drawn one that is not becomes the other.
ScaleConvention v32_scales(const Envelope& e, ScaleConvention drawn);
// Sink kind drawn (0 none, 1 finite, 2 with +-inf) -> the nearest the envelope takes.
int sink_kind(const Envelope& e, int drawn);
// Whether a topk_length list may be generated.
bool topk_length(const Envelope& e);
// q/out head padding: zero where refused.
void head_padding(const Envelope& e, Case& c);
// Batch-row and index/LSE row gaps: zero where refused (kFeatureRowPad).
void row_padding(const Envelope& e, Case& c);

}  // namespace mlafuzz::genv

// Edits of a recipe with explicit index lists that keep it consistent (index lists, lengths,
// sinks, q sources, page counts): the moves of shrinking (shrink.cc) and of the canonical walk
// (canonical.cc). Each returns a new case; none validates (the callers do).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/case.h"

namespace mlafuzz::edits {

// topk_length of the batch row of index list (query row) q = b * s_q + s; -1 without one.
int32_t row_len(const Case& c, int q);
// Whether entry k of main list q takes part (its index and the row's length).
bool entry_valid(const Case& c, int q, int k);
// Whether entry k of extra list q takes part.
bool extra_entry_valid(const Case& c, int q, int k);

std::vector<int> all_of(int n);
// Items to keep when shrinking n rows (or heads): the two halves, then single items (at most
// `cap` of them).
std::vector<std::vector<int>> subsets(int n, int cap);
// Every item but one, for n <= cap (the last step to the smallest count that still fails).
std::vector<std::vector<int>> all_but_one(int n, int cap);

// Keeps batch rows `rows`, query tokens `tokens`, heads `heads` or main-list positions `pos`
// (sorted), in that order: kept rows and heads keep their q values (Case::q_source), lists,
// lengths and sinks; topk_length keeps the same entries.
Case select_rows(const Case& c, const std::vector<int>& rows);
Case select_tokens(const Case& c, const std::vector<int>& tokens);
Case select_heads(const Case& c, const std::vector<int>& heads);
Case select_positions(const Case& c, const std::vector<int>& pos);

// The extra cache gone, or simpler: no extra topk_length, half of each extra list, identity
// page order (tokens on their logical pages, or moved to their physical ones), minimum stride,
// its own values.
std::vector<Case> simpler_extra(const Case& c);
// Fewer main-list positions: those invalid in every row dropped, the first or second half,
// and (topk <= 32) each single position.
std::vector<Case> fewer_tokens(const Case& c);

// The main and the extra cache exchanged in the recipe (paging, page order, lists, lengths);
// tokens draw the values of the cache they are now in. nullopt without an extra cache.
std::optional<Case> swapped_caches(const Case& c);

// Index v of a cache of `slots` slots that lies past its end, moved the same distance past the
// end of a cache of `new_slots` slots (clamped to int32).
int32_t past_end(int32_t v, int64_t slots, int64_t new_slots);

// The conventions made the defaults one field at a time (a failure may need one of them); out of
// range's invalid entries (negatives, entries past the cache) become -1.
std::vector<Case> default_conventions(const Case& c);

// topk_length removed; the entries it masked become -1, so the same tokens stay selected.
Case without_topk_length(const Case& c);

// The pages no entry uses dropped (the used ones renumbered, keeping their relative physical
// order); entries past the cache keep their distance past its end. nullopt when every page is
// used.
std::optional<Case> compact_pages(const Case& c);

// Bytes of a geometry's page stride beyond its layout's minimum (0 for the minimum).
int64_t stride_padding(const mla::CacheGeometry& g);
// The main geometry's layout and dims, or page size, changed: every page stride (main and
// extra) keeps its padding beyond the new minimum.
Case with_dims(const Case& c, mla::Layout layout, int32_t nope, int32_t rope);
// Page size P: every entry keeps its page and its slot (clamped to the new page; the last slot
// of a page stays the last), the page count covers the largest, the order is the identity.
// nullopt when the case has a page order (that move comes first).
std::optional<Case> with_page_size(const Case& c, int32_t page_size);

// The smallest logical token no entry of the main lists uses (of the cache's slots); -1 when
// every slot is used.
int32_t unused_token(const Case& c);

}  // namespace mlafuzz::edits

// The building blocks of the properties (evaluate.h runs them): transformations of a
// MaterializedCase whose effect on a correct kernel's output is known exactly (bitwise) or within
// the tolerance model, and the bitwise comparison of two runs.
//
// Every transformation works on buffers, not on the recipe: poisoned bytes and relocated pages
// cannot be expressed as a recipe. The returned case's `recipe` keeps the original's fields with
// batch/heads/topk updated; backends must read the buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"

namespace mlafuzz {

// Number of poison variants (fills) poison_case knows.
inline constexpr int kPoisonVariants = 4;
// Variant v: 0 every unread byte 0xff (NaN as e4m3, ue8m0, bf16 and fp32 alike); 1 random bytes
// (CounterRng Stream::kPoison); 2 the byte pair 80 7f (bf16 +inf, e4m3 -0 and NaN); 3 0x7f (e4m3
// NaN, bf16 3.4e38). Poisoned: every cache byte no valid selected token uses (unselected tokens,
// tokens masked by -1 or topk_length, page-stride padding, unused MODEL1 scale bytes), q
// elements beyond d_qk, and index entries masked by topk_length (replaced by random in-range
// slots, whose bytes are poisoned too, so a kernel that ignores topk_length reads poison).
MaterializedCase poison_case(const MaterializedCase& m, int variant);

// Cache bytes some valid selected token uses (1) or not (0): [cache size]; the extra cache's
// ([extra cache size], empty without one). poison_case poisons the unused bytes of both caches.
std::vector<uint8_t> used_cache_bytes(const MaterializedCase& m);
std::vector<uint8_t> used_extra_cache_bytes(const MaterializedCase& m);

// Another physical page order (a random permutation, possibly with extra unused pages) and
// another page stride (minimum or padded); indices remapped; freed bytes random garbage.
// stride_multiple > 1 rounds the new stride up to a multiple of it (the backend's envelope).
MaterializedCase relocate_pages(const MaterializedCase& m, uint64_t seed,
                                int64_t stride_multiple = 0);

// Batch row b alone (B = 1, all its s_q query tokens).
MaterializedCase batch_alone(const MaterializedCase& m, int b);

// Query token s of batch row b alone (B = 1, s_q = 1; its lists and the row's lengths).
MaterializedCase query_alone(const MaterializedCase& m, int b, int s);

// docs/SPEC.md section 8: up to `count` valid entries of every query token's main list (within the
// row's topk_length) moved into its extra list: the main entry becomes -1, a copy of the token's
// bytes goes to new pages appended to the extra cache (created when the case has none) and its
// slot is inserted into the extra list within the extra topk_length prefix, which grows by
// count (tokens with fewer valid entries get -1 there). extra_topk grows by count. The
// mathematical result is unchanged.
MaterializedCase move_to_extra(const MaterializedCase& m, uint64_t seed, int count);
// The extra list length (extra_topk) of move_to_extra(m, seed, count)'s result.
int move_to_extra_topk(const MaterializedCase& m, int count);

// The main and the extra cache exchanged (geometry, bytes, lists, lengths); unchanged without
// an extra cache. The mathematical result is unchanged.
MaterializedCase swap_caches(const MaterializedCase& m);

// Head h alone (H = 1): q of head h for every row and token, sink[h].
MaterializedCase head_alone(const MaterializedCase& m, int h);

// Each row's index list randomly permuted (entries before and after topk_length separately, so
// the same entries stay selected).
MaterializedCase permute_indices(const MaterializedCase& m, uint64_t seed);

// `count` -1 entries inserted into every row at random positions (within the topk_length prefix
// when there is one, which grows by `count`). topk grows by `count`.
MaterializedCase insert_invalid(const MaterializedCase& m, uint64_t seed, int count);

// Bitwise equality of two runs of the same shape: raw bf16 outputs (guard bands included) and
// raw lse when both have them, otherwise the float64 out/lse bit patterns; NaNs of any sign or
// payload count as equal (the message of a difference says so). On a difference,
// `where` receives the first differing element with both values in full and their distance:
// "out[b=0,h=2,d=5] 1 (bf16 0x3f80) vs 1.0078125 (bf16 0x3f81), 1 ulp (bf16)".
bool bitwise_equal(const MaterializedCase& m, const RunResult& a, const RunResult& b,
                   std::string* where, int* wb = nullptr, int* wh = nullptr, int* wd = nullptr);

// Bitwise equality of (b_whole, h_whole) of `whole` against flat row `part_row` (b * H + h of
// the part's shape) of a single-row or single-head run `part` (logical outputs, double bit
// patterns: bf16 values widen exactly; NaNs of any sign or payload equal).
bool rows_bitwise_equal(const RunResult& whole, int32_t heads, int32_t d_v, int b_whole,
                        int h_whole, const RunResult& part, int part_row, std::string* where);

}  // namespace mlafuzz

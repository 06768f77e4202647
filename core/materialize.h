// Recipe -> exact host input buffers.
//
// Bit-identical on every machine and compiler: all randomness comes from the counter-based
// generator in rng.h (no std:: distributions), and every conversion is an integer-exact routine
// from mla/fp_formats.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/case.h"
#include "core/rng.h"
#include "core/shared_arena.h"
#include "mla/mla_params.h"

namespace mlafuzz {

// The special-value decisions of q, nope and rope are kept apart inside Stream::kSpecial.
enum SpecialTag : uint64_t { kTagQ = 0, kTagNope = 1, kTagRope = 2 };
// Element `element` of a buffer drawn per `s` (its own counter stream: random access), and
// elements [first, first + count) of it as floats: the same bits as draw_value one by one,
// computed 32 streams side by side (the normal draws vectorize: drawing the values
// is the largest step of a case's materialization). Exposed for the tests.
double draw_value(const ValueSpec& s, uint64_t seed, Stream stream, uint64_t element,
                  SpecialTag tag);
void draw_values(const ValueSpec& s, uint64_t seed, Stream stream, uint64_t first, int32_t count,
                 SpecialTag tag, float* out);

// out[i] = mla::float_to_e4m3_sat(v[i] / mla::ue8m0_to_float(code_e)) for i < n, the same bytes
// (tested for every code_e class and float boundary), without a branch per element: the
// multiplication by the exact reciprocal of the power of two rounds as the division does, and
// the rounding to 3 mantissa bits is integer arithmetic on the float's bits.
void encode_e4m3(const float* v, int32_t n, uint8_t code_e, uint8_t* out);
// out[i] = mla::float_to_e4m3_sat(v[i] / scale) for i < n and any scale (V32's fp32 scales), the
// same bytes by the same integer arithmetic.
void encode_e4m3_scaled(const float* v, int32_t n, float scale, uint8_t* out);

// Worker-side names for the bytes of a case's input vectors (harness/campaign/worker.cc): a
// nonzero tag i names the bytes of input i (0 q, 1 cache, 2 indices, 3 topk_length, 4 sink,
// 5 extra cache, 6 extra indices, 7 extra topk_length) as they were decoded, and two cases of
// a batch with the same tag hold the very same vector (lent). A backend that keeps device
// copies of inputs (the CUDA backends' ResidentInput) may take equal tags for equal bytes
// without comparing them. A copy or a move yields no tags (all 0), so a transformed copy of a
// case (a property variant, an edited case) never carries a stale name.
struct InputTags {
  uint64_t tag[8] = {};
  InputTags() = default;
  InputTags(const InputTags&) {}
  InputTags(InputTags&&) noexcept {}
  InputTags& operator=(const InputTags&) {
    clear();
    return *this;
  }
  InputTags& operator=(InputTags&&) noexcept {
    clear();
    return *this;
  }
  void clear() {
    for (uint64_t& t : tag) t = 0;
  }
};

// A case's paged cache bytes, shared by a case and its copies until one of them writes
// (copy on write). Most property variants change index lists, heads or rows and keep the
// cache's bytes: they read the case's buffer instead of copying megabytes each. Reads are const
// (data(), size(), operator[], vec()); a write goes through mut(), which first gives this
// holder its own copy when another holder shares the buffer (the copy is a SharedVector copy,
// so it inherits the buffer's arena identity: core/shared_arena.h). Like any object, a holder is
// not written (mut, replace, clear, swap) by one thread while another uses it; holders that
// share a buffer may be used from different threads.
class CacheBytes {
 public:
  using Vector = SharedVector<uint8_t>;

  const uint8_t* data() const { return p_ ? p_->data() : nullptr; }
  size_t size() const { return p_ ? p_->size() : 0; }
  bool empty() const { return size() == 0; }
  const uint8_t& operator[](size_t i) const { return (*p_)[i]; }
  Vector::const_iterator begin() const { return vec().begin(); }
  Vector::const_iterator end() const { return vec().end(); }
  const Vector& vec() const;
  // The bytes to write: this holder's own buffer (copied first when it is shared).
  Vector& mut();
  // A new, empty buffer in place of the held one, for bytes written from scratch (the held
  // buffer stays with the holders that share it, and is never copied).
  Vector& replace() {
    p_ = std::make_shared<Vector>();
    return *p_;
  }
  // Drops this holder's reference (the bytes stay with the holders that share them).
  void clear() { p_.reset(); }
  void swap(CacheBytes& o) noexcept { p_.swap(o.p_); }
  // Equal bytes (shared or not).
  friend bool operator==(const CacheBytes& a, const CacheBytes& b) { return a.vec() == b.vec(); }
  // Whether both hold the very same buffer (not only equal bytes).
  bool shares(const CacheBytes& o) const { return p_ != nullptr && p_ == o.p_; }

 private:
  std::shared_ptr<Vector> p_;
};

struct MaterializedCase {
  Case recipe;              // with indices made explicit (logical positions) and stride resolved
  mla::CacheGeometry geom;  // page_stride resolved
  int32_t batch = 0, heads = 0, topk = 0;
  float sm_scale = 0;     // fp32 value the kernels receive
  double sm_scale64 = 0;  // the same value widened (the oracle uses this, not the recipe's)
  mla::Conventions conv;

  // Query tokens per batch row (docs/SPEC.md section 8): q, out and lse are [B, s_q, H, ...] and
  // the index lists [B, s_q, topk]. Every *_token_stride steps over one query token of a row, every
  // *_batch_stride over a batch row (all its tokens plus the row's pad). A "query row"
  // r = b * s_q + s is one (batch row, token) pair; the logical outputs of RunResult are
  // [B * s_q, H, d_v]. Every buffer is strided as the kernels see it; the gaps are filled per
  // the recipe's pad_fill (and poisoned by the poison property). Every stride must be set (>= its
  // minimum). q and the cache live in the shared arena (core/shared_arena.h) when it is
  // on, so that worker processes read them without a copy.
  int32_t s_q = 1;

  SharedVector<uint16_t> q;          // [B, q_batch_stride] bf16 bits, tokens and heads strided
  int64_t q_head_stride = 0;         // d_qk + q_head_pad
  int64_t q_token_stride = 0;        // H * q_head_stride
  int64_t q_batch_stride = 0;        // s_q * q_token_stride + q_batch_pad
  CacheBytes cache;                  // [num_pages * page_stride] exact layout bytes
  std::vector<int32_t> indices;      // [B, indices_batch_stride] physical global slots
  int64_t indices_token_stride = 0;  // topk
  int64_t indices_batch_stride = 0;  // s_q * topk + indices_row_pad
  std::vector<int32_t> topk_length;  // [B] or empty (shared by a row's s_q tokens)
  std::vector<float> sink;           // [H] or empty
  int64_t out_head_stride = 0;       // d_v + out_head_pad
  int64_t out_token_stride = 0;      // H * out_head_stride
  int64_t out_batch_stride = 0;      // s_q * out_token_stride + out_batch_pad
  int64_t lse_token_stride = 0;      // H
  int64_t lse_batch_stride = 0;      // s_q * H + lse_row_pad

  // The extra cache (docs/SPEC.md section 8), read in the same softmax: the main layout and dims,
  // its own paging, bytes (padding filled per the recipe), index lists and lengths.
  bool has_extra = false;
  mla::CacheGeometry extra_geom;  // page_stride resolved
  int32_t extra_topk = 0;
  CacheBytes extra_cache;                  // [extra num_pages * page_stride]
  std::vector<int32_t> extra_indices;      // [B, extra_indices_batch_stride] physical slots
  int64_t extra_indices_token_stride = 0;  // extra_topk
  int64_t extra_indices_batch_stride = 0;  // s_q * extra_topk + indices_row_pad
  std::vector<int32_t> extra_topk_length;  // [B] or empty

  // A launch parameter, not input data (never in a case file): the split count a split-KV
  // backend (Backend::splits_kv()) uses for every row instead of its own setting. 0: its own;
  // n > 0: n splits (at most the row's tiles); -1: one split per tile (mla::kSplitMax). The
  // `split-agree` property sets it; other backends ignore it.
  int32_t split_override = 0;

  // Set by a worker only (see InputTags); never in a case file, never copied.
  InputTags input_tags;

  int32_t d_qk() const { return mla::d_qk(geom); }
  int32_t d_v() const { return mla::d_v(geom); }
  int32_t query_rows() const { return batch * s_q; }
  // Entry k of the main (extra) list of token s of batch row b; q of (b, s, h): the strided
  // addressing in one place.
  int32_t index_at(int64_t b, int64_t s, int64_t k) const {
    return indices[static_cast<size_t>(b * indices_batch_stride + s * indices_token_stride + k)];
  }
  int32_t extra_index_at(int64_t b, int64_t s, int64_t k) const {
    return extra_indices[static_cast<size_t>(b * extra_indices_batch_stride +
                                             s * extra_indices_token_stride + k)];
  }
  const uint16_t* q_row(int64_t b, int64_t s, int64_t h) const {
    return q.data() + b * q_batch_stride + s * q_token_stride + h * q_head_stride;
  }
  // Sets every token and batch stride to the contiguous layout of the current shapes (no batch
  // pads; for hand-built and edited cases); the head strides are kept and no buffer is resized.
  void set_contiguous_strides();

  // Params pointing at this struct's host buffers (out and lse left null).
  mla::DecodeParams host_params() const;
};

// Validates then materializes. Throws CaseError on an invalid recipe.
MaterializedCase materialize(const Case& c);
// While one is alive on a thread, materialize() on that thread keeps the caches of the case it
// last materialized and gives them to a case whose caches are made of the same recipe (the
// geometries, page orders, kv and rope values, scales, fill, conventions and seed of both
// caches) instead of drawing them again: shared, as property variants share a case's (CacheBytes
// copies before a write). A shrink's candidates mostly change rows, heads, lists or q, not the
// caches. Scopes nest; the caches are let go when the outermost one ends.
class ReuseCaches {
 public:
  ReuseCaches();
  ~ReuseCaches();
  ReuseCaches(const ReuseCaches&) = delete;
  ReuseCaches& operator=(const ReuseCaches&) = delete;
};

// materialize(c) with only the cache tokens that c's index lists name (valid or not, counted or
// past a topk_length) quantized and written, the others left as the padding fill: the same q, the
// same indices and the same bytes at every named token, for work that reads nothing else (the
// oracle's logits in the canonical walk's largest |logit|, properties/canonical.h). Not for a
// kernel: a faulty one may read any token.
MaterializedCase materialize_named_tokens(const Case& c);

// Makes the index lists of a recipe explicit (as logical positions), resolving index_spec.
// Idempotent; used by shrinking so that every step edits explicit data.
Case with_explicit_indices(const Case& c);

// FNV-1a 64 over every input buffer and the scalar fields, for golden-hash tests and reports.
uint64_t content_hash(const MaterializedCase& m);

// ---- The pieces of materialization, exposed so that tests can check each independently ----

// Logical index lists [batch * s_q][topk] generated from the recipe's index_spec (the explicit
// lists when the recipe has them). Deterministic: CounterRng(data_seed, kIndices, r) per list
// r = b * s_q + s. generate_extra_indices: the extra cache's lists (stream kExtraIndices).
std::vector<std::vector<int32_t>> generate_indices(const Case& c);
std::vector<std::vector<int32_t>> generate_extra_indices(const Case& c);

// Physical global slot of logical token position t: page_order[t / P] * P + t % P (identity
// when page_order is empty). Entries outside [0, slots) (invalid ones) are returned unchanged.
int64_t physical_slot(const Case& c, int64_t logical);
int64_t extra_physical_slot(const Case& c, int64_t logical);  // through extra.page_order

// The value element d of logical token t holds before quantization (d < nope_dim: drawn from
// kv_values; otherwise rope element d - nope_dim drawn from rope_values, before bf16 rounding).
// Values belong to logical tokens, so relocating pages never changes them.
float kv_source_value(const Case& c, int64_t logical_token, int32_t d);
// The same for logical token t of the extra cache (main token t's value with same_values).
float extra_kv_source_value(const Case& c, int64_t logical_token, int32_t d);
// q[b][s][h][d] before bf16 rounding (s_q = 1: element (b, h, d) as in version 1).
float q_source_value(const Case& c, int32_t b, int32_t s, int32_t h, int32_t d);
inline float q_source_value(const Case& c, int32_t b, int32_t h, int32_t d) {
  return q_source_value(c, b, 0, h, d);
}

// V32 fp32 scales (ScaleSpec::convention kFp32): the writer's scale of a tile whose largest
// magnitude is amax, max(fp32(amax / 448), FLT_MIN) as vLLM's concat_and_cache_ds_mla stores
// it; and the random mode's scale of a tile with exponent byte e: a mantissa drawn from r among
// the edge values that separate readers (a power of two, 1.5, just below and just above a power
// of two, mantissas whose bf16 or fp16 rounding differs from the fp32 value, random bits) times
// 2^(e - 127); e = 0 draws a subnormal float32.
float v32_writer_scale(float amax);
float v32_fp32_scale(int e, CounterRng& r);

// Bytes of 0xff after a cache (its buffer holds cache_bytes(g) + these) when entries past the
// cache are invalid entries (InvalidIndexRule::kOutOfRange): two page strides, so that a read
// through num_slots .. num_slots + page_size meets NaN, and farther ones fault. 0 otherwise.
int64_t cache_guard_bytes(const mla::CacheGeometry& g, const mla::Conventions& conv);

// The ue8m0 exponent the production writer stores for a tile whose largest magnitude is amax:
// 127 + ceil(log2(amax / 448)) computed exactly, clamped to [1, 254]; 127 when amax == 0.
int writer_exponent(float amax);

}  // namespace mlafuzz

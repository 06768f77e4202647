// A sparse-decode case as a small recipe: shapes, layout, index lists, conventions and how the
// values are drawn. Materialization (materialize.h) turns it into exact input bytes.
//
// Recipes are saved as versioned, human-readable JSON (format documented in
// docs/case-format.md). Loading validates everything and names the offending field on error.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mla/mla_params.h"

namespace mlafuzz {

// Version 2 added the production decode of DeepSeek-V4-Flash (docs/SPEC.md section 8): `s_q` query
// tokens per batch row and the `extra` cache, and the batch-row pads (q_batch_pad,
// out_batch_pad, indices_row_pad, lse_row_pad). Version-1 files load unchanged and mean the same
// (every version-2 field absent: s_q = 1, no extra cache, pads 0).
// Within version 2, optional fields whose absence means what every earlier file meant may be
// added without a bump when no existing field changes its layout or meaning, and they are
// written only when set: scales.convention and scales.mantissa (absent: power-of-two scales),
// the invalid_index name "out_of_range". A file without them is written byte for byte as
// before and loads in every version-2 build; one that uses them fails in an older build with
// an error naming the field.
inline constexpr int kCaseFormatVersion = 2;
inline constexpr int kOldestCaseFormatVersion = 1;

// Corpus entries (properties/corpus.h) wrap a case; load_case reads their "case". Version 2: the
// finding is a group (properties/corpus.h, Finding); version-1 entries load unchanged.
inline constexpr int kCorpusFormatVersion = 2;
inline constexpr int kOldestCorpusFormatVersion = 1;

// Raised for malformed or inconsistent input. `field` is a JSON path such as "indices[2][5]".
class CaseError : public std::runtime_error {
 public:
  CaseError(std::string field, const std::string& reason)
      : std::runtime_error(field + ": " + reason), field_(std::move(field)), reason_(reason) {}
  const std::string& field() const { return field_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string field_;
  std::string reason_;
};

// How a set of values (q, K nope, K rope) is drawn from the data seed.
enum class ValueDist {
  kNormal,    // N(0, 1) * magnitude
  kUniform,   // U(-1, 1) * magnitude
  kSmallInt,  // integers in [-3, 3] * magnitude (exact arithmetic everywhere)
  kZeros,     // all zero
  kTies,      // one value repeated (every element = magnitude); gives tied logits
};

struct ValueSpec {
  ValueDist dist = ValueDist::kNormal;
  double magnitude = 1.0;
  // Fraction of elements replaced by special values (0, -0, +-largest finite, smallest
  // subnormal of the target format). Never NaN or inf: those come from poison tests.
  double special_fraction = 0.0;
};

// How nope scales are chosen.
enum class ScaleMode {
  kWriter,  // production writer: scale = 2^ceil(log2(amax / 448)) per 64-dim tile
  kFixed,   // every tile of every token uses exponent `exp_lo` (ue8m0 byte / fp32 power of 2)
  kRandom,  // codes normalized as the writer does, exponent uniform in [exp_lo, exp_hi] per tile
};

// How a V32 cache stores its fp32 tile scales (docs/SPEC.md section 2). MODEL1 stores ue8m0
// bytes, always powers of two, whatever this says.
enum class ScaleConvention {
  kPowerOfTwo,  // FlashMLA's quantizer: every scale a power of two, 2^(e - 127)
  kFp32,        // vLLM's writers: any positive finite float32 (amax / 448, not rounded)
};

struct ScaleSpec {
  ScaleMode mode = ScaleMode::kWriter;
  int exp_lo = 127;  // ue8m0 byte value (2^(e-127)); 127 means scale 1
  int exp_hi = 127;
  // V32 only (absent from a file: kPowerOfTwo, what every earlier case meant). Under kFp32:
  //   writer: scale = fp32(amax / 448), at least FLT_MIN (vLLM's concat_and_cache_ds_mla),
  //           codes e4m3_sat(v / scale);
  //   fixed:  every tile stores fp32(mantissa * 2^(exp_lo - 127));
  //   random: per token and tile an exponent in [exp_lo, exp_hi] and a mantissa drawn from the
  //           edge values that separate readers (v32_fp32_scale in materialize.h), codes
  //           normalized as the writer does.
  ScaleConvention convention = ScaleConvention::kPowerOfTwo;
  double mantissa = 1.0;  // fixed mode under kFp32: in [1, 2), exact in float32
};

// How bytes that hold no data are filled: page-stride padding, the unused MODEL1 scale byte,
// q and out elements beyond the logical width.
enum class Fill { kZero, kNaN, kGarbage };

// Rule that generates index lists when `indices` is not given explicitly.
enum class IndexRule {
  kRandom,      // uniform over all slots, without replacement where possible
  kSequential,  // the last `topk` tokens of the sequence, in order
  kPageRuns,    // runs of consecutive tokens that cross page boundaries
};

struct IndexSpec {
  IndexRule rule = IndexRule::kRandom;
  double invalid_fraction = 0.0;    // entries replaced by -1
  double duplicate_fraction = 0.0;  // entries replaced by an earlier entry of the row
};

// The extra cache of the production decode (docs/SPEC.md section 8): its own paging and index
// lists, the layout and dims of the main cache. Its tokens draw their values from their own streams
// (or from the main cache's, with same_values: extra token t then holds main token t's values,
// so that one token can appear in both lists).
struct ExtraCache {
  int32_t page_size = 64;
  int64_t page_stride = 0;  // 0: the layout's minimum
  int32_t num_pages = 1;
  std::vector<int32_t> page_order;  // physical page of each logical page; empty: identity
  int32_t topk = 512;
  // Explicit logical index lists, [batch * s_q][topk] (row b * s_q + s); empty: index_spec.
  std::vector<std::vector<int32_t>> indices;
  IndexSpec index_spec;
  std::optional<std::vector<int32_t>> topk_length;  // [batch]
  bool same_values = false;
};

struct Case {
  int version = kCaseFormatVersion;
  std::string name;         // free text, shown in reports
  std::string description;  // free text

  // Geometry. page_stride 0 in JSON means "the layout's minimum".
  mla::CacheGeometry geom;
  // Physical position of each logical page: physical_page = page_order[logical_page].
  // Empty means identity. Indices in the recipe are logical token positions; materialization
  // maps them through page_order to global physical slots.
  std::vector<int32_t> page_order;

  int32_t batch = 1;
  int32_t heads = 64;
  int32_t topk = 128;
  // Query tokens per batch row (version 2): q, out and lse are [batch, s_q, heads, ...], every
  // query token has its own index lists; topk_length stays [batch], shared by a row's tokens.
  int32_t s_q = 1;
  // Explicit logical index lists, one per query token: [batch * s_q][topk] (query token s of
  // batch row b is list b * s_q + s; JSON writes [batch][s_q][topk], or [batch][topk] when
  // s_q = 1); -1 (or other negatives) are invalid entries. Empty means "generate from
  // index_spec".
  std::vector<std::vector<int32_t>> indices;
  IndexSpec index_spec;
  std::optional<std::vector<int32_t>> topk_length;  // [batch]
  std::optional<std::vector<double>> sink;          // [heads], may hold +-inf
  std::optional<double> sm_scale;                   // default d_qk^-0.5
  mla::Conventions conventions;
  std::optional<ExtraCache> extra;  // version 2; absent: one cache

  // Where the q values of each row and head are drawn from. q is drawn per (row, head)
  // position of a case with `heads` heads; shrinking keeps a subset of rows and heads and records
  // here which ones, so that a kept head keeps its values. Absent: the case's own positions.
  struct QSource {
    int32_t heads = 0;               // heads of the case the values are drawn for
    std::vector<int32_t> rows;       // [batch] its row of each row
    std::vector<int32_t> head_ids;   // [heads] its head of each head, < heads
    int32_t s_q = 1;                 // query tokens per row of that case
    std::vector<int32_t> token_ids;  // [s_q] its token of each token, < s_q; empty: identity
  };
  std::optional<QSource> q_source;

  // Extra elements per head row of q and out (strided buffers), filled per `pad_fill`.
  int32_t q_head_pad = 0;
  int32_t out_head_pad = 0;
  // Extra elements after each batch row (version 2). A batch row spans its s_q query tokens:
  // q and out rows beyond s_q * heads * head stride, index rows beyond s_q * topk
  // (indices_batch_stride = s_q * topk + indices_row_pad; the tokens of a row are contiguous,
  // token stride topk) and LSE rows beyond s_q * heads (lse_batch_stride = s_q * heads +
  // lse_row_pad). The extra cache's index rows use the same pad (s_q * extra topk +
  // indices_row_pad). Input gaps are filled per `pad_fill`; output gaps are canaries a kernel
  // must not write.
  int32_t q_batch_pad = 0;
  int32_t out_batch_pad = 0;
  int32_t indices_row_pad = 0;
  int32_t lse_row_pad = 0;

  ValueSpec q_values;
  ValueSpec kv_values;
  ValueSpec rope_values;
  ScaleSpec scales;
  Fill pad_fill = Fill::kZero;
  uint64_t data_seed = 0;

  int32_t d_qk() const { return mla::d_qk(geom); }
  int32_t d_v() const { return mla::d_v(geom); }
  double effective_sm_scale() const;
  int32_t query_rows() const { return batch * s_q; }  // index lists per cache
  // The extra cache's geometry: the main layout and dims with the extra cache's paging.
  mla::CacheGeometry extra_geom() const;
};

// The logical view of an extra cache as a case of its own (its geometry, page order, topk,
// indices, index_spec and topk_length in the main fields), so that index generation and token
// writing are the same code for both caches.
Case extra_as_main(const Case& c);

// The q source of a case that keeps rows `rows` (or heads `heads`), in that order, of c: the
// kept rows and heads draw the q values they had in c.
Case::QSource q_source_of_rows(const Case& c, const std::vector<int>& rows);
Case::QSource q_source_of_heads(const Case& c, const std::vector<int>& heads);
Case::QSource q_source_of_tokens(const Case& c, const std::vector<int>& tokens);

// Throws CaseError naming the first inconsistent field (S0 too small, nope not a multiple of
// the scale tile, index out of range, wrong list lengths, unknown enum value, ...).
void validate(const Case& c);

// JSON text <-> Case. from_json rejects unknown fields and unknown versions (CaseError).
std::string to_json(const Case& c);
Case case_from_json(const std::string& text);

// File I/O. save_case validates, then writes atomically (temp file + fsync + rename), so an
// invalid case writes nothing. load_case validates, and accepts a plain case file or a corpus
// entry {"format": "mlafuzz-corpus", "version": 1 or 2, "case": {...}, ...} (it takes "case").
Case load_case(const std::string& path);
void save_case(const Case& c, const std::string& path);

// Throws CaseError ("version") unless the corpus entry `entry` ({"format": "mlafuzz-corpus", ...})
// has a version this build reads (kOldestCorpusFormatVersion to kCorpusFormatVersion).
void check_corpus_entry_version(const nlohmann::ordered_json& entry);

// JSON values, for files that embed a case (corpus entries, reports). Keys come out in a fixed,
// human-readable order. case_from_json_value is as strict as case_from_json and validates;
// `path_prefix` is prepended to the field in errors (e.g. "case." gives "case.indices[2][5]").
// nlohmann::json converts implicitly to and from ordered_json.
nlohmann::ordered_json case_to_json_value(const Case& c);
Case case_from_json_value(const nlohmann::ordered_json& j, const std::string& path_prefix = "");

// The "geometry" object of a case file, without page_order (also used by dumps and reports).
nlohmann::ordered_json geometry_to_json(const mla::CacheGeometry& g);

// Pretty JSON text: two-space indent, but arrays of scalars on one line, so index lists stay
// readable. Ends with a newline. Used for case files, corpus entries and reports.
std::string json_to_text(const nlohmann::ordered_json& j);

// The lowercase names used in case files (and reports).
const char* layout_name(mla::Layout l);
const char* value_dist_name(ValueDist d);
const char* scale_mode_name(ScaleMode m);
const char* scale_convention_name(ScaleConvention c);
const char* invalid_index_rule_name(mla::InvalidIndexRule r);
const char* fill_name(Fill f);
const char* index_rule_name(IndexRule r);

}  // namespace mlafuzz

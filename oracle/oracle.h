// Float64 reference implementations of sparse MLA decode (docs/SPEC.md section 3).
//
// Two oracles that share nothing but the number-format decoders of mla/fp_formats.h:
// - the Eigen oracle (oracle_eigen.cc), written for speed: each batch row's selected keys are
//   decoded once into a dense matrix and all heads are computed with two matrix products;
// - the loop oracle (oracle_loop.cc), plain nested loops straight from the formulas with its own
//   cache addressing, used to check the Eigen one (and mla_params.h) in the tests.
//
// Both are exact up to float64 rounding: keys are decoded exactly (e4m3 * scale has at most 28
// significant bits, bf16 rope widens exactly), q is widened exactly, sm_scale is the fp32 value
// the kernels receive (MaterializedCase::sm_scale64). Neither oracle ever aborts on bad input:
// they throw std::invalid_argument, and the backends turn that into RunStatus::kError.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"

namespace mlafuzz {

// One query row (r = b * s_q + s; the batch row b when s_q = 1) decoded once and shared by all
// heads: the valid entries of its main list, then those of its extra list (docs/SPEC.md section 8).
struct OracleRow {
  std::vector<int32_t> k;  // positions of the valid entries, in order: main list positions k,
                           // then extra list positions as topk + k (duplicates kept: a repeated
                           // index is a separate entry, also across the two lists)
  int32_t n_main = 0;      // how many of them are main entries (the first n_main)
  Eigen::MatrixXd K;       // [n_valid, d_qk] dequantized keys, exact (e4m3*scale, bf16 rope)
  // V = K.leftCols(d_v) for both layouts (MODEL1: d_v = d_qk; V32: d_v = nope_dim, the first
  // columns).
};

// Decodes the valid selected tokens of query row b (both lists). Throws std::invalid_argument when
// a valid index of row b is outside the cache or the buffers are too small for the case's shapes.
// Checks only row b, so looping over the rows costs O(B * topk) checks in all.
OracleRow gather_row(const MaterializedCase& m, int b);

// [H, d_qk] bf16 q of query row b, widened exactly (row stride q_head_stride is skipped).
Eigen::MatrixXd q_matrix(const MaterializedCase& m, int b);

// [H, n_valid] logits x = sm_scale64 * q . K of query row b (for tolerance models that need
// the oracle's logits or softmax weights).
Eigen::MatrixXd row_logits(const MaterializedCase& m, int b, const OracleRow& row);

struct OracleResult {
  std::vector<double> out;  // [B * s_q, H, d_v] contiguous
  std::vector<double> lse;  // [B * s_q, H] natural log
};

// One query row of the Eigen oracle, for tolerance models that reuse its work instead of decoding
// the keys and forming the logits again: the row's valid entries (main list's first), the keys,
// q, the logits, and the row's output and LSE (once the oracle wrote them, or the result passed
// to visit_oracle_rows).
struct OracleRowView {
  int32_t row = 0;              // query row r = b * s_q + s
  Eigen::Index n = 0;           // valid entries; 0: an empty row (nothing below is set)
  int32_t n_main = 0;           // how many of them are the main list's
  const int32_t* k = nullptr;   // [n] their positions, as OracleRow::k
  const double* K = nullptr;    // [n, d_qk] row-major, exact
  const double* Q = nullptr;    // [H, d_qk] row-major, exact
  const double* X = nullptr;    // [H, n] column-major logits sm_scale64 * q . K, as the oracle's
  const double* out = nullptr;  // [H, d_v] row-major
  const double* lse = nullptr;  // [H]
};

// Called once per query row (in any order; with several oracle threads, from those threads, one
// row at a time per thread). A row's view lives for the call only.
class OracleRowVisitor {
 public:
  virtual void visit(const OracleRowView& row) = 0;

 protected:
  ~OracleRowVisitor() = default;
};

// threads: 0 = automatic (several threads only when the case is large enough to pay for them,
// at most std::thread::hardware_concurrency() and at most B), 1 = the calling thread only
// (use 1 when the caller already runs cases in parallel). The result does not depend on the
// thread count (bit for bit). Scratch buffers are kept per calling thread between calls
// (a few MB per worker at production shapes); no thread outlives the call.
OracleResult run_oracle_eigen(const MaterializedCase& m, int threads);
OracleResult run_oracle_eigen(const MaterializedCase& m);  // threads = 0
// The same, visiting every row after the oracle computed it (the result's bits do not depend on
// the visitor).
OracleResult run_oracle_eigen(const MaterializedCase& m, int threads, OracleRowVisitor* visitor);
// Every row of m as run_oracle_eigen would visit it, for a result `ref` computed before: the
// keys decoded and the logits formed again (no softmax, no product with V), out and lse from
// ref. Throws std::invalid_argument as the oracle does.
void visit_oracle_rows(const MaterializedCase& m, const OracleResult& ref,
                       OracleRowVisitor& visitor);
OracleResult run_oracle_loop(const MaterializedCase& m);

// Throws std::invalid_argument naming the first inconsistency between the case's shapes and
// its buffers, or a valid index outside the cache (the oracle would otherwise read out of
// bounds). Both oracles call their own checks; this is the Eigen oracle's.
void check_oracle_inputs(const MaterializedCase& m);

// The 256 e4m3fn encodings as doubles (index = byte), built from mla::e4m3_to_float.
const double* e4m3_table();

std::unique_ptr<Backend> make_oracle_backend(int threads = 0);  // "oracle", Precision::kFloat64
std::unique_ptr<Backend> make_oracle_loop_backend();            // "oracle-loop"

}  // namespace mlafuzz

// Float64 reference implementations of sparse MLA decode (SPEC.md section 3).
//
// Two oracles that share nothing but the number-format decoders of kernels/common/fp_formats.h:
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

#include "harness/core/backend.h"
#include "harness/core/materialize.h"

namespace mlafuzz {

// One query row (r = b * s_q + s; the batch row b when s_q = 1) decoded once and shared by all
// heads: the valid entries of its main list, then those of its extra list (SPEC.md section 8).
struct OracleRow {
  std::vector<int32_t> k;  // positions of the valid entries, in order: main list positions k,
                           // then extra list positions as topk + k (duplicates kept: a repeated
                           // index is a separate entry, also across the two lists)
  int32_t n_main = 0;      // how many of them are main entries (the first n_main)
  Eigen::MatrixXd K;       // [n_valid, d_qk] dequantized keys, exact (e4m3*scale, bf16 rope)
  // V = K.leftCols(d_v) for both layouts (MODEL1: d_v = d_qk; V32: d_v = nope_dim, the first
  // columns).
};

// Decodes the valid selected tokens of query row b (both lists). Throws std::invalid_argument when a valid
// index of row b is outside the cache or the buffers are too small for the case's shapes.
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

// threads: 0 = automatic (several threads only when the case is large enough to pay for them,
// at most std::thread::hardware_concurrency() and at most B), 1 = the calling thread only
// (use 1 when the caller already runs cases in parallel). The result does not depend on the
// thread count (bit for bit). Scratch buffers are kept per calling thread between calls
// (a few MB per worker at production shapes); no thread outlives the call.
OracleResult run_oracle_eigen(const MaterializedCase& m, int threads);
OracleResult run_oracle_eigen(const MaterializedCase& m);  // threads = 0
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

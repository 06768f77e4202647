// The Eigen float64 oracle: per batch row, decode the selected keys once into a dense row-major
// matrix, then logits S = Q K^T for all heads in one product, a row-wise stable softmax, and
// O = W V in a second product. Batch rows are independent and run on several threads when the
// case is large enough to pay for them.
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "mla/fp_formats.h"
#include "mla/mla_params.h"
#include "oracle/oracle.h"

namespace mlafuzz {
namespace {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr double kInf = std::numeric_limits<double>::infinity();

[[noreturn]] void bad_input(const std::string& what) {
  throw std::invalid_argument("oracle: " + what);
}

// One index list of query row r = b * s_q + s and the cache it reads (docs/SPEC.md section 8): the
// main list, or the extra list.
struct List {
  const mla::CacheGeometry* geom;
  const uint8_t* cache;
  const int32_t* idx;
  int32_t topk;
  int32_t len;  // -1: no length
};

List main_list(const MaterializedCase& m, int r) {
  const int b = r / m.s_q, s = r % m.s_q;
  return {&m.geom, m.cache.data(),
          m.indices.data() + b * m.indices_batch_stride + s * m.indices_token_stride, m.topk,
          m.topk_length.empty() ? -1 : m.topk_length[b]};
}

List extra_list(const MaterializedCase& m, int r) {
  const int b = r / m.s_q, s = r % m.s_q;
  return {
      &m.extra_geom, m.extra_cache.data(),
      m.extra_indices.data() + b * m.extra_indices_batch_stride + s * m.extra_indices_token_stride,
      m.extra_topk, m.extra_topk_length.empty() ? -1 : m.extra_topk_length[b]};
}

// Positions k of the valid entries of a list, in order (duplicates kept), appended to ks with
// `offset` added.
void valid_positions(const MaterializedCase& m, const List& l, int32_t offset,
                     std::vector<int32_t>& ks) {
  const int64_t slots = mla::num_slots(*l.geom);
  for (int32_t k = 0; k < l.topk; ++k) {
    if (mla::index_valid_in(l.idx[k], k, l.len, m.conv, slots)) ks.push_back(offset + k);
  }
}

// Valid entries of query row r: the main list's positions k, then the extra list's as
// topk + k. Returns how many are main entries.
int32_t valid_positions(const MaterializedCase& m, int r, std::vector<int32_t>& ks) {
  ks.clear();
  valid_positions(m, main_list(m, r), 0, ks);
  const auto n_main = static_cast<int32_t>(ks.size());
  if (m.has_extra) valid_positions(m, extra_list(m, r), m.topk, ks);
  return n_main;
}

// Decodes the tokens of row b listed in ks into Kr [ks.size(), d_qk]: one token per matrix row,
// so the decode writes are contiguous. e4m3 codes go through the 256-entry table, times the
// tile scale widened to double: the product is exact (4 + 24 significant bits), also where the
// fp32 product the kernels form would overflow (an honest difference, not an oracle error).
void gather_list(const List& l, const int32_t* ks, size_t n, double* Kr) {
  const mla::CacheGeometry& g = *l.geom;
  const int32_t dqk = mla::d_qk(g);
  const int32_t tiles = mla::num_scale_tiles(g);
  const double* lut = e4m3_table();
  const uint8_t* cache = l.cache;
  const int32_t* idx = l.idx;
  for (size_t i = 0; i < n; ++i) {
    const mla::TokenAddress a = mla::token_address(g, idx[ks[i]]);
    if (i + 2 < n) {
      // The selected tokens are scattered over the cache: start loading a later token's bytes
      // while this one decodes (one request per 64-byte line).
      const mla::TokenAddress p = mla::token_address(g, idx[ks[i + 2]]);
      for (int64_t off = 0; off < g.nope_dim + 2 * g.rope_dim; off += 64) {
        __builtin_prefetch(cache + p.nope + off);
      }
      __builtin_prefetch(cache + p.scale);
    }
    double* row = Kr + static_cast<int64_t>(i) * dqk;
    const uint8_t* nope = cache + a.nope;
    for (int32_t t = 0; t < tiles; ++t) {
      const double scale = static_cast<double>(mla::tile_scale(g, cache, a, t));
      const int32_t d0 = t * g.scale_tile;
      for (int32_t d = d0; d < d0 + g.scale_tile; ++d) row[d] = lut[nope[d]] * scale;
    }
    const uint8_t* rope = cache + a.rope;
    for (int32_t r = 0; r < g.rope_dim; ++r) {
      const uint16_t bits = static_cast<uint16_t>(rope[2 * r] | (rope[2 * r + 1] << 8));
      row[g.nope_dim + r] = static_cast<double>(mla::bf16_to_float(bits));
    }
  }
}

// The tokens of query row r listed in ks (main positions, then extra positions topk + k).
void gather_rows(const MaterializedCase& m, int r, const std::vector<int32_t>& ks, int32_t n_main,
                 double* Kr) {
  gather_list(main_list(m, r), ks.data(), static_cast<size_t>(n_main), Kr);
  if (static_cast<size_t>(n_main) == ks.size()) return;
  std::vector<int32_t> extra(ks.begin() + n_main, ks.end());
  for (int32_t& k : extra) k -= m.topk;
  gather_list(extra_list(m, r), extra.data(), extra.size(),
              Kr + static_cast<int64_t>(n_main) * m.d_qk());
}

// Scratch of one worker, reused across the batch rows it computes and, through the calling
// thread's thread_local cache, across calls. Buffers only grow: Eigen's resize() would free and
// reallocate whenever a row's valid count changes, and glibc hands such large blocks back to
// the kernel on free, so every call would page-fault its scratch in again (measured: 4.5 ms
// instead of 0.7 ms for B=1, topk=128).
//
// The buffers are aligned to Eigen's packet alignment, always: Eigen peels unaligned leading
// elements into scalar code (std::exp instead of its packet exp, another summation order), so
// with malloc's varying alignment the last bit of the result depended on which thread's buffer
// a row landed in (caught by ThreadCountDoesNotChangeBits when run alone).
using AlignedVector = std::vector<double, Eigen::aligned_allocator<double>>;
struct RowScratch {
  std::vector<int32_t> ks;
  AlignedVector kr;    // [n, d_qk] row-major gathered keys
  AlignedVector q;     // [H, d_qk] row-major, like the bf16 input (contiguous widening)
  AlignedVector s;     // [H, n] col-major logits, then softmax numerators exp(x - max)
  AlignedVector x;     // [H, n] col-major logits kept for a row visitor
  Eigen::VectorXd mx;  // [H] row max of the logits
  Eigen::VectorXd l;   // [H] sum of exp(x - max)
};

using RowMap = Eigen::Map<RowMatrix>;
using ColMap = Eigen::Map<Eigen::MatrixXd>;

double* grown(AlignedVector& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// q of query row r as [H, d_qk] row-major doubles (the head padding is skipped).
void fill_q(const MaterializedCase& m, int r, double* q) {
  const int32_t dqk = m.d_qk();
  const uint16_t* qb = m.q_row(r / m.s_q, r % m.s_q, 0);
  for (int32_t h = 0; h < m.heads; ++h) {
    const uint16_t* qh = qb + static_cast<int64_t>(h) * m.q_head_stride;
    double* row = q + static_cast<int64_t>(h) * dqk;
    for (int32_t d = 0; d < dqk; ++d) row[d] = static_cast<double>(mla::bf16_to_float(qh[d]));
  }
}

// The row's valid entries (s.ks), keys (s.kr) and q (s.q), and its logits in s.s: sm_scale is
// applied after the product, in float64. Returns how many entries are the main list's; the row
// is empty when s.ks is.
int32_t row_logits_into(const MaterializedCase& m, int b, RowScratch& s) {
  const int32_t H = m.heads;
  const int32_t n_main = valid_positions(m, b, s.ks);
  const Eigen::Index n = static_cast<Eigen::Index>(s.ks.size());
  if (n == 0) return n_main;
  const int32_t dqk = m.d_qk();
  RowMap K(grown(s.kr, n * dqk), n, dqk);
  RowMap Q(grown(s.q, int64_t{H} * dqk), H, dqk);
  ColMap S(grown(s.s, H * n), H, n);
  gather_rows(m, b, s.ks, n_main, K.data());
  fill_q(m, b, Q.data());
  // Logits of all heads at once.
  S.noalias() = Q * K.transpose();
  S *= m.sm_scale64;
  return n_main;
}

// Writes out[r, :, :] and lse[r, :] of query row r (`b` below): one joint softmax over the valid
// entries of its main and extra lists (docs/SPEC.md section 8; a token in both counts twice); then
// shows the row to `visitor` (when not null).
void compute_row(const MaterializedCase& m, int b, RowScratch& s, OracleResult& res,
                 OracleRowVisitor* visitor) {
  const int32_t H = m.heads;
  const int32_t dv = m.d_v();
  double* out = res.out.data() + static_cast<int64_t>(b) * H * dv;
  double* lse = res.lse.data() + static_cast<int64_t>(b) * H;

  const int32_t n_main = row_logits_into(m, b, s);
  const Eigen::Index n = static_cast<Eigen::Index>(s.ks.size());
  OracleRowView view;
  view.row = b;
  view.out = out;
  view.lse = lse;
  if (n == 0) {
    // Empty row: out = 0 (also with a sink: there is nothing to weigh), lse per convention
    // (FlashMLA +inf, SGLang/vLLM -inf), never a 0/0 NaN.
    std::fill(out, out + static_cast<int64_t>(H) * dv, 0.0);
    const double empty = m.conv.empty_lse == mla::EmptyRowLse::kPosInf ? kInf : -kInf;
    std::fill(lse, lse + H, empty);
    if (visitor != nullptr) visitor->visit(view);
    return;
  }
  const int32_t dqk = m.d_qk();
  RowMap K(s.kr.data(), n, dqk);
  ColMap S(s.s.data(), H, n);
  RowMap O(out, H, dv);  // the result's [H, d_v] slice of row b, written in place
  if (visitor != nullptr) {
    std::copy_n(s.s.data(), H * n, grown(s.x, H * n));
    view.n = n;
    view.n_main = n_main;
    view.k = s.ks.data();
    view.K = s.kr.data();
    view.Q = s.q.data();
    view.X = s.x.data();
  }

  // Subtract the row max before exp so that huge logits (1e4) cannot overflow. A NaN logit
  // (NaN key bytes or q) makes the row's sum NaN whatever max Eigen picks: NaN propagates
  // honestly. An infinite logit (only from inf scales or rope) gives inf - inf = NaN, as in
  // the kernels.
  s.mx = S.rowwise().maxCoeff();
  S.array().colwise() -= s.mx.array();
  S.array() = S.array().exp();
  s.l = S.rowwise().sum();
  O.noalias() = S * K.leftCols(dv);

  for (int32_t h = 0; h < H; ++h) {
    const double sink = m.sink.empty() ? -kInf : static_cast<double>(m.sink[h]);
    // exp(sink - max) is the sink's numerator on the same shifted scale as l. A -inf sink (or
    // none) adds 0; a +inf sink makes the denominator infinite so out = 0 exactly (handled
    // explicitly so an infinite numerator cannot give inf/inf); a finite sink so large that
    // exp overflows gives +inf too, whose limit out = 0 is the correct float64 answer.
    const double sink_term = sink == -kInf ? 0.0 : std::exp(sink - s.mx(h));
    if (sink == kInf) {
      O.row(h).setZero();
    } else {
      O.row(h) *= 1.0 / (s.l(h) + sink_term);
    }
    if (!m.conv.sink_in_lse || sink == -kInf) {
      lse[h] = s.mx(h) + std::log(s.l(h));  // sink excluded (FlashMLA)
    } else if (sink == kInf) {
      lse[h] = kInf;  // ln(... + e^inf)
    } else {
      // SGLang Triton: ln(sum exp(x) + exp(sink)), shifted by the larger of max and sink so
      // that neither a huge sink nor huge logits overflow.
      const double M = std::max(s.mx(h), sink);
      lse[h] = M + std::log(s.l(h) * std::exp(s.mx(h) - M) + std::exp(sink - M));
    }
  }
  if (visitor != nullptr) visitor->visit(view);
}

}  // namespace

const double* e4m3_table() {
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = static_cast<double>(mla::e4m3_to_float(uint8_t(v)));
    return t;
  }();
  return table.data();
}

namespace {

// Shapes against buffer sizes: O(B), no index is looked at.
void check_shapes(const MaterializedCase& m) {
  const mla::CacheGeometry& g = m.geom;
  if (m.batch < 0 || m.heads < 0 || m.topk < 0) bad_input("negative batch, heads or topk");
  if (g.page_size <= 0) bad_input("page_size must be positive");
  if (g.scale_tile <= 0 || g.nope_dim < 0 || g.nope_dim % g.scale_tile != 0) {
    bad_input("nope_dim must be a non-negative multiple of scale_tile");
  }
  if (g.rope_dim < 0 || g.num_pages < 0) bad_input("negative rope_dim or num_pages");
  if (g.page_stride < mla::min_page_stride(g)) {
    bad_input("page_stride " + std::to_string(g.page_stride) + " < minimum " +
              std::to_string(mla::min_page_stride(g)));
  }
  if (static_cast<int64_t>(m.cache.size()) < mla::cache_bytes(g)) {
    bad_input("cache holds " + std::to_string(m.cache.size()) + " bytes, geometry needs " +
              std::to_string(mla::cache_bytes(g)));
  }
  if (m.s_q < 1) bad_input("s_q must be >= 1");
  if (m.q_head_stride < m.d_qk()) bad_input("q_head_stride < d_qk");
  if (m.q_token_stride < int64_t{m.heads} * m.q_head_stride ||
      m.q_batch_stride < m.s_q * m.q_token_stride) {
    bad_input("q strides below the contiguous minimum");
  }
  if (static_cast<int64_t>(m.q.size()) < int64_t{m.batch} * m.q_batch_stride) {
    bad_input("q buffer too small");
  }
  auto check_lists = [&](const char* name, const std::vector<int32_t>& idx,
                         const std::vector<int32_t>& len, int32_t topk, int64_t token_stride,
                         int64_t batch_stride) {
    if (topk < 0 || token_stride < topk || batch_stride < m.s_q * token_stride ||
        static_cast<int64_t>(idx.size()) < int64_t{m.batch} * batch_stride) {
      bad_input(std::string(name) + " must hold batch*s_q*topk entries");
    }
    if (!len.empty()) {
      if (static_cast<int64_t>(len.size()) != m.batch) {
        bad_input(std::string(name) + ": topk_length must hold batch entries");
      }
      for (int32_t b = 0; b < m.batch; ++b) {
        // index_valid reads a negative length as "no length given": a negative stored length
        // would silently validate every entry, so it is rejected instead.
        if (len[b] < 0)
          bad_input(std::string(name) + ": topk_length[" + std::to_string(b) + "] < 0");
      }
    }
  };
  check_lists("indices", m.indices, m.topk_length, m.topk, m.indices_token_stride,
              m.indices_batch_stride);
  if (m.has_extra) {
    const mla::CacheGeometry& e = m.extra_geom;
    if (e.page_size <= 0 || e.num_pages < 0 || e.page_stride < mla::min_page_stride(e) ||
        static_cast<int64_t>(m.extra_cache.size()) < mla::cache_bytes(e)) {
      bad_input("the extra cache's geometry does not match its buffer");
    }
    check_lists("extra_indices", m.extra_indices, m.extra_topk_length, m.extra_topk,
                m.extra_indices_token_stride, m.extra_indices_batch_stride);
  }
  if (!m.sink.empty() && static_cast<int64_t>(m.sink.size()) != m.heads) {
    bad_input("sink must hold heads entries");
  }
}

void check_list(const MaterializedCase& m, const List& l, const char* name, int r) {
  const int64_t slots = mla::num_slots(*l.geom);
  for (int32_t k = 0; k < l.topk; ++k) {
    const int32_t idx = l.idx[k];
    // Out-of-range positive indices (and negatives other than -1 under FlashMLA's rule) are
    // undefined behaviour in every implementation: reject rather than read out of bounds.
    if (mla::index_valid_in(idx, k, l.len, m.conv, slots) && (idx < 0 || idx >= slots)) {
      // (A stream: gcc 12 warns falsely about std::string operator+ chains here.)
      std::ostringstream at;
      at << name << "[" << r / m.s_q << "]";
      if (m.s_q > 1) at << "[" << r % m.s_q << "]";
      at << "[" << k << "] = " << idx << " is outside [0, " << slots << ")";
      bad_input(at.str());
    }
  }
}

// Every valid index of query row r inside its cache.
void check_row_indices(const MaterializedCase& m, int32_t r) {
  check_list(m, main_list(m, r), "indices", r);
  if (m.has_extra) check_list(m, extra_list(m, r), "extra_indices", r);
}

void check_batch_row(const MaterializedCase& m, int r) {
  if (r < 0 || r >= m.query_rows()) bad_input("query row " + std::to_string(r) + " out of range");
}

}  // namespace

void check_oracle_inputs(const MaterializedCase& m) {
  check_shapes(m);
  for (int32_t r = 0; r < m.query_rows(); ++r) check_row_indices(m, r);
}

// The per-row entry points check only what they read (shapes and row b), so that a caller
// looping over rows does not pay for the whole case's index check on every row.
OracleRow gather_row(const MaterializedCase& m, int b) {
  check_shapes(m);
  check_batch_row(m, b);
  check_row_indices(m, b);
  OracleRow row;
  row.n_main = valid_positions(m, b, row.k);
  RowMatrix Kr(static_cast<Eigen::Index>(row.k.size()), m.d_qk());
  gather_rows(m, b, row.k, row.n_main, Kr.data());
  row.K = Kr;
  return row;
}

Eigen::MatrixXd q_matrix(const MaterializedCase& m, int b) {
  check_shapes(m);
  check_batch_row(m, b);
  RowMatrix Q(m.heads, m.d_qk());
  fill_q(m, b, Q.data());
  return Q;
}

Eigen::MatrixXd row_logits(const MaterializedCase& m, int b, const OracleRow& row) {
  if (row.K.cols() != m.d_qk()) bad_input("row.K must have d_qk columns");
  Eigen::MatrixXd S = q_matrix(m, b) * row.K.transpose();
  S *= m.sm_scale64;
  return S;
}

OracleResult run_oracle_eigen(const MaterializedCase& m) { return run_oracle_eigen(m, 0); }

OracleResult run_oracle_eigen(const MaterializedCase& m, int threads) {
  return run_oracle_eigen(m, threads, nullptr);
}

void visit_oracle_rows(const MaterializedCase& m, const OracleResult& ref,
                       OracleRowVisitor& visitor) {
  check_oracle_inputs(m);
  const int32_t H = m.heads, dv = m.d_v();
  if (ref.out.size() != static_cast<size_t>(m.query_rows()) * H * dv ||
      ref.lse.size() != static_cast<size_t>(m.query_rows()) * H) {
    bad_input("the result's out and lse do not have the case's shape");
  }
  thread_local RowScratch s;
  for (int32_t r = 0; r < m.query_rows(); ++r) {
    OracleRowView view;
    view.row = r;
    view.n_main = row_logits_into(m, r, s);
    view.n = static_cast<Eigen::Index>(s.ks.size());
    view.out = ref.out.data() + static_cast<int64_t>(r) * H * dv;
    view.lse = ref.lse.data() + static_cast<int64_t>(r) * H;
    if (view.n > 0) {
      view.k = s.ks.data();
      view.K = s.kr.data();
      view.Q = s.q.data();
      view.X = s.s.data();
    }
    visitor.visit(view);
  }
}

OracleResult run_oracle_eigen(const MaterializedCase& m, int threads, OracleRowVisitor* visitor) {
  check_oracle_inputs(m);
  OracleResult res;
  const int32_t rows = m.query_rows();
  res.out.assign(static_cast<size_t>(rows) * m.heads * m.d_v(), 0.0);
  res.lse.assign(static_cast<size_t>(rows) * m.heads, 0.0);
  if (rows == 0) return res;

  if (threads <= 0) {
    // Spawning a thread costs tens of microseconds; below ~4 MFLOP (about 0.1 ms of work) the
    // calling thread alone is faster.
    const double flops =
        2.0 * rows * m.heads * (m.topk + (m.has_extra ? m.extra_topk : 0)) * (m.d_qk() + m.d_v());
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = flops < 4e6 ? 1 : hw;
  }
  threads = std::min(threads, rows);

  // Scratch per worker, kept by the calling thread between calls (see RowScratch). Workers are
  // plain threads started per call: no pool survives the call, so a fork() after it is safe.
  thread_local std::vector<RowScratch> scratch;
  if (static_cast<int>(scratch.size()) < threads) scratch.resize(threads);
  // Workers must get the caller's buffers by pointer: naming `scratch` inside the worker
  // lambda would resolve to the worker thread's own (empty) thread_local vector.
  RowScratch* const pool = scratch.data();
  // Scratch above 64 MB per buffer (a very long top-k list) is not kept for the next call.
  struct Release {
    std::vector<RowScratch>& s;
    ~Release() {
      constexpr size_t kKeep = size_t{8} << 20;  // doubles
      for (RowScratch& r : s) {
        for (AlignedVector* v : {&r.kr, &r.q, &r.s, &r.x}) {
          if (v->capacity() > kKeep) AlignedVector().swap(*v);
        }
      }
    }
  } release{scratch};
  if (threads == 1) {
    for (int32_t r = 0; r < rows; ++r) compute_row(m, r, pool[0], res, visitor);
    return res;
  }
  // Rows are handed out one at a time (their valid counts differ); each writes its own slice.
  std::atomic<int32_t> next{0};
  std::vector<std::exception_ptr> errors(threads);
  auto work = [&](int t) {
    try {
      for (int32_t r = next++; r < rows; r = next++) compute_row(m, r, pool[t], res, visitor);
    } catch (...) {
      errors[t] = std::current_exception();  // e.g. bad_alloc: rethrown on the caller
    }
  };
  std::vector<std::thread> workers;
  try {
    for (int t = 1; t < threads; ++t) workers.emplace_back(work, t);
  } catch (const std::system_error&) {
    // Out of threads: the ones started and the caller share the remaining rows.
  }
  work(0);
  for (auto& th : workers) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return res;
}

namespace {

// Shared by both oracle backends: float64 results, no raw buffers, errors become statuses.
class OracleBackend final : public TraitsBackend<Backend> {
 public:
  OracleBackend(std::string name, bool loop, int threads)
      : name_(std::move(name)), loop_(loop), threads_(threads) {
    traits_.name = name_;
    traits_.precision = Precision::kFloat64;
    // The Eigen oracle is the campaign's reference; oracle-loop is checked against it like any
    // backend.
    traits_.is_reference = !loop_;
    traits_.envelope = any_case_envelope();
  }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    RunResult r;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      OracleResult o = loop_ ? run_oracle_loop(m) : run_oracle_eigen(m, threads_);
      r.out = std::move(o.out);
      r.lse = std::move(o.lse);
    } catch (const std::exception& e) {
      r.status = RunStatus::kError;
      r.message = name_ + ": " + e.what();
    } catch (...) {
      r.status = RunStatus::kError;
      r.message = name_ + ": unknown exception";
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

 private:
  std::string name_;
  bool loop_;
  int threads_;
};

}  // namespace

std::unique_ptr<Backend> make_oracle_backend(int threads) {
  return std::make_unique<OracleBackend>("oracle", false, threads);
}

std::unique_ptr<Backend> make_oracle_loop_backend() {
  return std::make_unique<OracleBackend>("oracle-loop", true, 1);
}

}  // namespace mlafuzz

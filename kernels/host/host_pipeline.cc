// Non-template parts of the host models' shared pipeline (see host_pipeline.h).
#include "kernels/host/host_pipeline.h"

#include <array>
#include <chrono>
#include <exception>
#include <sstream>

namespace mlafuzz::host {

PaddedColumns padded_columns(const mla::CacheGeometry& g) {
  PaddedColumns c;
  c.nope = g.nope_dim;
  c.padded_nope = mla::padded_nope(g.nope_dim);
  c.rope = g.rope_dim;
  c.dkp = c.padded_nope + c.rope;
  c.d_v = mla::d_v(g);
  c.width_v = c.d_v > 0 ? c.col(c.d_v - 1) + 1 : 0;
  return c;
}

ColumnLayout identity_layout(const PaddedColumns& cols, int32_t multiple) {
  ColumnLayout l;
  l.width = mla::round_up(cols.dkp, multiple);
  l.pos.resize(static_cast<size_t>(cols.dkp));
  for (int32_t c = 0; c < cols.dkp; ++c) l.pos[static_cast<size_t>(c)] = c;
  return l;
}

const float* e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = mla::e4m3_to_float(static_cast<uint8_t>(v));
    return t;
  }();
  return table.data();
}

namespace {

// The cache's geometry, and its buffer against it.
std::optional<std::string> check_cache(const MaterializedCase& m) {
  const mla::CacheGeometry& g = m.geom;
  std::ostringstream why;
  if (m.batch < 0 || m.heads < 0 || m.topk < 0) return "batch, heads and topk must be >= 0";
  if (g.page_size < 1 || g.num_pages < 0) return "page_size must be >= 1 and num_pages >= 0";
  if (g.scale_tile < 1 || g.nope_dim < 0 || g.rope_dim < 0 || g.nope_dim % g.scale_tile != 0) {
    return "nope_dim must be a non-negative multiple of scale_tile (>= 1), rope_dim >= 0";
  }
  if (g.page_stride < mla::min_page_stride(g)) {
    why << "page_stride " << g.page_stride << " is below the minimum " << mla::min_page_stride(g);
    return why.str();
  }
  if (static_cast<int64_t>(m.cache.size()) < mla::cache_bytes(g)) {
    why << "cache holds " << m.cache.size() << " bytes, the geometry needs " << mla::cache_bytes(g);
    return why.str();
  }
  return std::nullopt;
}

// s_q, q's strides, and q's buffer against them.
std::optional<std::string> check_q(const MaterializedCase& m) {
  const mla::DecodeParams p = m.host_params();
  const int64_t d_qk = mla::d_qk(m.geom);
  if (m.s_q < 1) return "s_q must be >= 1";
  if (p.q_head_stride < d_qk) return "q_head_stride is below d_qk";
  if (p.q_token_stride < m.heads * p.q_head_stride)
    return "q_token_stride is below H * q_head_stride";
  if (p.q_batch_stride < m.s_q * p.q_token_stride)
    return "q_batch_stride is below s_q * q_token_stride";
  if (m.batch > 0 && m.heads > 0) {
    const int64_t need = (m.batch - 1) * p.q_batch_stride + (m.s_q - 1) * p.q_token_stride +
                         (m.heads - 1) * p.q_head_stride + d_qk;
    if (static_cast<int64_t>(m.q.size()) < need) {
      std::ostringstream why;
      why << "q holds " << m.q.size() << " elements, the strides need " << need;
      return why.str();
    }
  }
  return std::nullopt;
}

// The strides of out and lse.
std::optional<std::string> check_output_strides(const MaterializedCase& m) {
  if (m.out_head_stride < mla::d_v(m.geom)) return "out_head_stride is below d_v";
  if (m.out_token_stride < m.heads * m.out_head_stride) {
    return "out_token_stride is below H * out_head_stride";
  }
  if (m.out_batch_stride < m.s_q * m.out_token_stride) {
    return "out_batch_stride is below s_q * out_token_stride";
  }
  if (m.lse_token_stride < m.heads) return "lse_token_stride is below H";
  if (m.lse_batch_stride < m.s_q * m.lse_token_stride) {
    return "lse_batch_stride is below s_q * lse_token_stride";
  }
  return std::nullopt;
}

// The strides of both caches' index lists.
std::optional<std::string> check_index_strides(const MaterializedCase& m) {
  if (m.indices_token_stride < m.topk) return "indices_token_stride is below topk";
  if (m.indices_batch_stride < m.s_q * m.indices_token_stride) {
    return "indices_batch_stride is below s_q * indices_token_stride";
  }
  if (m.has_extra && (m.extra_indices_token_stride < m.extra_topk ||
                      m.extra_indices_batch_stride < m.s_q * m.extra_indices_token_stride)) {
    return "the extra cache's index strides are below s_q * extra_topk";
  }
  return std::nullopt;
}

// One cache's index lists, as check_list reads them.
struct IndexLists {
  const char* name;
  const std::vector<int32_t>& idx;
  const std::vector<int32_t>& len;
  int32_t topk;
  int64_t batch_stride, token_stride, slots;
};

// A list buffer and its topk_length against the case, and every valid entry inside its cache.
std::optional<std::string> check_lists(const MaterializedCase& m, const IndexLists& l) {
  if (m.batch > 0 && m.s_q > 0 && l.topk > 0 &&
      static_cast<int64_t>(l.idx.size()) <
          (m.batch - 1) * l.batch_stride + (m.s_q - 1) * l.token_stride + l.topk) {
    return std::string(l.name) + " holds fewer entries than batch * s_q * topk";
  }
  if (!l.len.empty() && static_cast<int64_t>(l.len.size()) < m.batch) {
    return std::string(l.name) + ": its topk_length holds fewer than batch entries";
  }
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t topk_len = l.len.empty() ? -1 : l.len[b];
    for (int32_t t = 0; t < m.s_q; ++t) {
      for (int32_t k = 0; k < l.topk; ++k) {
        const int32_t idx = l.idx[static_cast<size_t>(b * l.batch_stride + t * l.token_stride + k)];
        if (!mla::index_valid_in(idx, k, topk_len, m.conv, l.slots)) continue;
        if (idx < 0 || idx >= l.slots) {
          std::ostringstream why;
          why << l.name << "[" << b << "]";
          if (m.s_q > 1) why << "[" << t << "]";
          why << "[" << k << "] = " << idx << " is a valid entry outside the " << l.slots
              << " cache slots (only -1 is invalid under the minus-one-only rule)";
          return why.str();
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> check_inputs(const MaterializedCase& m) {
  if (auto why = check_cache(m)) return why;
  if (auto why = check_q(m)) return why;
  if (auto why = check_output_strides(m)) return why;
  if (auto why = check_index_strides(m)) return why;
  if (!m.sink.empty() && static_cast<int64_t>(m.sink.size()) < m.heads) {
    return "sink holds fewer than heads entries";
  }
  // Both caches' lists: every valid entry inside its cache.
  std::vector<IndexLists> lists = {{"indices", m.indices, m.topk_length, m.topk,
                                    m.indices_batch_stride, m.indices_token_stride,
                                    mla::num_slots(m.geom)}};
  if (m.has_extra) {
    const mla::CacheGeometry& e = m.extra_geom;
    if (e.page_size < 1 || e.num_pages < 0 || e.page_stride < mla::min_page_stride(e) ||
        static_cast<int64_t>(m.extra_cache.size()) < mla::cache_bytes(e)) {
      return "the extra cache's geometry is inconsistent with its buffer";
    }
    if (m.extra_topk < 0) return "extra_topk must be >= 0";
    lists.push_back({"extra_indices", m.extra_indices, m.extra_topk_length, m.extra_topk,
                     m.extra_indices_batch_stride, m.extra_indices_token_stride,
                     mla::num_slots(e)});
  }
  for (const IndexLists& l : lists) {
    if (auto why = check_lists(m, l)) return why;
  }
  return std::nullopt;
}

RunResult run_guarded(const MaterializedCase& m,
                      const std::function<void(const HostCall&)>& model) {
  const auto start = std::chrono::steady_clock::now();
  RunResult r;
  try {
    if (auto why = check_inputs(m)) {
      r.status = RunStatus::kError;
      r.message = *why;
    } else {
      OutputBuffers bufs(m);
      HostCall call;
      call.p = m.host_params();
      bufs.attach(call.p);
      call.cache_bytes = static_cast<int64_t>(m.cache.size());
      call.extra_cache_bytes = static_cast<int64_t>(m.extra_cache.size());
      call.out_end = bufs.out.data() + bufs.out.size();
      model(call);
      r = collect_outputs(m, bufs);
    }
  } catch (const std::exception& e) {
    r = RunResult{};
    r.status = RunStatus::kError;
    r.message = std::string("host model failed: ") + e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace mlafuzz::host

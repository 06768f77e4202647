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

std::optional<std::string> check_inputs(const MaterializedCase& m) {
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
  const mla::DecodeParams p = m.host_params();
  const int64_t d_qk = mla::d_qk(g);
  if (p.q_head_stride < d_qk) return "q_head_stride is below d_qk";
  if (p.q_batch_stride < m.heads * p.q_head_stride)
    return "q_batch_stride is below H * q_head_stride";
  if (m.batch > 0 && m.heads > 0) {
    const int64_t need = (m.batch - 1) * p.q_batch_stride + (m.heads - 1) * p.q_head_stride + d_qk;
    if (static_cast<int64_t>(m.q.size()) < need) {
      why << "q holds " << m.q.size() << " elements, the strides need " << need;
      return why.str();
    }
  }
  if (m.out_head_stride < mla::d_v(g)) return "out_head_stride is below d_v";
  if (m.out_batch_stride < m.heads * m.out_head_stride) {
    return "out_batch_stride is below H * out_head_stride";
  }
  if (m.lse_batch_stride < m.heads) return "lse_batch_stride is below H";
  if (m.indices_batch_stride < m.topk) return "indices_batch_stride is below topk";
  if (static_cast<int64_t>(m.indices.size()) < m.batch * m.indices_batch_stride) {
    return "indices holds fewer than batch * indices_batch_stride entries";
  }
  if (!m.topk_length.empty() && static_cast<int64_t>(m.topk_length.size()) < m.batch) {
    return "topk_length holds fewer than batch entries";
  }
  if (!m.sink.empty() && static_cast<int64_t>(m.sink.size()) < m.heads) {
    return "sink holds fewer than heads entries";
  }
  const int64_t slots = mla::num_slots(g);
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t topk_len = m.topk_length.empty() ? -1 : m.topk_length[b];
    for (int32_t k = 0; k < m.topk; ++k) {
      const int32_t idx = m.index_at(b, k);
      if (!mla::index_valid(idx, k, topk_len, m.conv)) continue;
      if (idx < 0 || idx >= slots) {
        why << "indices[" << b << "][" << k << "] = " << idx << " is a valid entry outside the "
            << slots << " cache slots (only -1 is invalid under the minus-one-only rule)";
        return why.str();
      }
    }
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
      call.p.out = bufs.out_begin();
      call.p.out_head_stride = bufs.out_head_stride;
      call.p.out_batch_stride = bufs.out_batch_stride;
      call.p.lse = bufs.lse_begin();
      call.p.lse_batch_stride = bufs.lse_batch_stride;
      call.cache_bytes = static_cast<int64_t>(m.cache.size());
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

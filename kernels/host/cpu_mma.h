// cpu-mma: host model of the head-tiled tensor-core kernel (kernels/cuda/mma_head_tiled.cuh;
// docs/SPEC.md section 4, second pipeline), as a template on the planted bug so that cpu_mma.cc
// (kNone) and cpu_mma_mutants.cc share it.
//
// Order of the kernel: one program per (batch row, query token, block of BLOCK_H heads); the main
// list's tiles, then the extra list's (docs/SPEC.md section 8) in the same online softmax; per tile
// of mla::kMmaTokenTile = 64 selected tokens (decoded to bf16 once, for every head of the block),
// per head: logits x = fp32(q . K) * sm_scale (q bf16 unscaled; bf16 x bf16 products are exact
// in fp32; masked tokens -inf), the tile max, softmax_advance, p = exp(x - m) in fp32 (exactly 0
// for masked tokens), the tile's row sum of the unrounded p in the kernel's order (per 8-token
// chunk: 4 quad lanes of 2 tokens, xor-1 and xor-2 shuffles; then the 8 chunks in order),
// l += it, O *= alpha, and bf16(p) * V added to O in fp32. The store multiplies O by the
// reciprocal of l (+ the sink term) and rounds to bf16.
// Heads never interact, so a head's result does not depend on its block or BLOCK_H.
// The tile is a parameter (`tile`): 64, or mla::kMmaSmallTokenTile = 32 for the sm_120-sized
// kernel configuration (cpu-mma-small: 4 chunk sums per tile, the rescales every 32 tokens).
// Split-KV (`split` != mla::kSplitOff): the row's virtual tile range (main tiles, then
// extra tiles, each list's tiles counted up to its topk_length as the kernel does) is cut into
// mla::split_count splits; each split folds its tiles from a fresh softmax state into an fp32
// partial (m, l, O), and the combine of mla/split_kv.h merges them in split order
// before the same store. With one split the result is the unsplit model's bit for bit.
//
// Where the bits can differ from the kernel's: the tensor core's summation inside Q*K^T and P*V
// (the model sums each dot product in 32 lane-strided partial sums and a butterfly, and P*V
// token by token: any order gives the same bits when the sums are exact, e.g. small integers
// with power-of-two scales) and libm's expf/logf against CUDA's. The MMA bound covers both.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/host/host_pipeline.h"
#include "mla/split_kv.h"
#include "mla/tiling.h"

namespace mlafuzz::host {

inline constexpr int32_t kDotLanes = 32;

// Dot products of two q rows with one K row over `width` columns (a multiple of kDotLanes), in
// the model's order for each: lane l sums columns l, l + 32, ... in order, then the lanes are
// added as a butterfly (16, 8, 4, 2, 1). fp32 multiplies and adds, never contracted
// (-ffp-contract=off); bf16 x bf16 products are exact, so FMA would not differ. Two heads share
// each K load (b may be null: one head).
inline void dot_lanes2(const float* __restrict qa, const float* __restrict qb,
                       const float* __restrict k, int32_t width, float* xa, float* xb) {
  float acc_a[kDotLanes] = {}, acc_b[kDotLanes] = {};
  for (int32_t c = 0; c < width; c += kDotLanes) {
    for (int32_t l = 0; l < kDotLanes; ++l) {
      acc_a[l] += qa[c + l] * k[c + l];
      if (qb != nullptr) acc_b[l] += qb[c + l] * k[c + l];
    }
  }
  for (int32_t off = kDotLanes / 2; off > 0; off /= 2) {
    for (int32_t l = 0; l < off; ++l) {
      acc_a[l] += acc_a[l + off];
      acc_b[l] += acc_b[l + off];
    }
  }
  *xa = acc_a[0];
  if (qb != nullptr) *xb = acc_b[0];
}

struct MmaScratch {
  DecodedRow row;
  DecodedRow extra;                      // the token's extra list (docs/SPEC.md section 8)
  std::vector<float> q;                  // [block_h, width] bf16 q of the block's heads
  std::vector<float> o;                  // [block_h, width] fp32 output accumulators
  std::vector<float> x;                  // [block_h, 64] logits of the tile
  std::vector<float> pb;                 // [block_h, 64] bf16(p) of the tile (P*V operand)
  std::vector<mla::SoftmaxState> state;  // [block_h]
  // The LSE-merged pipeline's second online softmax (the extra list alone).
  std::vector<float> o2;                  // [block_h, width]
  std::vector<mla::SoftmaxState> state2;  // [block_h]
  // Split-KV partials (mla/split_kv.h): [splits][block_h] m and l, [splits][block_h]
  // [width] O, as the kernel's workspace holds them.
  std::vector<float> part_m, part_l, part_o;
};

// The LSE-merged production pipeline (SGLang's Triton path; docs/SPEC.md section 8, tolerance.h):
// the main list and the extra list each through their own online softmax without the sink, each
// partial stored in bf16 (O_i = bf16(o_i * (1 / l_i))) with its fp32 LSE l_i = m_i + log(l_i),
// then merged in fp32 as two "tokens" of logit l_i through the same state functions (the sink
// and the LSE conventions applied once, at the merge): out = bf16((sum_i exp(l_i - M) O_i) *
// (1 / (sum_i exp(l_i - M) + exp(sink - M)))). A list without a valid token has weight 0.
inline void store_head_lse_merged(const HostCall& call, const PaddedColumns& cols,
                                  const ColumnLayout& layout, int32_t b, int32_t t, int32_t h,
                                  const mla::SoftmaxState* st, const float* const* o) {
  const mla::DecodeParams& p = call.p;
  float lse_i[2];
  bool has[2];
  float inv_l[2];
  mla::SoftmaxState merged;
  for (int i = 0; i < 2; ++i) {
    has[i] = mla::softmax_has_tokens(st[i]);
    lse_i[i] = has[i] ? st[i].m + mla::softmax_log(st[i].l) : mla::neg_inf();
    inv_l[i] = has[i] ? 1.0f / st[i].l : 0.0f;
    if (has[i] && lse_i[i] > merged.m) merged.m = lse_i[i];
  }
  float w[2] = {0.0f, 0.0f};
  if (mla::softmax_has_tokens(merged)) {
    for (int i = 0; i < 2; ++i) {
      w[i] = has[i] ? mla::softmax_exp(lse_i[i] - merged.m) : 0.0f;
      merged.l += w[i];
    }
  }
  const bool has_tokens = mla::softmax_has_tokens(merged);
  const float rden = has_tokens ? 1.0f / mla::softmax_denominator(merged, p.sink, h) : 0.0f;
  uint16_t* out = p.out + b * p.out_batch_stride + t * p.out_token_stride + h * p.out_head_stride;
  for (int32_t d = 0; d < cols.d_v; ++d) {
    if (!has_tokens) {
      out[d] = 0;  // empty row: out = 0 whatever the sink
      continue;
    }
    const int32_t pos = layout.pos[cols.col(d)];
    float acc = 0.0f;
    for (int i = 0; i < 2; ++i) {
      if (!has[i]) continue;
      const float part = mla::round_to_bf16(o[i][pos] * inv_l[i]);
      acc += w[i] * part;
    }
    out[d] = mla::float_to_bf16(acc * rden);
  }
  p.lse[b * p.lse_batch_stride + t * p.lse_token_stride + h] =
      mla::softmax_lse(merged, p.sink, h, p.conv);
}

// Tokens per tile of the MMA kernel's configurations: 64 (mla::kMmaTokenTile) or 32
// (mla::kMmaSmallTokenTile).
inline bool valid_mma_tile(int32_t tile) {
  return tile == mla::kMmaTokenTile || tile == mla::kMmaSmallTokenTile;
}

// Softmax step of one head for a tile of `tile` logits x (64 or 32; masked: -inf): tile max,
// advance, p, the row sum in the kernel's order (below), O *= alpha. Writes bf16(p) to pb.
template <Mutant M>
void softmax_tile(const float* x, int32_t tile, int32_t width_v, mla::SoftmaxState& s,
                  float* __restrict O, float* __restrict pb) {
  constexpr int32_t kMaxTile = mla::kMmaTokenTile;
  static_assert(mla::kMmaSmallTokenTile <= kMaxTile && mla::kMmaSmallTokenTile % 8 == 0,
                "the row-sum order below is the kernel's for tiles of 8-token chunks");
  float tile_max = mla::neg_inf();
  for (int32_t j = 0; j < tile; ++j) {
    tile_max = x[j] > tile_max ? x[j] : tile_max;  // NaN logits are skipped, as fmaxf does
  }
  const float alpha = advance<M>(s, tile_max);
  float p[kMaxTile];
  for (int32_t j = 0; j < tile; ++j) {
    p[j] = weight(s, x[j]);
    pb[j] = mla::round_to_bf16(p[j]);
  }
  // Per 8-token chunk c, quad lane t adds p[8c + 2t] + p[8c + 2t + 1]; the xor-1 and xor-2
  // shuffles give (s0 + s1) + (s2 + s3); the tile's 8 (4) chunk sums are added in chunk order.
  float tile_sum = 0.0f;
  for (int32_t c = 0; c < tile / 8; ++c) {
    float lane_sum[4];
    for (int32_t t = 0; t < 4; ++t) {
      lane_sum[t] = row_sum_term<M>(p[8 * c + 2 * t]) + row_sum_term<M>(p[8 * c + 2 * t + 1]);
    }
    const float chunk = (lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3]);
    tile_sum = c == 0 ? chunk : tile_sum + chunk;
  }
  s.l += tile_sum;
  if constexpr (M != Mutant::kNoRescale) {
    if (alpha != 1.0f) {  // x * 1 == x bit for bit: skipping is exact
      for (int32_t c = 0; c < width_v; ++c) O[c] *= alpha;
    }
  }
}

// O_j += bf16(p_jk) * V_k over the tile's valid tokens in order, for heads j and j + 1 (ob may be
// null), 32 columns at a time so that both accumulators stay in registers across the tokens.
inline void pv_tile2(const DecodedRow& row, int32_t width, int32_t width_v, int32_t k0, int32_t k1,
                     const float* pa, const float* pb, float* __restrict oa, float* __restrict ob) {
  for (int32_t c0 = 0; c0 < width_v; c0 += kDotLanes) {
    float acc_a[kDotLanes], acc_b[kDotLanes];
    for (int32_t l = 0; l < kDotLanes; ++l) {
      acc_a[l] = oa[c0 + l];
      acc_b[l] = ob != nullptr ? ob[c0 + l] : 0.0f;
    }
    for (int32_t k = k0; k < k1; ++k) {
      if (!row.valid[k]) continue;
      const float* __restrict v = row.kv.data() + static_cast<size_t>(k) * width + c0;
      const float wa = pa[k - k0], wb = ob != nullptr ? pb[k - k0] : 0.0f;
      for (int32_t l = 0; l < kDotLanes; ++l) {
        acc_a[l] += wa * v[l];
        acc_b[l] += wb * v[l];
      }
    }
    for (int32_t l = 0; l < kDotLanes; ++l) {
      oa[c0 + l] = acc_a[l];
      if (ob != nullptr) ob[c0 + l] = acc_b[l];
    }
  }
}

// One call of the MMA kernel's host model (mma_head_tiled): the scratch sized for a block of
// block_h heads, and the kernel's steps for each block of heads of each query token: the tiles
// of one list folded into the block's online softmaxes, then the store of the block's heads,
// unsplit (the main tiles then the extra tiles), LSE-merged (each list alone, then the merge) or
// split (mla/split_kv.h: the splits' partials, then their combine).
template <Mutant M>
class MmaTiledRun {
 public:
  // tile: tokens per tile, mla::kMmaTokenTile (cpu-mma) or mla::kMmaSmallTokenTile
  // (cpu-mma-small, the sm_120-sized kernel configuration).
  MmaTiledRun(const HostCall& call, int32_t block_h, MmaScratch& s, bool lse_merged, int32_t split,
              int32_t tile)
      : call_(call),
        p_(call.p),
        cols_(padded_columns(p_.geom)),
        layout_(identity_layout(cols_, kDotLanes)),
        width_(layout_.width),
        w_(static_cast<size_t>(width_)),
        s_(s),
        block_h_(block_h),
        split_(split),
        tile_(tile),
        merged_(lse_merged && p_.has_extra) {
    s.q.resize(block_h * w_);
    s.o.resize(block_h * w_);
    s.x.resize(static_cast<size_t>(block_h) * tile);
    s.pb.resize(static_cast<size_t>(block_h) * tile);
    s.state.resize(block_h);
    if (merged_) {
      s.o2.resize(block_h * w_);
      s.state2.resize(block_h);
    }
  }

  // Every query token of every batch row, block of heads by block of heads.
  void run() {
    for (int32_t b = 0; b < p_.batch; ++b) {
      for (int32_t q = 0; q < p_.s_q; ++q) {
        decode_row<M, true>(main_list(call_, b, q), p_.conv, cols_, layout_, &s_.row);
        if (p_.has_extra) {
          decode_row<M, true>(extra_list(call_, b, q), p_.conv, cols_, layout_, &s_.extra);
        }
        for (int32_t h0 = 0; h0 < p_.heads; h0 += block_h_) {
          const int32_t nh = std::min(block_h_, p_.heads - h0);
          for (int32_t j = 0; j < nh; ++j) {
            load_q_bf16<M>(p_, cols_, layout_, b, q, h0 + j, s_.q.data() + j * w_);
            s_.state[j] = mla::SoftmaxState{};
          }
          if (split_ != mla::kSplitOff) {
            split_block(b, q, h0, nh);
          } else if (merged_) {
            lse_merged_block(b, q, h0, nh);
          } else {
            joint_block(b, q, h0, nh);
          }
        }
      }
    }
  }

 private:
  // S = Q K^T of tokens [k0, k1) of the tile beginning at k0 for the block's nh heads (two heads
  // per K load), scaled in fp32 after the product, into s.x; masked tokens and those past k1:
  // -inf.
  void logits(const DecodedRow& row, int32_t k0, int32_t k1, int32_t nh) {
    for (int32_t j = 0; j < nh; j += 2) {
      const bool pair = j + 1 < nh;
      float* xa = s_.x.data() + j * tile_;
      float* xb = pair ? xa + tile_ : nullptr;
      for (int32_t jj = 0; jj < tile_; ++jj) {
        const int32_t k = k0 + jj;
        if (k < k1 && row.valid[k]) {
          float da = 0, db = 0;
          dot_lanes2(s_.q.data() + j * w_, pair ? s_.q.data() + (j + 1) * w_ : nullptr,
                     row.kv.data() + static_cast<size_t>(k) * w_, width_, &da, &db);
          xa[jj] = da * p_.sm_scale;
          if (pair) xb[jj] = db * p_.sm_scale;
        } else {
          xa[jj] = mla::neg_inf();
          if (pair) xb[jj] = mla::neg_inf();
        }
      }
    }
  }

  // Folds tile t of one decoded list into the block's heads nh (one online softmax per head, in
  // `state` with output accumulators `o`): the logits, the softmax step, then P V.
  void fold_tile(const DecodedRow& row, int32_t topk, int32_t t, int32_t nh,
                 mla::SoftmaxState* state, float* o) {
    const int32_t k0 = t * tile_, k1 = std::min(topk, k0 + tile_);
    logits(row, k0, k1, nh);
    for (int32_t j = 0; j < nh; ++j) {
      softmax_tile<M>(s_.x.data() + j * tile_, tile_, cols_.width_v, state[j], o + j * w_,
                      s_.pb.data() + j * tile_);
    }
    for (int32_t j = 0; j < nh; j += 2) {
      const bool pair = j + 1 < nh;
      pv_tile2(row, width_, cols_.width_v, k0, k1, s_.pb.data() + j * tile_,
               pair ? s_.pb.data() + (j + 1) * tile_ : nullptr, o + j * w_,
               pair ? o + (j + 1) * w_ : nullptr);
    }
  }

  // Every tile of one decoded list, in order.
  void fold_list(const DecodedRow& row, int32_t topk, int32_t nh, mla::SoftmaxState* state,
                 float* o) {
    const int32_t tiles = num_token_tiles<M>(topk, tile_);
    for (int32_t t = 0; t < tiles; ++t) fold_tile(row, topk, t, nh, state, o);
  }

  // The store of the block's heads from s.state and s.o.
  void store_block(const HostCall& call, int32_t b, int32_t q, int32_t h0, int32_t nh) {
    for (int32_t j = 0; j < nh; ++j) {
      store_head<M>(call, cols_, layout_, b, q, h0 + j, s_.state[j], s_.o.data() + j * w_,
                    /*reciprocal=*/true);
    }
  }

  // The main tiles, then the extra tiles, through one online softmax (as FlashMLA's sparse
  // decode walks them).
  void joint_block(int32_t b, int32_t q, int32_t h0, int32_t nh) {
    std::fill(s_.o.begin(), s_.o.end(), 0.0f);
    fold_list(s_.row, p_.topk, nh, s_.state.data(), s_.o.data());
    if (p_.has_extra) fold_list(s_.extra, p_.extra_topk, nh, s_.state.data(), s_.o.data());
    store_block(call_, b, q, h0, nh);
  }

  // Each list alone, then the LSE merge (store_head_lse_merged).
  void lse_merged_block(int32_t b, int32_t q, int32_t h0, int32_t nh) {
    std::fill(s_.o.begin(), s_.o.end(), 0.0f);
    std::fill(s_.o2.begin(), s_.o2.end(), 0.0f);
    for (int32_t j = 0; j < nh; ++j) s_.state2[j] = mla::SoftmaxState{};
    fold_list(s_.row, p_.topk, nh, s_.state.data(), s_.o.data());
    fold_list(s_.extra, p_.extra_topk, nh, s_.state2.data(), s_.o2.data());
    for (int32_t j = 0; j < nh; ++j) {
      const mla::SoftmaxState st[2] = {s_.state[j], s_.state2[j]};
      const float* const o[2] = {s_.o.data() + j * w_, s_.o2.data() + j * w_};
      store_head_lse_merged(call_, cols_, layout_, b, q, h0 + j, st, o);
    }
  }

  // The split pipeline of one head block: tiles [0, nt_main) of the main list then [nt_main,
  // nt) of the extra list, cut into ns splits, each folded from a fresh state into its partial;
  // then the combine, and the store of the merged state.
  void split_block(int32_t b, int32_t q, int32_t h0, int32_t nh) {
    const int32_t nt_main = mla::list_tiles<M>(p_.topk, main_list(call_, b, q).topk_len, tile_);
    const int32_t nt_extra =
        p_.has_extra ? mla::list_tiles<M>(p_.extra_topk, extra_list(call_, b, q).topk_len, tile_)
                     : 0;
    const int32_t nt = nt_main + nt_extra;
    const int32_t ns = mla::split_count(nt, split_, mla::kHostModelSmCount);
    fold_splits(nt_main, nt, ns, h0, nh);
    for (int32_t j = 0; j < nh; ++j) combine_splits(ns, j);
    // kSinkPerSplit: the partials already hold the sink; the combine adds none.
    HostCall store_call = call_;
    if constexpr (M == Mutant::kSinkPerSplit) store_call.p.sink = nullptr;
    store_block(store_call, b, q, h0, nh);
  }

  // The ns splits' partials (m, l with the split's sink term, O) of the block's heads, in
  // s.part_m, s.part_l and s.part_o.
  void fold_splits(int32_t nt_main, int32_t nt, int32_t ns, int32_t h0, int32_t nh) {
    s_.part_m.resize(static_cast<size_t>(ns) * block_h_);
    s_.part_l.resize(static_cast<size_t>(ns) * block_h_);
    s_.part_o.resize(static_cast<size_t>(ns) * block_h_ * w_);
    for (int32_t i = 0; i < ns; ++i) {
      for (int32_t j = 0; j < nh; ++j) s_.state[j] = mla::SoftmaxState{};
      std::fill(s_.o.begin(), s_.o.end(), 0.0f);
      const int32_t tb = mla::split_tile_begin(nt, ns, i),
                    te = mla::split_tile_begin(nt, ns, i + 1);
      for (int32_t t = tb; t < te; ++t) {
        if (t < nt_main) {
          fold_tile(s_.row, p_.topk, t, nh, s_.state.data(), s_.o.data());
        } else {
          fold_tile(s_.extra, p_.extra_topk, t - nt_main, nh, s_.state.data(), s_.o.data());
        }
      }
      for (int32_t j = 0; j < nh; ++j) {
        const size_t at = static_cast<size_t>(i) * block_h_ + j;
        s_.part_m[at] = s_.state[j].m;
        s_.part_l[at] = mla::split_partial_l<M>(s_.state[j], p_.sink, h0 + j);
        std::copy(s_.o.begin() + j * w_, s_.o.begin() + (j + 1) * w_, s_.part_o.begin() + at * w_);
      }
    }
  }

  // The combine (mla/split_kv.h) of head j's ns partials: the merged state to s.state[j], the
  // merged O to s.o.
  void combine_splits(int32_t ns, int32_t j) {
    const mla::SoftmaxState merged =
        mla::merge_split_states<M>(s_.part_m.data() + j, s_.part_l.data() + j, ns, block_h_);
    float* O = s_.o.data() + j * w_;
    std::fill(O, O + w_, 0.0f);
    if (merged.m != mla::neg_inf()) {
      bool first = true;
      for (int32_t i = 0; i < ns; ++i) {
        const size_t at = static_cast<size_t>(i) * block_h_ + j;
        const float mi = s_.part_m[at];
        const float* Oi = s_.part_o.data() + at * w_;
        if constexpr (M == Mutant::kSplitEmptyNaN) {
          // Each split normalized by its own l, then weighted by a_i l_i: 0/0 when empty.
          const float wi = mla::mul_rn(mla::split_weight<M>(mi, merged.m), s_.part_l[at]);
          for (int32_t c = 0; c < cols_.width_v; ++c) {
            const float t = mla::mul_rn(wi, Oi[c] / s_.part_l[at]);
            O[c] = first ? t : mla::add_rn(O[c], t);
          }
          first = false;
          continue;
        }
        if (mi == mla::neg_inf()) continue;  // an empty split weighs 0: skipping is exact
        const float a = mla::split_weight<M>(mi, merged.m);
        for (int32_t c = 0; c < cols_.width_v; ++c) {
          const float t = mla::mul_rn(a, Oi[c]);
          O[c] = first ? t : mla::add_rn(O[c], t);
        }
        first = false;
      }
    }
    s_.state[j] = merged;
  }

  const HostCall& call_;
  const mla::DecodeParams& p_;
  const PaddedColumns cols_;
  const ColumnLayout layout_;
  const int32_t width_;
  const size_t w_;
  MmaScratch& s_;
  const int32_t block_h_;
  const int32_t split_;
  const int32_t tile_;
  const bool merged_;
};

template <Mutant M>
void mma_head_tiled(const HostCall& call, int32_t block_h, MmaScratch& s, bool lse_merged = false,
                    int32_t split = mla::kSplitOff, int32_t tile = mla::kMmaTokenTile) {
  MmaTiledRun<M>(call, block_h, s, lse_merged, split, tile).run();
}

// Backend name suffix of a split setting: "" (unsplit), "-split1", "-split" (automatic),
// "-split-max" (one split per tile), "-split<n>".
inline std::string split_suffix(int32_t split) {
  if (split == mla::kSplitOff) return "";
  if (split == mla::kSplitAuto) return "-split";
  if (split == mla::kSplitMax) return "-split-max";
  return "-split" + std::to_string(split);
}

template <Mutant M>
class CpuMmaBackend final : public TraitsBackend<Backend> {
 public:
  // split: mla::kSplitOff (the unsplit kernel), kSplitAuto, kSplitMax or a forced count n > 0.
  // tile: tokens per tile, 64 (mla::kMmaTokenTile) or 32 (mla::kMmaSmallTokenTile: the
  // sm_120-sized configuration, "cpu-mma-small"); any other value is taken as 64.
  explicit CpuMmaBackend(int block_h, bool lse_merged = false, int32_t split = mla::kSplitOff,
                         int32_t tile = mla::kMmaTokenTile)
      : block_h_(std::max(1, block_h)),
        lse_merged_(lse_merged),
        split_(split),
        tile_(valid_mma_tile(tile) ? tile : mla::kMmaTokenTile) {
    std::string& n = traits_.name;
    n = block_h_ == mla::kMmaDefaultBlockH ? "cpu-mma" : "cpu-mma-h" + std::to_string(block_h_);
    if (tile_ == mla::kMmaSmallTokenTile) n += "-small";
    if (lse_merged_) n += "-lse-merged";
    // The combine mutants always run the split pipeline: their name is the catalogue's.
    if (!mla::is_combine_mutant(M)) n += split_suffix(split_);
    if constexpr (M != Mutant::kNone) n += std::string("~") + mla::mutant_name(M);
    traits_.precision = Precision::kMmaBf16;
    // The kernel's envelope: a host model runs what the kernel it models runs.
    traits_.envelope = builtin_kernel_envelope();
    traits_.simt_partner = "cpu-simt";
    traits_.extra_pipeline = lse_merged_ ? ExtraPipeline::kLseMerged : ExtraPipeline::kJoint;
    traits_.splits_kv = split_ != mla::kSplitOff;
    traits_.token_tile = tile_ == mla::kMmaTokenTile ? 0 : tile_;
  }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    const int32_t split =
        split_ != mla::kSplitOff && m.split_override != 0 ? m.split_override : split_;
    return run_guarded(m, [this, split](const HostCall& c) {
      mma_head_tiled<M>(c, block_h_, scratch_, lse_merged_, split, tile_);
    });
  }

 private:
  int32_t block_h_;
  bool lse_merged_;
  int32_t split_;
  int32_t tile_;
  MmaScratch scratch_;
};

}  // namespace mlafuzz::host

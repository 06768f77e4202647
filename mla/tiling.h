// Token-tile sizes of the two kernels. The host models fold tokens in the same tiles, so the
// sequence of online-softmax rescales (and its rounding) is the same on CPU and GPU.
#pragma once

namespace mla {

// SIMT per-head kernel: tokens staged and folded 32 at a time.
inline constexpr int kSimtTokenTile = 32;
// MMA head-tiled kernel: 64 selected tokens gathered, dequantized to bf16 and folded at a time.
inline constexpr int kMmaTokenTile = 64;
// Default heads per MMA thread block (64 is the other supported value).
inline constexpr int kMmaDefaultBlockH = 32;
// The sm_120-sized MMA configuration (`cuda-mma-small`, host model `cpu-mma-small`):
// 32 selected tokens per tile, BLOCK_H 32, so that a block needs 97.25 KiB of shared memory
// (kernels/cuda/mma_head_tiled.cuh has the arithmetic). Its online-softmax tile boundaries are
// every 32 tokens, so its bits differ from the 64-token configuration's; the tolerance model
// counts its tiles (Backend::token_tile()).
inline constexpr int kMmaSmallTokenTile = 32;
inline constexpr int kMmaSmallBlockH = 32;

// Padded nope width used by the kernels: the next power of two (448 -> 512). Columns between
// nope_dim and the padded width are masked to zero on load and never stored.
constexpr int padded_nope(int nope) {
  int p = 1;
  while (p < nope) p *= 2;
  return p;
}

}  // namespace mla

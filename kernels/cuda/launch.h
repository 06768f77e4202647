// Launchers of the two CUDA sparse-decode kernels (docs/SPEC.md sections 3 and 4).
//
// Plain C++: no CUDA type appears here, so host code (the backends, a user's plugin) can call the
// kernels without including CUDA headers. Every pointer in the DecodeParams is a DEVICE pointer.
// Launchers check the kernel's preconditions (the envelope below) and return a
// cudaError_t-compatible code: 0 on success, never exit or abort. Device code traps only in
// debug builds (NDEBUG undefined).
#pragma once

#include <optional>
#include <string>

#include "mla/mla_params.h"

namespace mla::cuda {

// Return codes that are not CUDA errors (cudaError_t values are small positive numbers).
inline constexpr int kErrUnsupported = 100000;  // the case is outside the envelope
inline constexpr int kErrWorkspace = 100001;    // the split workspace is missing or too small

// Envelope shared by both kernels (nullopt: supported). Both kernels support any B >= 1,
// H >= 1 (128 and more), topk >= 1, page size >= 1, any page stride >= the layout minimum, both
// layouts, 16 <= nope_dim <= 512 (multiple of 16 and of scale_tile), scale_tile multiple of 8,
// 0 <= rope_dim <= 64 (multiple of 16), any q/out strides, -1 or negative indices per the
// convention, topk_length, an optional sink (+-inf allowed) and empty rows; and the production
// decode (docs/SPEC.md section 8): s_q >= 1 query tokens per row (the *_token_stride fields; unused
// when s_q = 1) and an optional extra cache (has_extra: its own pointer, paging, extra_topk >= 0,
// indices and strides, optional extra_topk_length; the main layout and dims) read in the same
// online softmax after the main list's tiles.
std::optional<std::string> simt_unsupported(const DecodeParams& p);
// block_h must be 32 or 64; H need not be a multiple of it (extra rows are masked). block_h 32
// on a device whose opt-in shared memory is below the default configuration's 157.5 KiB (sm_120:
// 99 KiB) checks the small configuration, which launch_mma_head_tiled then runs.
std::optional<std::string> mma_unsupported(const DecodeParams& p, int block_h);
// The sm_120-sized configuration: BLOCK_H 32, 8 warps, 32-token tiles, 97.25 KiB of
// shared memory per block (mma_head_tiled.cuh has the arithmetic). Its online-softmax tiles are
// 32 tokens (mla::kMmaSmallTokenTile): host model cpu-mma-small.
std::optional<std::string> mma_small_unsupported(const DecodeParams& p);
int launch_mma_head_tiled_small(const DecodeParams& p, void* stream);
// The token tile launch_mma_head_tiled(p, block_h) uses on the current device: 32 where block_h
// 32 runs the small configuration, else 64 (mla::kMmaTokenTile).
int mma_token_tile(int block_h);

// One thread block of 128 threads per (batch row, query token, head), fp32 pipeline. stream: a
// cudaStream_t (nullptr = default stream).
int launch_simt_per_head(const DecodeParams& p, void* stream);
// One thread block of 512 threads per (batch row, query token, block of block_h heads), mma.sync
// bf16 (H = 128: four blocks of 32 heads, or two of 64, per query token). block_h 32 runs the
// small configuration (256 threads) where the device needs it (mma_unsupported above).
int launch_mma_head_tiled(const DecodeParams& p, int block_h, void* stream);
// The same kernel with an explicit number of warps per 16-head group (block_h 32: 8, the
// default, or 4; block_h 64: 4). For benchmarks comparing the configurations; the outputs of
// every configuration are bitwise identical.
int launch_mma_head_tiled_warps(const DecodeParams& p, int block_h, int warps_per_group,
                                void* stream);

// Split-KV (mla/split_kv.h, kernels/cuda/combine.cuh): the MMA kernel
// with each row's tiles cut into splits (split: n >= 1 forced, mla::kSplitAuto the row rule,
// mla::kSplitMax one split per tile) writing fp32 partials to `workspace`, then the combine
// kernel, both on `stream`. The workspace (device memory, at least mma_split_workspace_bytes)
// is the caller's, so that a backend keeps one between calls; kErrWorkspace when too small.
size_t mma_split_workspace_bytes(const DecodeParams& p, int block_h, int split);
int launch_mma_split(const DecodeParams& p, int block_h, int split, void* workspace,
                     size_t workspace_bytes, void* stream);

// Diagnostics: decodes all 256 e4m3 encodings with the kernels' fast path (fp8x2 -> half2 ->
// float2) on the device into host_out[256], so a test can prove it bit-exact against
// mla::e4m3_to_float. Returns 0 or a cudaError_t value.
int e4m3_table_on_device(float* host_out);

}  // namespace mla::cuda

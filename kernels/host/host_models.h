// Host models of the two CUDA kernels: CPU backends that follow each kernel's precision pipeline
// and token-tile order (docs/SPEC.md section 4), reading the cache through the same shared
// host-device code (mla). CI has no GPU: these are what its differential tests run.
//
// - cpu-simt (Precision::kSimtFp32), the per-head SIMT kernel: q * sm_scale in fp32, K and V
//   dequantized to fp32, dot products, online softmax over tiles of mla::kSimtTokenTile tokens
//   and P*V in fp32, output rounded to bf16.
// - cpu-mma (Precision::kMmaBf16), the head-tiled tensor-core kernel: q bf16 unscaled, K and V
//   dequantized to bf16, fp32 products and accumulation, logits scaled in fp32 after the
//   product, tiles of mla::kMmaTokenTile tokens, p rounded to bf16 for P*V while the row sum
//   keeps fp32 p, heads in blocks of BLOCK_H, output rounded to bf16.
//
// Both support every case the harness can build (no "unsupported"): both layouts, any page size,
// stride and page order, -1/negative indices, topk_length, sinks, strided q and out. A run never
// aborts: inconsistent buffers come back as RunStatus::kError. One backend object runs one case
// at a time (it reuses its scratch buffers); use one object per thread.
#pragma once

#include <memory>

#include "core/backend.h"

namespace mlafuzz {

std::unique_ptr<Backend> make_cpu_simt_backend();  // "cpu-simt"
// "cpu-mma" for block_h 32 (the kernel's default), "cpu-mma-h<block_h>" otherwise (64 is the
// kernel's other option; any block_h >= 1 works on the host, and results never depend on it).
std::unique_ptr<Backend> make_cpu_mma_backend(int block_h = 32);
// "cpu-mma-small": the model of the sm_120-sized kernel configuration (cuda-mma-small, and
// cuda-mma where the device's shared memory needs it): the same pipeline with 32-token tiles
// (mla::kMmaSmallTokenTile), so its online-softmax rescales fall every 32 tokens and its row sum
// adds 4 chunk sums per tile. Backend::token_tile() is 32.
std::unique_ptr<Backend> make_cpu_mma_small_backend();
// "cpu-mma-lse-merged": the same bf16/fp32 MMA pipeline, but the production decode's extra cache
// is computed alone and LSE-merged with the main list's result (two bf16 roundings; SGLang's
// Triton path, ExtraPipeline::kLseMerged): the reference for the LSE-merged tolerance bound.
std::unique_ptr<Backend> make_cpu_mma_lse_merged_backend();
// The split-KV host model (mla/split_kv.h), BLOCK_H 32: split 1 ->
// "cpu-mma-split1" (the split pipeline with one split: cpu-mma's bits), 0 -> "cpu-mma-split"
// (the automatic rule, for a 132-SM device), -1 -> "cpu-mma-split-max" (one split per tile),
// n > 1 -> "cpu-mma-split<n>". Throws std::invalid_argument below -1.
std::unique_ptr<Backend> make_cpu_mma_split_backend(int split);

}  // namespace mlafuzz

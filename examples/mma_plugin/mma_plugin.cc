// An mlafuzz device plugin wrapping the built-in tensor-core MMA kernel (kernels/cuda/launch.h).
//
// It is the template for wrapping your own CUDA kernel: translate the plugin call into your
// kernel's parameters, check its envelope in mlafuzz_plugin_supports, launch on the given stream
// and return the error code. Everything here is host code; the kernel itself is linked in from
// mlafuzz's CUDA library. Test it (on a machine with a GPU) with
//
//   mlafuzz plugin-info build/examples/libmlafuzz_mma_plugin.so
//   mlafuzz fuzz --backends plugin:build/examples/libmlafuzz_mma_plugin.so,cuda-simt --time 60s
//
// It must behave exactly like the built-in cuda-mma backend: same bits, same envelope.
#include <cstdio>
#include <string>

#include "kernels/cuda/launch.h"
#include "mla/mla_params.h"
#include "mla/tiling.h"
#include "mlafuzz/plugin.h"

namespace {

constexpr int kBlockH = mla::kMmaDefaultBlockH;

void write_message(char* buf, size_t len, const std::string& msg) {
  if (buf != nullptr && len > 0) std::snprintf(buf, len, "%s", msg.c_str());
}

// The plugin call, field by field, as the kernel's parameter struct.
mla::DecodeParams to_params(const MlafuzzDecodeCall& c) {
  mla::DecodeParams p;
  p.geom.layout = c.layout == MLAFUZZ_LAYOUT_MODEL1 ? mla::Layout::kModel1 : mla::Layout::kV32;
  p.geom.nope_dim = c.nope_dim;
  p.geom.rope_dim = c.rope_dim;
  p.geom.scale_tile = c.scale_tile;
  p.geom.page_size = c.page_size;
  p.geom.page_stride = c.page_stride;
  p.geom.num_pages = c.num_pages;
  p.conv.invalid_index = c.invalid_index_rule == MLAFUZZ_INVALID_MINUS_ONE_ONLY
                             ? mla::InvalidIndexRule::kMinusOneOnly
                             : mla::InvalidIndexRule::kAnyNegative;
  p.conv.empty_lse = c.empty_row_lse == MLAFUZZ_EMPTY_LSE_POS_INF ? mla::EmptyRowLse::kPosInf
                                                                  : mla::EmptyRowLse::kNegInf;
  p.conv.sink_in_lse = c.sink_in_lse != 0;
  p.batch = c.batch;
  p.heads = c.heads;
  p.topk = c.topk;
  p.sm_scale = c.sm_scale;
  p.q = c.q;
  p.q_head_stride = c.q_head_stride;
  p.q_batch_stride = c.q_batch_stride;
  p.kv_cache = c.kv_cache;
  p.indices = c.indices;
  p.indices_batch_stride = c.indices_batch_stride;
  p.topk_length = c.topk_length;
  p.sink = c.sink;
  p.out = c.out;
  p.out_head_stride = c.out_head_stride;
  p.out_batch_stride = c.out_batch_stride;
  p.lse = c.lse;
  p.lse_batch_stride = c.lse_batch_stride;
  // ABI version 2: the production decode (s_q query tokens per row, the extra cache).
  p.s_q = c.s_q;
  p.q_token_stride = c.q_token_stride;
  p.indices_token_stride = c.indices_token_stride;
  p.out_token_stride = c.out_token_stride;
  p.lse_token_stride = c.lse_token_stride;
  if (c.has_extra != 0) {
    p.has_extra = true;
    p.extra_geom = p.geom;
    p.extra_geom.page_size = c.extra_page_size;
    p.extra_geom.num_pages = c.extra_num_pages;
    p.extra_geom.page_stride = c.extra_page_stride;
    p.extra_kv_cache = c.extra_kv_cache;
    p.extra_topk = c.extra_topk;
    p.extra_indices = c.extra_indices;
    p.extra_indices_batch_stride = c.extra_indices_batch_stride;
    p.extra_indices_token_stride = c.extra_indices_token_stride;
    p.extra_topk_length = c.extra_topk_length;
  }
  return p;
}

}  // namespace

extern "C" {

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_abi_version(void) { return MLAFUZZ_PLUGIN_ABI_VERSION; }

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info) {
  info->abi_version = MLAFUZZ_PLUGIN_ABI_VERSION;
  std::snprintf(info->name, sizeof info->name, "%s", "mma-kernel-example");
  std::snprintf(info->description, sizeof info->description, "%s",
                "example device plugin: the built-in mma.sync bf16 head-tiled kernel, BLOCK_H 32");
  info->runs_on = MLAFUZZ_RUNS_ON_DEVICE;
  info->precision = MLAFUZZ_PRECISION_BF16_MMA;
  info->inexact_invariants = 0;  // one block per (row, 32 heads), fixed order: all exact
  info->extra_pipeline = MLAFUZZ_EXTRA_JOINT;
  return 0;
}

// The kernel's envelope (kernels/cuda/launch.h), so that mlafuzz generates only cases it takes.
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_envelope(MlafuzzEnvelope* env) {
  env->abi_version = MLAFUZZ_PLUGIN_ABI_VERSION;
  env->nope_dim.min = 16;
  env->nope_dim.max = 512;
  env->nope_dim.multiple_of = 16;
  env->rope_dim.max = 64;
  env->rope_dim.multiple_of = 16;
  env->scale_tile.multiple_of = 8;
  env->batch.max = 65535;  // any s_q, the extra cache, any H
  return 0;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_supports(const MlafuzzDecodeCall* call, char* reason,
                                                  size_t reason_len) {
  if (const auto why = mla::cuda::mma_unsupported(to_params(*call), kBlockH)) {
    write_message(reason, reason_len, *why);
    return 0;
  }
  return 1;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* call, char* err,
                                             size_t err_len) {
  if (call->memory != MLAFUZZ_RUNS_ON_DEVICE) {
    write_message(err, err_len, "expected device pointers");
    return 1;
  }
  const int rc = mla::cuda::launch_mma_head_tiled(to_params(*call), kBlockH, call->stream);
  if (rc != 0) {
    write_message(err, err_len, "launch_mma_head_tiled returned " + std::to_string(rc));
  }
  return rc;
}

}  // extern "C"

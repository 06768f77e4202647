/* Variants of the example CPU plugin (examples/cpu_plugin/cpu_plugin.c) for the envelope and
 * invariance-claim tests, one shared library per VARIANT (tests/plugins/CMakeLists.txt):
 *   VARIANT_FLASHMLA       a FlashMLA-like envelope (the sm90 MODEL1 decode kernel's limits):
 *                          MODEL1 448/64/64 only, H <= 64, topk a multiple of 64, page stride a
 *                          multiple of 16 bytes, FlashMLA's conventions only (-1 invalid, +inf
 *                          LSE of empty rows, sink excluded from the LSE); supports() refuses
 *                          exactly what the envelope excludes.
 *   VARIANT_BATCH_ORDER    sums each row's tokens starting at entry B % n (the order depends
 *                          on the batch size, like a split-KV scheduler's), and claims every
 *                          invariant exact: batch-alone must fail bit for bit.
 *   VARIANT_BATCH_ORDER_INEXACT  the same kernel, declaring batch inexact: batch-alone is
 *                          checked within the bound, and passes.
 *   VARIANT_BATCH_WRONG_INEXACT  declares batch inexact but is grossly wrong for B = 1 (out
 *                          scaled by 1.5): the bounded batch-alone check must still fail.
 *   VARIANT_LSE_MERGED     the example kernel declaring extra_pipeline = MLAFUZZ_EXTRA_LSE_MERGED
 *                          (the declaration's path to the tolerance model is what is tested). */
#define mlafuzz_plugin_info example_plugin_info
#define mlafuzz_plugin_run example_plugin_run
#define mlafuzz_plugin_supports example_plugin_supports
#define mlafuzz_plugin_envelope example_plugin_envelope
#include "../../examples/cpu_plugin/cpu_plugin.c"
#undef mlafuzz_plugin_info
#undef mlafuzz_plugin_run
#undef mlafuzz_plugin_supports
#undef mlafuzz_plugin_envelope

#define VARIANT_FLASHMLA 1
#define VARIANT_BATCH_ORDER 2
#define VARIANT_BATCH_ORDER_INEXACT 3
#define VARIANT_BATCH_WRONG_INEXACT 4
#define VARIANT_LSE_MERGED 5

#ifndef VARIANT
#error "define VARIANT"
#endif

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_supports(const MlafuzzDecodeCall* c, char* reason,
                                                  size_t reason_len);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err, size_t err_len);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_envelope(MlafuzzEnvelope* env);

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info) {
  static const char* const names[] = {"",
                                      "flashmla-like",
                                      "batch-order-exact",
                                      "batch-order-inexact",
                                      "batch-wrong-inexact",
                                      "lse-merged-declared"};
  example_plugin_info(info);
  snprintf(info->name, sizeof info->name, "%s", names[VARIANT]);
#if VARIANT == VARIANT_BATCH_ORDER_INEXACT || VARIANT == VARIANT_BATCH_WRONG_INEXACT
  info->inexact_invariants = MLAFUZZ_INVARIANT_BATCH;
#endif
#if VARIANT == VARIANT_LSE_MERGED
  info->extra_pipeline = MLAFUZZ_EXTRA_LSE_MERGED;
#endif
  return 0;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_envelope(MlafuzzEnvelope* env) {
  example_plugin_envelope(env);
#if VARIANT == VARIANT_FLASHMLA
  env->layouts = 1u << MLAFUZZ_LAYOUT_MODEL1;
  env->nope_dim.count = 1;
  env->nope_dim.values[0] = 448;
  env->rope_dim.count = 1;
  env->rope_dim.values[0] = 64;
  env->scale_tile.count = 1;
  env->scale_tile.values[0] = 64;
  env->heads.max = 64;
  env->topk.multiple_of = 64;
  env->page_stride_multiple = 16;
  env->invalid_index_rules = 1u << MLAFUZZ_INVALID_MINUS_ONE_ONLY;
  env->empty_row_lses = 1u << MLAFUZZ_EMPTY_LSE_POS_INF;
  env->sink_in_lse = 1u << 0; /* excluded */
#endif
  return 0;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_supports(const MlafuzzDecodeCall* c, char* reason,
                                                  size_t reason_len) {
#if VARIANT == VARIANT_FLASHMLA
  if (c->layout != MLAFUZZ_LAYOUT_MODEL1 || c->nope_dim != 448 || c->rope_dim != 64 ||
      c->scale_tile != 64) {
    write_message(reason, reason_len, "only MODEL1 448 + 64, scale tile 64");
    return 0;
  }
  if (c->heads > 64) {
    write_message(reason, reason_len, "at most 64 heads");
    return 0;
  }
  if (c->topk % 64 != 0) {
    write_message(reason, reason_len, "topk must be a multiple of 64");
    return 0;
  }
  if (c->page_stride % 16 != 0) {
    write_message(reason, reason_len, "page stride must be a multiple of 16 bytes");
    return 0;
  }
  if (c->invalid_index_rule != MLAFUZZ_INVALID_MINUS_ONE_ONLY ||
      c->empty_row_lse != MLAFUZZ_EMPTY_LSE_POS_INF || c->sink_in_lse) {
    write_message(reason, reason_len, "FlashMLA's conventions only");
    return 0;
  }
#endif
  return example_plugin_supports(c, reason, reason_len);
}

#if VARIANT == VARIANT_FLASHMLA
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err,
                                             size_t err_len) {
  return example_plugin_run(c, err, err_len);
}
#else
/* The row's valid prefix (topk_length) rotated to start at entry B % n: the same tokens, summed
 * in an order that depends on the batch size. */
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err,
                                             size_t err_len) {
  MlafuzzDecodeCall r = *c;
  int32_t* idx = malloc(sizeof(int32_t) * (size_t)(c->batch > 0 ? c->batch : 1) *
                        (size_t)(c->topk > 0 ? c->topk : 1));
  int b, k, rc;
  if (idx == NULL) {
    write_message(err, err_len, "out of memory");
    return 2;
  }
  for (b = 0; b < c->batch; ++b) {
    const int32_t* row = c->indices + b * c->indices_batch_stride;
    int n = c->topk;
    if (c->topk_length != NULL && c->topk_length[b] < n) n = c->topk_length[b];
    if (n < 0) n = 0;
    for (k = 0; k < c->topk; ++k) {
      idx[b * c->topk + k] = k < n ? row[(k + c->batch) % n] : row[k];
    }
  }
  r.indices = idx;
  r.indices_batch_stride = c->topk;
  rc = example_plugin_run(&r, err, err_len);
  free(idx);
#if VARIANT == VARIANT_BATCH_WRONG_INEXACT
  if (rc == 0 && c->batch == 1) {
    int h, d;
    for (h = 0; h < c->heads; ++h) {
      uint16_t* out = c->out + h * c->out_head_stride;
      for (d = 0; d < c->d_v; ++d) out[d] = f32_to_bf16(1.5f * bf16_to_f32(out[d]));
    }
  }
#endif
  return rc;
}
#endif

/* An mlafuzz host plugin in plain C: sparse MLA decode over an FP8 paged KV cache with the fp32
 * pipeline of the SIMT kernel (docs/SPEC.md section 4), written as loops from the formulas.
 *
 * It shows everything a plugin does: declare itself (name, host, precision, the invariants it
 * keeps exactly), declare what it accepts (its envelope: cases are generated inside it), say
 * which calls it supports, and compute out and lse reading only what a correct kernel needs.
 * It is written for ABI version 2 and compiles against the version-1 header too (the tests
 * build it both ways: a version-1 plugin keeps working). Build it as a shared library against
 * include/mlafuzz/plugin.h and test it with
 *
 *   mlafuzz plugin-info build/examples/libmlafuzz_cpu_plugin.so
 *   mlafuzz fuzz --backends plugin:build/examples/libmlafuzz_cpu_plugin.so --cases 200
 *
 * Pipeline: q * sm_scale in fp32; K and V dequantized to fp32 (exact for power-of-two scales);
 * dot products in fp32; softmax in fp32 with the row max subtracted (two passes over the row's
 * logits); P*V in fp32; out rounded to bf16 (round to nearest even) on store. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlafuzz/plugin.h"

static float bf16_to_f32(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                 /* nearest even */
}

/* e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is subnormal; 0x7f and 0xff
 * are NaN; no infinities. */
static float e4m3_to_f32(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) return NAN;
  if (exp == 0) {
    v = ldexpf((float)man, -9);
  } else {
    v = ldexpf((float)(8 + man), exp - 10);
  }
  return sign ? -v : v;
}

static float read_f32_le(const uint8_t* p) {
  const uint32_t u =
      (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Dequantizes the d_qk dims of the token at global slot idx into k[0..d_qk). */
static void dequant_token(const MlafuzzDecodeCall* c, int64_t idx, float* k) {
  const int64_t page = idx / c->page_size, slot = idx % c->page_size;
  const uint8_t* base = c->kv_cache + page * c->page_stride;
  const int tiles = c->nope_dim / c->scale_tile;
  const uint8_t *nope, *rope;
  int d;
  if (c->layout == MLAFUZZ_LAYOUT_MODEL1) {
    const int64_t data_bytes = c->nope_dim + 2 * c->rope_dim;
    const int64_t scale_bytes = (tiles + 7) / 8 * 8;
    const uint8_t* scales = base + c->page_size * data_bytes + slot * scale_bytes;
    nope = base + slot * data_bytes;
    rope = nope + c->nope_dim;
    for (d = 0; d < c->nope_dim; ++d) {
      /* ue8m0: scale = 2^(byte - 127) */
      k[d] = e4m3_to_f32(nope[d]) * ldexpf(1.0f, (int)scales[d / c->scale_tile] - 127);
    }
  } else {
    nope = base + slot * c->token_bytes;
    rope = nope + c->nope_dim + 4 * tiles;
    for (d = 0; d < c->nope_dim; ++d) {
      k[d] = e4m3_to_f32(nope[d]) * read_f32_le(nope + c->nope_dim + 4 * (d / c->scale_tile));
    }
  }
  for (d = 0; d < c->rope_dim; ++d) {
    k[c->nope_dim + d] = bf16_to_f32((uint16_t)(rope[2 * d] | (rope[2 * d + 1] << 8)));
  }
}

static int is_valid(const MlafuzzDecodeCall* c, int b, int k) {
  const int32_t idx = c->indices[b * c->indices_batch_stride + k];
  if (c->topk_length != NULL && k >= c->topk_length[b]) return 0;
#if MLAFUZZ_PLUGIN_ABI_VERSION >= 2
  /* Every index outside the cache is an invalid entry (the envelope below names this rule). */
  if (c->invalid_index_rule == MLAFUZZ_INVALID_OUT_OF_RANGE) {
    return idx >= 0 && idx < (int64_t)c->num_pages * c->page_size;
  }
#endif
  return c->invalid_index_rule == MLAFUZZ_INVALID_MINUS_ONE_ONLY ? idx != -1 : idx >= 0;
}

static void write_message(char* buf, size_t len, const char* msg) {
  if (buf != NULL && len > 0) snprintf(buf, len, "%s", msg);
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_abi_version(void) { return MLAFUZZ_PLUGIN_ABI_VERSION; }

#ifndef CPU_PLUGIN_NAME
#define CPU_PLUGIN_NAME "cpu-fp32-example"
#endif

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info) {
  info->abi_version = MLAFUZZ_PLUGIN_ABI_VERSION;
  snprintf(info->name, sizeof info->name, "%s", CPU_PLUGIN_NAME);
  snprintf(info->description, sizeof info->description, "%s",
           "example host plugin in C: fp32 SIMT pipeline, two-pass softmax, bf16 store");
  info->runs_on = MLAFUZZ_RUNS_ON_HOST;
  info->precision = MLAFUZZ_PRECISION_FP32_SIMT;
#if MLAFUZZ_PLUGIN_ABI_VERSION >= 2
  /* One thread, a fixed loop order per (row, head): every invariant holds bit for bit. */
  info->inexact_invariants = 0;
  info->extra_pipeline = MLAFUZZ_EXTRA_JOINT;
#endif
  return 0;
}

#if MLAFUZZ_PLUGIN_ABI_VERSION >= 2
/* What this kernel accepts: the version-1 decode only (one query token per row, no extra cache:
 * it reads none of the version-2 fields), any dims and strides, every invalid-index rule
 * (out_of_range too: is_valid masks every index outside the cache) and both V32 scale
 * conventions (it reads the stored float as it is). mlafuzz generates cases inside this
 * envelope; supports() below still has the final word. */
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_envelope(MlafuzzEnvelope* env) {
  env->abi_version = MLAFUZZ_PLUGIN_ABI_VERSION;
  env->s_q.count = 1;
  env->s_q.values[0] = 1;
  env->refuses = MLAFUZZ_FEATURE_EXTRA_CACHE | MLAFUZZ_FEATURE_EXTRA_TOPK_LENGTH;
  env->invalid_index_rules = (1u << MLAFUZZ_INVALID_MINUS_ONE_ONLY) |
                             (1u << MLAFUZZ_INVALID_ANY_NEGATIVE) |
                             (1u << MLAFUZZ_INVALID_OUT_OF_RANGE);
  /* Appended within version 2: written only where the caller's struct holds it. */
  if (env->struct_size > MLAFUZZ_ENVELOPE_BASE_SIZE) {
    env->v32_scales = (1u << MLAFUZZ_V32_SCALES_POWER_OF_TWO) | (1u << MLAFUZZ_V32_SCALES_FP32);
  }
  return 0;
}
#endif

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_supports(const MlafuzzDecodeCall* c, char* reason,
                                                  size_t reason_len) {
  if (c->layout != MLAFUZZ_LAYOUT_MODEL1 && c->layout != MLAFUZZ_LAYOUT_V32) {
    write_message(reason, reason_len, "unknown layout");
    return 0;
  }
  if (c->scale_tile <= 0 || c->nope_dim % c->scale_tile != 0) {
    write_message(reason, reason_len, "nope_dim must be a multiple of scale_tile");
    return 0;
  }
#if MLAFUZZ_PLUGIN_ABI_VERSION >= 2
  if (c->struct_size > MLAFUZZ_DECODE_CALL_V1_SIZE && (c->s_q != 1 || c->has_extra)) {
    write_message(reason, reason_len, "s_q > 1 and the extra cache are not implemented");
    return 0;
  }
#endif
  return 1;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err,
                                             size_t err_len) {
  const int dqk = c->d_qk, dv = c->d_v;
  float* keys;  /* [topk, d_qk] the row's selected tokens, dequantized */
  float* logit; /* [topk] */
  float* qs;    /* [d_qk] q * sm_scale */
  float* acc;   /* [d_v] */
  int b, h, k, d;
  if (c->struct_size < sizeof(MlafuzzDecodeCall) || c->memory != MLAFUZZ_RUNS_ON_HOST) {
    write_message(err, err_len, "expected a host call of this ABI");
    return 1;
  }
  keys = malloc(sizeof(float) * (size_t)(c->topk > 0 ? c->topk : 1) * (size_t)dqk);
  logit = malloc(sizeof(float) * (size_t)(c->topk > 0 ? c->topk : 1));
  qs = malloc(sizeof(float) * (size_t)dqk);
  acc = malloc(sizeof(float) * (size_t)dv);
  if (keys == NULL || logit == NULL || qs == NULL || acc == NULL) {
    free(keys), free(logit), free(qs), free(acc);
    write_message(err, err_len, "out of memory");
    return 2;
  }
  for (b = 0; b < c->batch; ++b) {
    /* Dequantize each valid selected token once per row; never touch the invalid ones. */
    for (k = 0; k < c->topk; ++k) {
      if (is_valid(c, b, k)) {
        dequant_token(c, c->indices[b * c->indices_batch_stride + k], keys + (size_t)k * dqk);
      }
    }
    for (h = 0; h < c->heads; ++h) {
      const uint16_t* q = c->q + b * c->q_batch_stride + h * c->q_head_stride;
      uint16_t* out = c->out + b * c->out_batch_stride + h * c->out_head_stride;
      float* lse = c->lse + b * c->lse_batch_stride + h;
      float m = -INFINITY, l = 0.0f, denom;
      int any = 0;
      for (d = 0; d < dqk; ++d) qs[d] = bf16_to_f32(q[d]) * c->sm_scale;
      for (k = 0; k < c->topk; ++k) {
        float x = 0.0f;
        if (!is_valid(c, b, k)) continue;
        for (d = 0; d < dqk; ++d) x += qs[d] * keys[(size_t)k * dqk + d];
        logit[k] = x;
        if (!any || x > m) m = x;
        any = 1;
      }
      if (!any) {
        /* Empty row: out = 0 whatever the sink; lse per the convention. */
        for (d = 0; d < dv; ++d) out[d] = 0;
        *lse = c->empty_row_lse == MLAFUZZ_EMPTY_LSE_POS_INF ? INFINITY : -INFINITY;
        continue;
      }
      for (d = 0; d < dv; ++d) acc[d] = 0.0f;
      for (k = 0; k < c->topk; ++k) {
        float p;
        if (!is_valid(c, b, k)) continue;
        p = expf(logit[k] - m);
        l += p;
        for (d = 0; d < dv; ++d) acc[d] += p * keys[(size_t)k * dqk + d];
      }
      /* A +inf sink makes the denominator +inf (out = 0); a -inf sink adds exp(-inf) = 0. A
       * sink more than ~88 above m overflows exp in fp32: out is then 0, where the exact value
       * is below e^-88 times |V|. */
      denom = c->sink != NULL ? l + expf(c->sink[h] - m) : l;
      for (d = 0; d < dv; ++d) out[d] = f32_to_bf16(acc[d] / denom);
      *lse = m + logf(l);
      if (c->sink != NULL && c->sink_in_lse) {
        /* ln(l e^m + e^sink) around the larger of m and the sink, so that a large sink does not
         * overflow exp (found by mlafuzz: sink 144 gave lse = +inf). */
        const float s = c->sink[h];
        const float big = s > m ? s : m;
        *lse = s == INFINITY ? INFINITY : big + logf(l * expf(m - big) + expf(s - big));
      }
    }
  }
  free(keys), free(logit), free(qs), free(acc);
  return 0;
}

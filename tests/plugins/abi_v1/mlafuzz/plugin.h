/* mlafuzz plugin ABI: test your own sparse-decode MLA kernel with mlafuzz.
 *
 * A plugin is a shared library (.so) that exports the C functions declared at the end of this
 * header. mlafuzz loads it with dlopen when a backend is named "plugin:/path/libmykernel.so":
 *
 *   mlafuzz fuzz --backends oracle,plugin:/path/libmykernel.so
 *   mlafuzz run --case corpus/x.json --backends plugin:/path/libmykernel.so
 *   mlafuzz plugin-info /path/libmykernel.so
 *
 * The plugin then takes part like a built-in backend: every property (tolerance against the
 * float64 oracle, poison invariance, relocation, batch/head independence, determinism, ...) is
 * evaluated on it, failures are shrunk and saved to the corpus. In `mlafuzz fuzz` a plugin runs
 * in an isolated worker process, so a crash or a hang becomes a finding, not a dead campaign.
 *
 * The problem (docs/SPEC.md section 3, one query row b and head h, one shared KV head):
 *   valid(k)  = indices[b][k] is not invalid (see invalid_index_rule) and k < topk_length[b]
 *   x_k       = sm_scale * <q[b][h], K(indices[b][k])>          over all d_qk dims
 *   lse[b][h] = ln(sum over valid k of exp(x_k))                  (sink excluded unless
 *                                                                  sink_in_lse is set)
 *   out[b][h] = sum_k exp(x_k) V(k) / (sum_k exp(x_k) + exp(sink[h]))   (sink term optional)
 *   no valid k: out = 0; lse = +inf or -inf per empty_row_lse.
 * indices are global slots: page = idx / page_size, slot = idx % page_size (no block table).
 * The byte layouts of the paged FP8 cache are described at MlafuzzLayout below.
 *
 * Rules a plugin must follow:
 * - Pure C ABI: no C++ type crosses it. Every struct begins with struct_size and abi_version;
 *   mlafuzz never calls a plugin whose mlafuzz_plugin_abi_version() differs from the
 *   MLAFUZZ_PLUGIN_ABI_VERSION it was built with.
 * - Write only out (d_v elements per head, never the padding between heads: those elements are
 *   canaries) and lse. Read only what a correct kernel needs: mlafuzz poisons everything else
 *   with NaNs and garbage and checks that no output bit changes.
 * - Return errors, never exit or abort. A message written into err/reason (NUL-terminated,
 *   truncated to the given length) is shown to the user.
 * - Device plugins receive device pointers and a CUDA stream; they may launch asynchronously
 *   on that stream (mlafuzz synchronizes the device and checks for errors afterwards; a device
 *   fault is reported as a finding). Host plugins receive host pointers and stream = NULL.
 * - Calls are made from one thread at a time; a plugin may keep state between calls, but its
 *   result must depend only on the call (the determinism property checks two runs bit for bit).
 *
 * Versioning: MLAFUZZ_PLUGIN_ABI_VERSION changes whenever a struct layout or a function
 * signature changes. Fields may only be appended within one version; struct_size tells the
 * plugin how much of a struct the caller knows.
 *
 * A complete host plugin (plain C, fp32 pipeline): examples/cpu_plugin/cpu_plugin.c.
 * A device plugin wrapping the built-in MMA kernel: examples/mma_plugin/mma_plugin.cc.
 */
#ifndef MLAFUZZ_PLUGIN_H_
#define MLAFUZZ_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version of this header. A plugin returns it from mlafuzz_plugin_abi_version() and
 * writes it into MlafuzzPluginInfo.abi_version. */
#define MLAFUZZ_PLUGIN_ABI_VERSION 1

/* Marks the plugin's entry points as exported (use it on the definitions). */
#if defined(_WIN32)
#define MLAFUZZ_PLUGIN_EXPORT __declspec(dllexport)
#else
#define MLAFUZZ_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ---- Enumerations (stored as int32_t in the structs, so their size is fixed) ---- */

/* KV cache layouts (docs/SPEC.md section 2). Sizes below are for the production dims; every size is
 * a parameter of the call (nope_dim, rope_dim, scale_tile, page_size, page_stride).
 *
 * MODEL1 (DeepSeek-V4-Flash), per page at base = page * page_stride:
 *   data(token j)  = base + j * (nope_dim + 2 * rope_dim)
 *                    [nope_dim x e4m3fn bytes][rope_dim x bf16, little-endian]
 *   scale(token j) = base + page_size * (nope_dim + 2 * rope_dim) + j * scale_row_bytes
 *                    one ue8m0 byte per scale tile: scale_t = 2^(byte - 127) for nope dims
 *                    [t * scale_tile, (t + 1) * scale_tile); scale_row_bytes = the tile count
 *                    rounded up to 8 (the pad bytes are never read).
 *   d_qk = d_v = nope_dim + rope_dim: V is the whole dequantized vector, rope included.
 * V32 (DeepSeek-V3.2), per token at base = page * page_stride + j * token_bytes:
 *   [nope_dim x e4m3fn][nope_dim / scale_tile x float32 scale][rope_dim x bf16]
 *   d_qk = nope_dim + rope_dim, d_v = nope_dim (V is the dequantized nope part only).
 * K[d] = e4m3(byte[d]) * scale_{d / scale_tile} for d < nope_dim, K[nope_dim + r] = rope[r]. */
typedef enum MlafuzzLayout { MLAFUZZ_LAYOUT_MODEL1 = 0, MLAFUZZ_LAYOUT_V32 = 1 } MlafuzzLayout;

/* Which negative indices mark an invalid top-k entry. */
typedef enum MlafuzzInvalidIndexRule {
  MLAFUZZ_INVALID_MINUS_ONE_ONLY = 0, /* FlashMLA: only exactly -1 (other negatives never sent) */
  MLAFUZZ_INVALID_ANY_NEGATIVE = 1    /* SGLang, vLLM: any negative index */
} MlafuzzInvalidIndexRule;

/* LSE of a row with no valid token. */
typedef enum MlafuzzEmptyRowLse {
  MLAFUZZ_EMPTY_LSE_POS_INF = 0, /* FlashMLA */
  MLAFUZZ_EMPTY_LSE_NEG_INF = 1  /* SGLang, vLLM */
} MlafuzzEmptyRowLse;

/* Where the plugin's kernel runs, and so which pointers it receives. */
typedef enum MlafuzzRunsOn {
  MLAFUZZ_RUNS_ON_HOST = 0,  /* host pointers, stream = NULL */
  MLAFUZZ_RUNS_ON_DEVICE = 1 /* CUDA device pointers and a cudaStream_t (needs a CUDA build) */
} MlafuzzRunsOn;

/* The precision pipeline the kernel implements; it selects the per-element error bound that
 * the tolerance property applies (README, "Properties and tolerance model"). */
typedef enum MlafuzzPrecision {
  MLAFUZZ_PRECISION_FP32_SIMT = 0, /* fp32 dequant, dots, softmax and P*V; bf16 store */
  MLAFUZZ_PRECISION_BF16_MMA = 1,  /* bf16 q and K, fp32 accumulation, fp32 logit scaling,
                                      bf16 p for P*V, fp32 row sum, bf16 store */
  MLAFUZZ_PRECISION_CUSTOM = 2     /* explicit tolerances: an element passes when
                                      |a - r| <= abs_tol or |a - r| <= rel_tol * |r| */
} MlafuzzPrecision;

/* ---- What the plugin declares about itself ---- */

#define MLAFUZZ_PLUGIN_NAME_LEN 64
#define MLAFUZZ_PLUGIN_DESCRIPTION_LEN 256

typedef struct MlafuzzPluginInfo {
  uint32_t struct_size; /* set by mlafuzz: sizeof(MlafuzzPluginInfo) it was built with */
  uint32_t abi_version; /* set by the plugin: MLAFUZZ_PLUGIN_ABI_VERSION */
  char name[MLAFUZZ_PLUGIN_NAME_LEN]; /* short name, [A-Za-z0-9._-]; backend "plugin:<name>" */
  char description[MLAFUZZ_PLUGIN_DESCRIPTION_LEN]; /* one line for list/plugin-info */
  int32_t runs_on;                                  /* MlafuzzRunsOn */
  int32_t precision;                                /* MlafuzzPrecision */
  double abs_tol; /* MLAFUZZ_PRECISION_CUSTOM only: absolute tolerance of out (and lse) */
  double rel_tol; /* MLAFUZZ_PRECISION_CUSTOM only: relative tolerance */
} MlafuzzPluginInfo;

/* ---- One decode call ---- */

/* Everything one call needs. Shapes are in elements unless stated; strides in elements.
 * Pointers are host pointers (runs_on HOST) or device pointers (runs_on DEVICE): see memory. */
typedef struct MlafuzzDecodeCall {
  uint32_t struct_size; /* sizeof(MlafuzzDecodeCall) mlafuzz was built with */
  uint32_t abi_version; /* MLAFUZZ_PLUGIN_ABI_VERSION mlafuzz was built with */

  /* Cache geometry. */
  int32_t layout;         /* MlafuzzLayout */
  int32_t nope_dim;       /* quantized dims, a multiple of scale_tile (448 MODEL1, 512 V32) */
  int32_t rope_dim;       /* bf16 dims (64) */
  int32_t scale_tile;     /* nope dims per scale (64 MODEL1, 128 V32) */
  int32_t page_size;      /* P: tokens per page (any value >= 1, e.g. 61) */
  int32_t num_pages;      /* pages in kv_cache */
  int64_t page_stride;    /* S0: bytes from one page to the next (>= page_size * token_bytes) */
  int64_t kv_cache_bytes; /* num_pages * page_stride */
  int32_t token_bytes;    /* bytes one token occupies, all sections (584 MODEL1, 656 V32) */
  int32_t d_qk;           /* nope_dim + rope_dim */
  int32_t d_v;            /* output dims: nope_dim + rope_dim (MODEL1) or nope_dim (V32) */

  /* Conventions. */
  int32_t invalid_index_rule; /* MlafuzzInvalidIndexRule */
  int32_t empty_row_lse;      /* MlafuzzEmptyRowLse */
  int32_t sink_in_lse;        /* 1: lse = ln(sum_k exp(x_k) + exp(sink[h])) (SGLang Triton) */

  /* Problem size. */
  int32_t batch; /* B */
  int32_t heads; /* H */
  int32_t topk;
  float sm_scale; /* fp32 softmax scale applied to q.K */

  /* Memory. */
  int32_t memory; /* MlafuzzRunsOn: where every pointer below lives; device pointers belong to
                     the calling thread's current CUDA device (cudaGetDevice) */
  void* stream;   /* cudaStream_t to launch on (device plugins; NULL is the default stream),
                     NULL for host plugins */

  const uint16_t* q;       /* [B, H, d_qk] bf16 bits */
  int64_t q_head_stride;   /* elements between heads of one row (>= d_qk) */
  int64_t q_batch_stride;  /* elements between batch rows */
  const uint8_t* kv_cache; /* [kv_cache_bytes] */
  const int32_t* indices;  /* [B, topk] global slots; row stride indices_batch_stride */
  int64_t indices_batch_stride;
  const int32_t* topk_length; /* [B], may be NULL (every top-k entry is considered) */
  const float* sink;          /* [H] sink logits, may be NULL; may hold +inf or -inf */
  uint16_t* out;              /* [B, H, d_v] bf16 bits, written */
  int64_t out_head_stride;    /* elements between heads (>= d_v); the gap is guard canaries */
  int64_t out_batch_stride;   /* elements between batch rows */
  float* lse;                 /* [B, H] natural-log LSE, written; row stride lse_batch_stride */
  int64_t lse_batch_stride;
} MlafuzzDecodeCall;

/* ---- Entry points ----
 * Required:
 *   mlafuzz_plugin_abi_version  returns MLAFUZZ_PLUGIN_ABI_VERSION (checked before anything else)
 *   mlafuzz_plugin_info         fills *info; returns 0, or nonzero on failure
 *   mlafuzz_plugin_run          computes out and lse; returns 0, or nonzero with err filled
 * Optional:
 *   mlafuzz_plugin_supports     returns 1 if the plugin can run the call, 0 if not (reason
 *                               filled, e.g. "topk must be a multiple of 64"); such cases are
 *                               reported as not applicable, not as failures. The pointers in
 *                               the call are NULL here: decide from the sizes only.
 *                               Missing: every call is supported. */
typedef int (*MlafuzzPluginAbiVersionFn)(void);
typedef int (*MlafuzzPluginInfoFn)(MlafuzzPluginInfo* info);
typedef int (*MlafuzzPluginSupportsFn)(const MlafuzzDecodeCall* call, char* reason,
                                       size_t reason_len);
typedef int (*MlafuzzPluginRunFn)(const MlafuzzDecodeCall* call, char* err, size_t err_len);

#define MLAFUZZ_PLUGIN_SYMBOL_ABI_VERSION "mlafuzz_plugin_abi_version"
#define MLAFUZZ_PLUGIN_SYMBOL_INFO "mlafuzz_plugin_info"
#define MLAFUZZ_PLUGIN_SYMBOL_SUPPORTS "mlafuzz_plugin_supports"
#define MLAFUZZ_PLUGIN_SYMBOL_RUN "mlafuzz_plugin_run"

/* Prototypes, so that a plugin's definitions are checked against the ABI. */
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_abi_version(void);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_supports(const MlafuzzDecodeCall* call, char* reason,
                                                  size_t reason_len);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* call, char* err,
                                             size_t err_len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLAFUZZ_PLUGIN_H_ */

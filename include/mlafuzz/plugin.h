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
 *   mlafuzz never calls a plugin whose mlafuzz_plugin_abi_version() lies outside
 *   MLAFUZZ_PLUGIN_ABI_VERSION_MIN..MLAFUZZ_PLUGIN_ABI_VERSION of the header mlafuzz was built
 *   with (see Versioning below).
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
 * - Version 2 (this header) appends to version 1, never changes it: the production decode's
 *   fields to MlafuzzDecodeCall (s_q query tokens per batch row, an extra cache read in the same
 *   softmax, their strides), the invariance claims and the extra-cache pipeline to
 *   MlafuzzPluginInfo, and the optional entry point mlafuzz_plugin_envelope (what the kernel
 *   accepts, so that mlafuzz generates cases inside it).
 * - mlafuzz loads plugins of every version from MLAFUZZ_PLUGIN_ABI_VERSION_MIN to
 *   MLAFUZZ_PLUGIN_ABI_VERSION. A version-1 plugin receives structs whose struct_size and
 *   abi_version say 1 (MLAFUZZ_DECODE_CALL_V1_SIZE, MLAFUZZ_PLUGIN_INFO_V1_SIZE) and only the
 *   cases version 1 can express: s_q = 1 and no extra cache; other cases are not applicable to
 *   it, with that reason.
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
#define MLAFUZZ_PLUGIN_ABI_VERSION 2
/* The oldest ABI version mlafuzz still loads (see Versioning above). */
#define MLAFUZZ_PLUGIN_ABI_VERSION_MIN 1

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
 * K[d] = e4m3(byte[d]) * scale_{d / scale_tile} for d < nope_dim, K[nope_dim + r] = rope[r].
 * V32 scales are any positive finite float (MlafuzzV32Scales): read them as they are stored. */
typedef enum MlafuzzLayout { MLAFUZZ_LAYOUT_MODEL1 = 0, MLAFUZZ_LAYOUT_V32 = 1 } MlafuzzLayout;

/* Which indices mark an invalid top-k entry. */
typedef enum MlafuzzInvalidIndexRule {
  MLAFUZZ_INVALID_MINUS_ONE_ONLY = 0, /* FlashMLA: only exactly -1 (other negatives never sent) */
  MLAFUZZ_INVALID_ANY_NEGATIVE = 1,   /* SGLang, vLLM: any negative index */
  /* Any index outside the cache: negative, or >= page_size * num_pages of the list's cache (the
   * main and the extra list alike), e.g. INT_MIN, -1, num_slots, num_slots + page_size,
   * INT_MAX. Sent only to a plugin whose envelope names it (invalid_index_rules bit 2). The
   * bytes just past the cache are NaN (0xff): a read through such an entry shows as NaN, or
   * faults farther out. */
  MLAFUZZ_INVALID_OUT_OF_RANGE = 2
} MlafuzzInvalidIndexRule;

/* How a V32 cache stores its float32 tile scales (MODEL1's ue8m0 bytes are powers of two). A
 * kernel must read the stored float as it is: dequantized K = e4m3 * scale. */
typedef enum MlafuzzV32Scales {
  MLAFUZZ_V32_SCALES_POWER_OF_TWO = 0, /* FlashMLA's quantizer: 2^e */
  MLAFUZZ_V32_SCALES_FP32 = 1          /* vLLM's writers: any positive finite float (amax/448),
                                          subnormal ones too */
} MlafuzzV32Scales;

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
 * the tolerance property applies (docs/concepts.md). */
typedef enum MlafuzzPrecision {
  MLAFUZZ_PRECISION_FP32_SIMT = 0, /* fp32 dequant, dots, softmax and P*V; bf16 store */
  MLAFUZZ_PRECISION_BF16_MMA = 1,  /* bf16 q and K, fp32 accumulation, fp32 logit scaling,
                                      bf16 p for P*V, fp32 row sum, bf16 store */
  MLAFUZZ_PRECISION_CUSTOM = 2     /* explicit tolerances: an element passes when
                                      |a - r| <= abs_tol or |a - r| <= rel_tol * |r| */
} MlafuzzPrecision;

/* Exact invariants a kernel may promise (ABI version 2). mlafuzz checks a promised invariant bit
 * for bit; one the kernel declares inexact (MlafuzzPluginInfo.inexact_invariants) is checked
 * within the tolerance bound instead, and reported as such, never skipped. */
typedef enum MlafuzzInvariance {
  /* A row's outputs do not depend on the other rows of the batch (`batch-alone`). A split-KV
   * kernel whose split count depends on the whole batch (FlashMLA's scheduler) is not. */
  MLAFUZZ_INVARIANT_BATCH = 1u << 0,
  /* A head's outputs do not depend on the other heads (`head-alone`). */
  MLAFUZZ_INVARIANT_HEAD = 1u << 1,
  /* Two runs of the same call give the same bits (`determinism`); e.g. not with atomics. */
  MLAFUZZ_INVARIANT_DETERMINISTIC = 1u << 2,
  /* Moving pages to other physical positions (indices rewritten to match) changes no bit
   * (`relocate`). */
  MLAFUZZ_INVARIANT_PAGE_PLACEMENT = 1u << 3,
  /* Each query token of a row computed alone gives the same bits (`query-alone`, s_q > 1). */
  MLAFUZZ_INVARIANT_QUERY = 1u << 4
} MlafuzzInvariance;

/* How a kernel combines the main and the extra cache (ABI version 2; docs/SPEC.md section 8). It
 * selects the error bound of cases with an extra cache. */
typedef enum MlafuzzExtraPipeline {
  /* One online softmax over the main tiles then the extra tiles (FlashMLA): one bf16 store. */
  MLAFUZZ_EXTRA_JOINT = 0,
  /* Main and extra computed separately, each rounded to bf16 with its LSE, then merged by
   * their LSEs (weights exp(lse_i - max), an LSE <= -1e20 counted as empty) and rounded to bf16
   * again (SGLang's Triton path): two bf16 roundings. */
  MLAFUZZ_EXTRA_LSE_MERGED = 1
} MlafuzzExtraPipeline;

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

  /* ---- ABI version 2 (struct_size > MLAFUZZ_PLUGIN_INFO_V1_SIZE); mlafuzz zeroes them ---- */
  /* MlafuzzInvariance bits the kernel does NOT promise bit for bit; 0 (the default): every
   * invariant is exact. */
  uint32_t inexact_invariants;
  int32_t extra_pipeline; /* MlafuzzExtraPipeline (0: joint softmax) */
} MlafuzzPluginInfo;

/* The part of MlafuzzPluginInfo a version-1 plugin knows. */
#define MLAFUZZ_PLUGIN_INFO_V1_SIZE offsetof(MlafuzzPluginInfo, inexact_invariants)

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
  int32_t invalid_index_rule; /* MlafuzzInvalidIndexRule (OUT_OF_RANGE only where the envelope
                                 names it) */
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

  /* ---- ABI version 2 (struct_size > MLAFUZZ_DECODE_CALL_V1_SIZE) ----
   * The production decode of DeepSeek-V4-Flash (docs/SPEC.md section 8): s_q query tokens per batch
   * row and an optional extra cache, all in ONE softmax per (row, query token, head):
   *   T(b, s) = valid entries of indices[b][s] (below topk_length[b])
   *           + valid entries of extra_indices[b][s] (below extra_topk_length[b])
   *   lse[b][s][h] = ln(sum over T of exp(x_k)), out[b][s][h] as above over T.
   * A token present in both lists counts twice. The shapes above gain the s_q axis:
   *   q [B, s_q, H, d_qk], indices [B, s_q, topk], out [B, s_q, H, d_v], lse [B, s_q, H];
   * the *_batch_stride fields step over a batch row (all its s_q tokens), the *_token_stride
   * fields over one query token of a row. topk_length stays [B], shared by a row's s_q tokens.
   * With s_q = 1 and no extra cache (has_extra = 0) a call means exactly what version 1 means. */
  int32_t s_q;            /* query tokens per batch row (>= 1) */
  int64_t q_token_stride; /* elements between query tokens of one row (>= H * q_head_stride) */
  int64_t indices_token_stride; /* elements between the index lists of a row's tokens */
  int64_t out_token_stride;     /* elements between query tokens of one row in out */
  int64_t lse_token_stride;     /* elements between query tokens of one row in lse */

  /* The extra cache: the same layout and dims as the main cache (layout, nope_dim, rope_dim,
   * scale_tile, token_bytes), its own paging. All fields 0 / NULL when has_extra = 0. */
  int32_t has_extra;
  int32_t extra_page_size;
  int32_t extra_num_pages;
  int64_t extra_page_stride;
  int64_t extra_kv_cache_bytes;
  const uint8_t* extra_kv_cache;
  int32_t extra_topk;
  const int32_t* extra_indices;       /* [B, s_q, extra_topk] global slots of the extra cache */
  int64_t extra_indices_batch_stride; /* elements between batch rows */
  int64_t extra_indices_token_stride; /* elements between the lists of a row's query tokens */
  const int32_t* extra_topk_length;   /* [B], may be NULL (every extra entry is considered) */
} MlafuzzDecodeCall;

/* The part of MlafuzzDecodeCall a version-1 plugin knows. */
#define MLAFUZZ_DECODE_CALL_V1_SIZE offsetof(MlafuzzDecodeCall, s_q)

/* ---- What the kernel accepts (ABI version 2, optional) ----
 * mlafuzz generates cases inside the intersection of the envelopes of the selected backends,
 * and shrinking never leaves it; mlafuzz_plugin_supports (when exported) stays the final word.
 * Every field's zero value means "no constraint", so a zero-filled envelope accepts anything.
 *
 * An integer set accepts v when all of these hold:
 *   count == 0 or v is one of values[0..count)
 *   min == 0 or v >= min;  max == 0 or v <= max;  multiple_of <= 1 or v % multiple_of == 0 */
#define MLAFUZZ_ENVELOPE_LIST_MAX 16
typedef struct MlafuzzIntSet {
  int32_t count;
  int32_t values[MLAFUZZ_ENVELOPE_LIST_MAX];
  int32_t min;
  int32_t max;
  int32_t multiple_of;
} MlafuzzIntSet;

/* Features a kernel may refuse (MlafuzzEnvelope.refuses bits). */
typedef enum MlafuzzFeature {
  MLAFUZZ_FEATURE_SINK = 1u << 0,              /* an attention sink (sink != NULL) */
  MLAFUZZ_FEATURE_INFINITE_SINK = 1u << 1,     /* a sink of +inf or -inf */
  MLAFUZZ_FEATURE_TOPK_LENGTH = 1u << 2,       /* topk_length != NULL */
  MLAFUZZ_FEATURE_EXTRA_CACHE = 1u << 3,       /* has_extra = 1 */
  MLAFUZZ_FEATURE_EXTRA_TOPK_LENGTH = 1u << 4, /* extra_topk_length != NULL */
  MLAFUZZ_FEATURE_Q_HEAD_PAD = 1u << 5,        /* q_head_stride > d_qk */
  MLAFUZZ_FEATURE_OUT_HEAD_PAD = 1u << 6,      /* out_head_stride > d_v */
  MLAFUZZ_FEATURE_ROW_PAD = 1u << 7            /* batch or token strides with gaps (q, out, lse,
                                                  indices) */
} MlafuzzFeature;

typedef struct MlafuzzEnvelope {
  uint32_t struct_size; /* set by mlafuzz: sizeof(MlafuzzEnvelope) it was built with */
  uint32_t abi_version; /* set by the plugin: MLAFUZZ_PLUGIN_ABI_VERSION */
  /* Cache geometry. */
  uint32_t layouts; /* bits 1u << MlafuzzLayout; 0: all */
  MlafuzzIntSet nope_dim;
  MlafuzzIntSet rope_dim;
  MlafuzzIntSet scale_tile;
  MlafuzzIntSet page_size;
  int64_t page_stride_multiple; /* bytes; page_stride % it == 0 (0: any) */
  /* Problem size. */
  MlafuzzIntSet batch;
  MlafuzzIntSet heads;
  MlafuzzIntSet topk;
  MlafuzzIntSet s_q;
  MlafuzzIntSet extra_topk;
  MlafuzzIntSet extra_page_size;
  /* Conventions: bits 1u << value of the enumeration; 0: all. */
  uint32_t invalid_index_rules; /* MlafuzzInvalidIndexRule; 0: minus_one_only and any_negative:
                                   MLAFUZZ_INVALID_OUT_OF_RANGE only when its bit is set */
  uint32_t empty_row_lses;      /* MlafuzzEmptyRowLse */
  uint32_t sink_in_lse;         /* bit 0: sink excluded from the LSE, bit 1: included */
  uint32_t refuses;             /* MlafuzzFeature bits the kernel cannot take */
  /* ---- Appended within version 2 (struct_size > MLAFUZZ_ENVELOPE_BASE_SIZE): write it only
   * when env->struct_size says the caller knows it ---- */
  uint32_t v32_scales; /* MlafuzzV32Scales the kernel reads correctly; 0: both */
} MlafuzzEnvelope;

/* The part of MlafuzzEnvelope every version-2 mlafuzz knows. */
#define MLAFUZZ_ENVELOPE_BASE_SIZE offsetof(MlafuzzEnvelope, v32_scales)

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
 *                               Missing: every call is supported.
 *   mlafuzz_plugin_envelope     (ABI version 2) fills *env (zeroed by mlafuzz, struct_size set)
 *                               with what the kernel accepts and sets env->abi_version to its
 *                               own version; returns 0, or nonzero on failure.
 *                               Missing: the envelope accepts anything. */
typedef int (*MlafuzzPluginAbiVersionFn)(void);
typedef int (*MlafuzzPluginInfoFn)(MlafuzzPluginInfo* info);
typedef int (*MlafuzzPluginSupportsFn)(const MlafuzzDecodeCall* call, char* reason,
                                       size_t reason_len);
typedef int (*MlafuzzPluginRunFn)(const MlafuzzDecodeCall* call, char* err, size_t err_len);
typedef int (*MlafuzzPluginEnvelopeFn)(MlafuzzEnvelope* env);

#define MLAFUZZ_PLUGIN_SYMBOL_ABI_VERSION "mlafuzz_plugin_abi_version"
#define MLAFUZZ_PLUGIN_SYMBOL_INFO "mlafuzz_plugin_info"
#define MLAFUZZ_PLUGIN_SYMBOL_SUPPORTS "mlafuzz_plugin_supports"
#define MLAFUZZ_PLUGIN_SYMBOL_RUN "mlafuzz_plugin_run"
#define MLAFUZZ_PLUGIN_SYMBOL_ENVELOPE "mlafuzz_plugin_envelope"

/* Prototypes, so that a plugin's definitions are checked against the ABI. */
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_abi_version(void);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_supports(const MlafuzzDecodeCall* call, char* reason,
                                                  size_t reason_len);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* call, char* err,
                                             size_t err_len);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_envelope(MlafuzzEnvelope* env);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLAFUZZ_PLUGIN_H_ */

/* Deliberately broken plugins for the plugin tests: one source, one shared library per fault,
 * selected by FAULT (see tests/plugins/CMakeLists.txt). Each shows one way a user's plugin can
 * go wrong; mlafuzz must report it clearly and carry on.
 *   FAULT_ABI_V3        mlafuzz_plugin_abi_version() returns 3 (newer than mlafuzz)
 *   FAULT_MISSING_RUN   mlafuzz_plugin_run is not exported
 *   FAULT_BAD_TOLERANCE custom precision with both tolerances 0
 *   FAULT_RUN_ERROR     run returns 7 with a message
 *   FAULT_UNSUPPORTED   supports() refuses topk > 4
 *   FAULT_ZEROS         runs, but writes zeros (a wrong kernel: properties must fail)
 *   FAULT_CRASH         run dereferences a null pointer (SIGSEGV)
 *   FAULT_HANG          run never returns
 *   FAULT_ABI_V0        mlafuzz_plugin_abi_version() returns 0 (older than any mlafuzz loads)
 *   FAULT_EXIT          run calls exit(3), as a wrapped library that gives up does */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mlafuzz/plugin.h"

#define FAULT_ABI_V3 1
#define FAULT_MISSING_RUN 2
#define FAULT_BAD_TOLERANCE 3
#define FAULT_RUN_ERROR 4
#define FAULT_UNSUPPORTED 5
#define FAULT_ZEROS 6
#define FAULT_CRASH 7
#define FAULT_HANG 8
#define FAULT_ABI_V0 9
#define FAULT_EXIT 10

#ifndef FAULT
#error "define FAULT"
#endif

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_abi_version(void) {
#if FAULT == FAULT_ABI_V3
  return 3;
#elif FAULT == FAULT_ABI_V0
  return 0;
#else
  return MLAFUZZ_PLUGIN_ABI_VERSION;
#endif
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info) {
  info->abi_version = MLAFUZZ_PLUGIN_ABI_VERSION;
  snprintf(info->name, sizeof info->name, "faulty-%d", FAULT);
  snprintf(info->description, sizeof info->description, "test plugin with fault %d", FAULT);
  info->runs_on = MLAFUZZ_RUNS_ON_HOST;
#if FAULT == FAULT_BAD_TOLERANCE
  info->precision = MLAFUZZ_PRECISION_CUSTOM;
  info->abs_tol = 0;
  info->rel_tol = 0;
#else
  info->precision = MLAFUZZ_PRECISION_FP32_SIMT;
#endif
  return 0;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_supports(const MlafuzzDecodeCall* call, char* reason,
                                                  size_t reason_len) {
#if FAULT == FAULT_UNSUPPORTED
  if (call->topk > 4) {
    snprintf(reason, reason_len, "topk %d > 4", call->topk);
    return 0;
  }
#else
  (void)call, (void)reason, (void)reason_len;
#endif
  return 1;
}

#if FAULT == FAULT_CRASH
/* A real SIGSEGV, as a broken plugin gives. In a sanitized build (MLAFUZZ_SANITIZE) UBSan's null
 * check would report the store and exit before it faults: the store stays unchecked. */
__attribute__((no_sanitize("undefined"))) static void crash(void) {
  volatile int* nowhere = NULL;
  *nowhere = 1;
}
#endif

#if FAULT != FAULT_MISSING_RUN
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* call, char* err,
                                             size_t err_len) {
  int b, h, d;
#if FAULT == FAULT_RUN_ERROR
  snprintf(err, err_len, "simulated launch failure");
  return 7;
#elif FAULT == FAULT_CRASH
  crash();
#elif FAULT == FAULT_HANG
  for (;;) pause();
#elif FAULT == FAULT_EXIT
  exit(3);
#endif
  (void)err, (void)err_len;
  for (b = 0; b < call->batch; ++b) {
    for (h = 0; h < call->heads; ++h) {
      uint16_t* out = call->out + b * call->out_batch_stride + h * call->out_head_stride;
      for (d = 0; d < call->d_v; ++d) out[d] = 0;
      call->lse[b * call->lse_batch_stride + h] = 0.0f;
    }
  }
  return 0;
}
#endif

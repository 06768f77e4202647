/* The example CPU plugin (examples/cpu_plugin/cpu_plugin.c) with a planted stall, one shared
 * library per STALL (tests/plugins/CMakeLists.txt), for the tests of a campaign whose time budget
 * ends while a failure is shrunk (tests/python/test_time_budget.py):
 *   STALL_HANG_FIFTH  correct for the first four calls of its worker process, then never
 *                     returns (a fresh worker counts from one again)
 *   STALL_STOP        stops its own process (SIGSTOP) on every call
 *   STALL_SLOW_WRONG  takes 0.2 s per call and is wrong from two heads on (the first output
 *                     element of head 1 of each row doubled) */
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define mlafuzz_plugin_info example_plugin_info
#define mlafuzz_plugin_run example_plugin_run
#include "../../examples/cpu_plugin/cpu_plugin.c"
#undef mlafuzz_plugin_info
#undef mlafuzz_plugin_run

#define STALL_HANG_FIFTH 1
#define STALL_STOP 2
#define STALL_SLOW_WRONG 3

#ifndef STALL
#error "define STALL"
#endif

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err, size_t err_len);

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info) {
  static const char* const names[] = {"", "hangs-on-fifth-call", "stops-itself", "slow-wrong"};
  example_plugin_info(info);
  snprintf(info->name, sizeof info->name, "%s", names[STALL]);
  return 0;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err,
                                             size_t err_len) {
#if STALL == STALL_HANG_FIFTH
  static int calls = 0;
  if (++calls >= 5) {
    for (;;) pause();
  }
  return example_plugin_run(c, err, err_len);
#elif STALL == STALL_STOP
  raise(SIGSTOP);
  return example_plugin_run(c, err, err_len);
#else
  const struct timespec delay = {0, 200 * 1000 * 1000};
  int b, rc;
  nanosleep(&delay, NULL);
  rc = example_plugin_run(c, err, err_len);
  if (rc == 0 && c->heads >= 2) {
    for (b = 0; b < c->batch; ++b) {
      uint16_t* out = c->out + b * c->out_batch_stride + c->out_head_stride;
      out[0] = f32_to_bf16(2.0f * bf16_to_f32(out[0]) + 1.0f);
    }
  }
  return rc;
#endif
}

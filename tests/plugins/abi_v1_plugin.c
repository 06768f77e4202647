/* A real ABI version-1 plugin: the example CPU plugin (examples/cpu_plugin/cpu_plugin.c)
 * compiled against the version-1 header as it was released (tests/plugins/abi_v1/mlafuzz/
 * plugin.h, put first on the include path by tests/plugins/CMakeLists.txt). Its entry points
 * check that mlafuzz hands it version-1 structs: struct_size of the version-1 layout and
 * abi_version 1, and fail the call otherwise. */
#define mlafuzz_plugin_info example_plugin_info
#define mlafuzz_plugin_run example_plugin_run
#include "../../examples/cpu_plugin/cpu_plugin.c"
#undef mlafuzz_plugin_info
#undef mlafuzz_plugin_run

#if MLAFUZZ_PLUGIN_ABI_VERSION != 1
#error "abi_v1_plugin.c must be compiled against the version-1 header"
#endif

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info);
MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err, size_t err_len);

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_info(MlafuzzPluginInfo* info) {
  if (info->struct_size != sizeof(MlafuzzPluginInfo)) return 5; /* the v1 size, exactly */
  example_plugin_info(info);
  snprintf(info->name, sizeof info->name, "%s", "cpu-fp32-abi-v1");
  return 0;
}

MLAFUZZ_PLUGIN_EXPORT int mlafuzz_plugin_run(const MlafuzzDecodeCall* c, char* err,
                                             size_t err_len) {
  if (c->struct_size != sizeof(MlafuzzDecodeCall) || c->abi_version != 1) {
    snprintf(err, err_len, "version-1 plugin got struct_size %u (expected %u), abi_version %u",
             (unsigned)c->struct_size, (unsigned)sizeof(MlafuzzDecodeCall),
             (unsigned)c->abi_version);
    return 9;
  }
  return example_plugin_run(c, err, err_len);
}

// The absolute paths the tests read at run time: this source tree and what the build made. Each
// test executable defines the ones it uses in one source generated into its build folder
// (mlafuzz_build_paths() in cmake/mlafuzzBuildPaths.cmake, called by its CMakeLists.txt), so that
// no other object depends on the checkout's folder; using one the executable does not define is
// a link error.
#pragma once

namespace mlafuzz::build_paths {

extern const char kSourceDir[];         // this source tree (corpus/, docs/, examples/, scripts/)
extern const char kMlafuzz[];           // the mlafuzz executable
extern const char kTestWorker[];        // mlafuzz_test_worker (tests/harness)
extern const char kCpuPlugin[];         // the example C++ plugin, libmlafuzz_cpu_plugin.so
extern const char kMmaPlugin[];         // the example device plugin (CUDA builds)
extern const char kFaultyPluginDir[];   // tests/plugins' libfaulty_*.so
extern const char kVariantPluginDir[];  // tests/plugins' libvariant_*.so and libabi_v1_plugin.so
extern const char kStridePluginDir[];   // tests/plugins' libstride_bug_*.so

}  // namespace mlafuzz::build_paths

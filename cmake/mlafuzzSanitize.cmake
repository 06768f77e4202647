# MLAFUZZ_SANITIZE=address,undefined (any -fsanitize= list): every host target of this build is
# compiled and linked with the sanitizers (host libraries, the tool, the tests, the C and C++
# example plugins, the deliberately broken test plugins), and the installed package asks its
# users to link the sanitizer runtimes too, which its static libraries need. Errors are never
# recovered from: the first report ends the process with a failing status.
# The CUDA kernels are not sanitizer-instrumented (nvcc, device code), so a sanitized build is
# a host-only build: configure it with -DMLAFUZZ_ENABLE_CUDA=OFF.
set(MLAFUZZ_SANITIZE "" CACHE STRING
    "Sanitizers for a host-only build (e.g. address,undefined); needs MLAFUZZ_ENABLE_CUDA=OFF")
set(MLAFUZZ_SANITIZE_FLAGS "")
if(NOT MLAFUZZ_SANITIZE)
  return()
endif()
if(MLAFUZZ_ENABLE_CUDA)
  message(FATAL_ERROR
          "MLAFUZZ_SANITIZE=${MLAFUZZ_SANITIZE} builds host code only: the CUDA kernels cannot "
          "be sanitizer-instrumented. Configure with -DMLAFUZZ_ENABLE_CUDA=OFF.")
endif()
# Frame pointers: readable stacks in reports (and cheap leak-check unwinding).
set(MLAFUZZ_SANITIZE_FLAGS -fsanitize=${MLAFUZZ_SANITIZE} -fno-sanitize-recover=all
    -fno-omit-frame-pointer)
add_compile_options(${MLAFUZZ_SANITIZE_FLAGS})
add_link_options(${MLAFUZZ_SANITIZE_FLAGS})
# Executables linked at a fixed address. A sanitized position-independent executable carries
# about 1.8 million run-time relocations (a pointer in every UBSan check's static data and in
# ASan's global descriptors), which the loader applied at every process start, writing to the
# pages of a 50 MB data section: 0.40 -> 0.24 s of CPU per start of `mlafuzz --version`, and
# every sanitized test starts at least one process (most start several: the tool, its workers).
# Fixed-address executables need none of them; the objects (position-independent by the
# compiler's default) and the sanitizers are the same. Plugins and other shared objects stay
# position-independent.
string(APPEND CMAKE_EXE_LINKER_FLAGS " -no-pie")
message(STATUS "mlafuzz: sanitizers ${MLAFUZZ_SANITIZE} (host only)")

# Install and export rules: `cmake --install build --prefix P` gives a package that a user's
# project finds with find_package(mlafuzz) (P on CMAKE_PREFIX_PATH) and links into its own tests:
#   mlafuzz::core        case model, materialization, canary-guarded outputs, comparison metrics
#   mlafuzz::oracle      the float64 oracles (Eigen and plain loops)
#   mlafuzz::plugin_abi  the plugin C ABI header <mlafuzz/plugin.h>, to build a plugin
# Headers install under include/mlafuzz/ with the source tree's folders (core/,
# oracle/, mla/), so includes read the same in and out of this tree. Everything belongs to the
# component mlafuzz_dev (besides the executable and plugins, installed by their own rules).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MLAFUZZ_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mlafuzz)
set(MLAFUZZ_EXPORTED_TARGETS mlafuzz_flags mla_common mlafuzz_core mlafuzz_oracle
    mlafuzz_plugin_abi)
set_target_properties(mlafuzz_flags PROPERTIES EXPORT_NAME flags)
set_target_properties(mla_common PROPERTIES EXPORT_NAME mla)
set_target_properties(mlafuzz_core PROPERTIES EXPORT_NAME core)
set_target_properties(mlafuzz_oracle PROPERTIES EXPORT_NAME oracle)
set_target_properties(mlafuzz_plugin_abi PROPERTIES EXPORT_NAME plugin_abi)

install(TARGETS ${MLAFUZZ_EXPORTED_TARGETS} EXPORT mlafuzzTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT mlafuzz_dev)
install(FILES core/backend.h core/backend_traits.h core/case.h core/compare.h
              core/envelope.h core/fileio.h core/materialize.h
              core/npy.h core/shared_arena.h
              core/rng.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mlafuzz/core COMPONENT mlafuzz_dev)
install(FILES oracle/oracle.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mlafuzz/oracle COMPONENT mlafuzz_dev)
install(DIRECTORY mla/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mlafuzz/mla COMPONENT mlafuzz_dev
        FILES_MATCHING PATTERN "*.h")
install(FILES include/mlafuzz/plugin.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mlafuzz COMPONENT mlafuzz_dev)

install(EXPORT mlafuzzTargets NAMESPACE mlafuzz:: DESTINATION ${MLAFUZZ_INSTALL_CMAKEDIR}
        COMPONENT mlafuzz_dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mlafuzzConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mlafuzzConfig.cmake
                              INSTALL_DESTINATION ${MLAFUZZ_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mlafuzzConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mlafuzzConfig.cmake
              ${PROJECT_BINARY_DIR}/mlafuzzConfigVersion.cmake
        DESTINATION ${MLAFUZZ_INSTALL_CMAKEDIR} COMPONENT mlafuzz_dev)

# The command-line tool and the example plugins.
install(TARGETS mlafuzz RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT mlafuzz_tools)

# python: backends of an installed tree: the mlafuzz Python package and the shipped Triton
# kernels, found beside the executable (<bin>/../share/mlafuzz/{python,triton}).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/mlafuzz DESTINATION ${CMAKE_INSTALL_DATADIR}/mlafuzz/python
        COMPONENT mlafuzz_tools FILES_MATCHING PATTERN "*.py" PATTERN "settings.json"
        PATTERN "__pycache__" EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/kernels/triton/ DESTINATION ${CMAKE_INSTALL_DATADIR}/mlafuzz/triton
        COMPONENT mlafuzz_tools FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

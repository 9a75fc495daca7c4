# Install rules, the CMake package (find_package(pmindex CONFIG)), pmindex.pc and the Debian
# packages (CPack). Included by the top-level CMakeLists.txt when PMINDEX_INSTALL is ON.
#
# Components (cmake --install BUILD --component NAME; the .deb packages group them):
#   runtime   libpmindex.so.*                                   -> libpmindex
#   dev       headers, libpmindex.a, libpmindex.so link, CMake package, pmindex.pc
#                                                               -> libpmindex-dev
#   counting  libpmindex_counting.a (PM-traffic counting flavour) -> libpmindex-dev
#   crash     libpmindex_tracing.a + libpmindex_crashsim.a (crash simulator, kill harness)
#                                                               -> libpmindex-dev
#   tools     pmpool, pmbench                                   -> pmindex-tools
#
# Versioning (README "Versioning"): the project version is semantic. While it is 0.x, any
# minor release may change the API and ABI, so the SONAME is libpmindex.so.0.MINOR and the
# package version file accepts only the same major.minor; from 1.0 on, the same major.
include(CMakePackageConfigHelpers)

set(PMINDEX_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/pmindex)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pmindex DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.h")

if(TARGET pmindex)
  install(TARGETS pmindex EXPORT pmindexTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
endif()
if(TARGET pmindex_shared)
  install(TARGETS pmindex_shared EXPORT pmindexTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
                  NAMELINK_COMPONENT dev)
endif()
if(TARGET pmindex_counting)
  set_target_properties(pmindex_counting PROPERTIES EXPORT_NAME counting)
  install(TARGETS pmindex_counting EXPORT pmindexTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT counting)
endif()
if(TARGET pmindex_tracing)
  set_target_properties(pmindex_tracing PROPERTIES EXPORT_NAME tracing)
  install(TARGETS pmindex_tracing EXPORT pmindexTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT crash)
endif()
if(TARGET pmindex_crashsim)
  install(TARGETS pmindex_crashsim EXPORT pmindexTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT crash)
endif()
foreach(tool pmpool pmbench)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  endif()
endforeach()

install(EXPORT pmindexTargets NAMESPACE pmindex:: DESTINATION ${PMINDEX_CMAKE_DIR}
        FILE pmindexTargets.cmake COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pmindexConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/pmindexConfig.cmake
                              INSTALL_DESTINATION ${PMINDEX_CMAKE_DIR})
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_compat SameMinorVersion)
else()
  set(_compat SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pmindexConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${_compat})
install(FILES ${PROJECT_BINARY_DIR}/pmindexConfig.cmake
              ${PROJECT_BINARY_DIR}/pmindexConfigVersion.cmake
        DESTINATION ${PMINDEX_CMAKE_DIR} COMPONENT dev)

# pkg-config: links libpmindex (the shared library when both are installed; --static for the
# archive, whose dependencies are in Libs.private).
configure_file(${PROJECT_SOURCE_DIR}/cmake/pmindex.pc.in ${PROJECT_BINARY_DIR}/pmindex.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pmindex.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# --- Debian packages: cpack -G DEB in the build directory ---------------------------------------
set(CPACK_PACKAGE_NAME pmindex)
set(CPACK_PACKAGE_VENDOR "pmindex developers")
set(CPACK_PACKAGE_CONTACT "pmindex developers <pmindex@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "crash-consistent persistent-memory range indexes (LB+-Tree, FPTree, NBTree, APEX)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
# The minimum CPU (README "Minimum CPU"): the library's PMINDEX_ISA level, x86-64-v2 (SSE4.2,
# POPCNT) for the packaged baseline build; clwb / clflushopt are chosen at run time and are not
# required.
if(PMINDEX_ISA STREQUAL "avx2")
  set(PMINDEX_CPU_NOTE
      "Needs an x86-64-v2 CPU with AVX2 (Haswell or newer); built with PMINDEX_ISA=avx2.")
else()
  set(PMINDEX_CPU_NOTE "Runs on any x86-64-v2 CPU (SSE4.2 and POPCNT: Nehalem or newer).")
endif()
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE amd64)
set(CPACK_COMPONENTS_GROUPING IGNORE)
set(CPACK_COMPONENTS_ALL runtime dev counting crash tools)
set(CPACK_COMPONENT_COUNTING_GROUP dev)
set(CPACK_COMPONENT_CRASH_GROUP dev)
set(CPACK_COMPONENT_DEV_GROUP dev)
set(CPACK_COMPONENT_RUNTIME_GROUP runtime)
set(CPACK_COMPONENT_TOOLS_GROUP tools)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libpmindex)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libpmindex-dev)
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME pmindex-tools)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
    "pmindex shared library\n ${CPACK_PACKAGE_DESCRIPTION_SUMMARY}.\n ${PMINDEX_CPU_NOTE}")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "pmindex headers, static libraries, CMake package and pkg-config file\n \
${CPACK_PACKAGE_DESCRIPTION_SUMMARY}.\n ${PMINDEX_CPU_NOTE}")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION
    "pmpool and pmbench\n ${CPACK_PACKAGE_DESCRIPTION_SUMMARY}.\n ${PMINDEX_CPU_NOTE}")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libpmindex (= ${PROJECT_VERSION}), zlib1g-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
include(CPack)

# One helper per kind of target, so every target declares its dependencies explicitly.
include(GNUInstallDirs)
#
# The library is compiled once per persistence-API flavour (docs/architecture.md, "Build flavours"):
#   pmindex            production: raw store/clwb/sfence plus always-on flush and fence counters
#   pmindex_counting   adds per-operation lines-written, bytes and the XPBuffer media model
#   pmindex_tracing    adds the crash simulator's store/flush/fence trace (Foundation II)
# A binary links exactly one flavour; mixing two in one binary would violate the ODR.

set(PMINDEX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wcast-align -Wnull-dereference -Wformat=2 -Wimplicit-fallthrough)

function(pmindex_flavour_target out flavour)
  if(flavour STREQUAL "production")
    set(${out} pmindex PARENT_SCOPE)
  else()
    set(${out} pmindex_${flavour} PARENT_SCOPE)
  endif()
endfunction()

function(pmindex_flavour_number out flavour)
  if(flavour STREQUAL "production")
    set(${out} 0 PARENT_SCOPE)
  elseif(flavour STREQUAL "counting")
    set(${out} 1 PARENT_SCOPE)
  elseif(flavour STREQUAL "tracing")
    set(${out} 2 PARENT_SCOPE)
  else()
    message(FATAL_ERROR "unknown pmindex flavour '${flavour}'")
  endif()
endfunction()

# pmindex_add_library(SOURCES ... DEPS ...): the core library, once per enabled flavour.
function(pmindex_add_library)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  set(_want_pic OFF)
  if("production" IN_LIST PMINDEX_FLAVOURS AND
     (PMINDEX_BUILD_SHARED OR PMINDEX_BUILD_BENCH OR PMINDEX_PIC_STATIC))
    set(_want_pic ON)
  endif()
  foreach(flavour IN LISTS PMINDEX_FLAVOURS)
    pmindex_flavour_target(lib ${flavour})
    pmindex_flavour_number(num ${flavour})
    if(flavour STREQUAL "production" AND PMINDEX_PIC_STATIC)
      # PMINDEX_PIC_STATIC: the static archive reuses the PIC objects below instead of
      # compiling every source a second time (the CI's sanitizer build; see the option).
      add_library(${lib} STATIC $<TARGET_OBJECTS:pmindex_pic_objects>)
    else()
      add_library(${lib} STATIC ${ARG_SOURCES})
    endif()
    pmindex_library_usage(${lib} ${num} "${ARG_DEPS}")
    add_library(pmindex::${flavour} ALIAS ${lib})
  endforeach()
  # The production library is pmindex::pmindex, in the build tree as in an installed package.
  if("production" IN_LIST PMINDEX_FLAVOURS)
    add_library(pmindex::pmindex ALIAS pmindex)
    set_target_properties(pmindex PROPERTIES EXPORT_NAME pmindex)
  endif()
  # libpmindex.so: the production sources once more as position-independent code (the static
  # library stays non-PIC unless PMINDEX_PIC_STATIC). The same objects also make pmindex_pic,
  # the archive that the PiBench tree_api wrappers embed (bench/CMakeLists.txt).
  if(_want_pic)
    add_library(pmindex_pic_objects OBJECT ${ARG_SOURCES})
    set_target_properties(pmindex_pic_objects PROPERTIES POSITION_INDEPENDENT_CODE ON)
    pmindex_library_usage(pmindex_pic_objects 0 "${ARG_DEPS}")
    if(PMINDEX_BUILD_BENCH AND PMINDEX_PIC_STATIC)
      add_library(pmindex_pic ALIAS pmindex)  # already position-independent
    elseif(PMINDEX_BUILD_BENCH)
      add_library(pmindex_pic STATIC $<TARGET_OBJECTS:pmindex_pic_objects>)
      pmindex_library_usage(pmindex_pic 0 "${ARG_DEPS}")
    endif()
    if(PMINDEX_BUILD_SHARED)
      add_library(pmindex_shared SHARED $<TARGET_OBJECTS:pmindex_pic_objects>)
      pmindex_library_usage(pmindex_shared 0 "${ARG_DEPS}")
      # 0.x: every minor version may change the ABI, so the SONAME carries major.minor.
      if(PROJECT_VERSION_MAJOR EQUAL 0)
        set(_soversion "0.${PROJECT_VERSION_MINOR}")
      else()
        set(_soversion "${PROJECT_VERSION_MAJOR}")
      endif()
      set_target_properties(pmindex_shared PROPERTIES OUTPUT_NAME pmindex EXPORT_NAME shared
                            VERSION ${PROJECT_VERSION} SOVERSION ${_soversion})
      add_library(pmindex::shared ALIAS pmindex_shared)
    endif()
  endif()
endfunction()

# The instruction-set level the library is compiled for (README "Minimum CPU"), PMINDEX_ISA:
#   baseline  x86-64-v2 (SSE4.2, POPCNT): every x86-64 server CPU since 2008 (Nehalem) and
#             what the major distributions now require; the installed package and a plain
#             configure. Node searches use their SSE4.2 / SWAR forms, except the integer-key
#             lookups of LB+-Tree, FPTree and NBTree, which run an AVX2 form on a CPU with
#             AVX2, chosen at open (target("avx2") entry points, docs/isa.md); PACTree picks its
#             AVX2 fingerprint match at run time too (a target("avx2") function).
#   avx2      x86-64-v2 plus AVX2 (Haswell, 2013): the vector node searches of LB+-Tree, FPTree
#             and NBTree. The benchmark and CI presets use it; a binary built so refuses to
#             open an index on a CPU without AVX2 (pmindex::isa_check) instead of faulting.
# clwb / clflushopt need no flag: persist.h and runtime.cpp issue them as inline assembly,
# chosen at run time. The flags are PRIVATE: public headers use no target-specific intrinsic,
# so a consumer compiles its own code for whatever CPU it likes.
set(PMINDEX_ISA "baseline" CACHE STRING "Instruction-set level of the library: baseline (x86-64-v2) or avx2")
set_property(CACHE PMINDEX_ISA PROPERTY STRINGS baseline avx2)
if(PMINDEX_ISA STREQUAL "baseline")
  set(PMINDEX_ISA_FLAGS -msse4.2 -mpopcnt)
  set(PMINDEX_ISA_NUMBER 0)
elseif(PMINDEX_ISA STREQUAL "avx2")
  set(PMINDEX_ISA_FLAGS -msse4.2 -mpopcnt -mavx2)
  set(PMINDEX_ISA_NUMBER 1)
else()
  message(FATAL_ERROR "PMINDEX_ISA must be baseline or avx2, not '${PMINDEX_ISA}'")
endif()
function(pmindex_library_usage lib flavour_number deps)
  target_include_directories(${lib} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                                    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${lib} PUBLIC PMINDEX_PM_FLAVOUR=${flavour_number}
                                     PRIVATE PMINDEX_ISA_LEVEL=${PMINDEX_ISA_NUMBER})
  target_compile_options(${lib} PRIVATE ${PMINDEX_WARNINGS} ${PMINDEX_ISA_FLAGS})
  target_compile_features(${lib} PUBLIC cxx_std_20)
  target_link_libraries(${lib} PUBLIC ${deps})
endfunction()

# pmindex_add_executable(NAME SOURCES ... FLAVOUR f DEPS ...)
function(pmindex_add_executable name)
  cmake_parse_arguments(ARG "" "FLAVOUR" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_FLAVOUR)
    set(ARG_FLAVOUR production)
  endif()
  pmindex_flavour_target(lib ${ARG_FLAVOUR})
  add_executable(${name} ${ARG_SOURCES})
  # The project's own programs include internal headers (src/) compiled into the library, so
  # they get the library's ISA flags too.
  target_compile_options(${name} PRIVATE ${PMINDEX_WARNINGS} ${PMINDEX_ISA_FLAGS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PRIVATE ${lib} ${ARG_DEPS})
endfunction()

# pmindex_add_test(NAME SOURCES ... LABELS ... FLAVOUR f DEPS ... TIMEOUT s ARGS ...)
# Skipped (not an error) when the flavour it needs is not built.
function(pmindex_add_test name)
  cmake_parse_arguments(ARG "" "FLAVOUR;TIMEOUT" "SOURCES;LABELS;DEPS;ARGS" ${ARGN})
  if(NOT ARG_FLAVOUR)
    set(ARG_FLAVOUR production)
  endif()
  if(NOT ARG_FLAVOUR IN_LIST PMINDEX_FLAVOURS)
    return()
  endif()
  pmindex_add_executable(${name} SOURCES ${ARG_SOURCES} FLAVOUR ${ARG_FLAVOUR}
                         DEPS GTest::gtest GTest::gtest_main ${ARG_DEPS})
  add_test(NAME ${name} COMMAND ${name} ${ARG_ARGS})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# pmindex_add_long_variant(TEST ENV TIMEOUT): TEST_long reruns TEST's executable at the full sweep
# size given by ENV ("PMINDEX_CRASH_IMAGES=10000", "PMINDEX_KILL_CYCLES=300"), label `long`.
function(pmindex_add_long_variant test env timeout)
  add_test(NAME ${test}_long COMMAND ${test})
  set_tests_properties(${test}_long PROPERTIES LABELS long TIMEOUT ${timeout} ENVIRONMENT "${env}")
endfunction()

# One helper per kind of target, so every target declares its dependencies explicitly.
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
  foreach(flavour IN LISTS PMINDEX_FLAVOURS)
    pmindex_flavour_target(lib ${flavour})
    pmindex_flavour_number(num ${flavour})
    add_library(${lib} STATIC ${ARG_SOURCES})
    target_include_directories(${lib} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                      PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_compile_definitions(${lib} PUBLIC PMINDEX_PM_FLAVOUR=${num})
    target_compile_options(${lib} PRIVATE ${PMINDEX_WARNINGS})
    target_compile_options(${lib} PUBLIC -mclwb -mclflushopt -mavx2 -msse4.2)
    target_link_libraries(${lib} PUBLIC ${ARG_DEPS})
  endforeach()
endfunction()

# pmindex_add_executable(NAME SOURCES ... FLAVOUR f DEPS ...)
function(pmindex_add_executable name)
  cmake_parse_arguments(ARG "" "FLAVOUR" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_FLAVOUR)
    set(ARG_FLAVOUR production)
  endif()
  pmindex_flavour_target(lib ${ARG_FLAVOUR})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${PMINDEX_WARNINGS})
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

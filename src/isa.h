// The instruction-set level the library was compiled for (PMINDEX_ISA, cmake/PmindexTargets.cmake)
// and the check that this CPU runs it. Internal: the public face is pmindex::isa_level() and
// pmindex::isa_check() in pmindex/index.h.
#pragma once

#include <cstddef>
#include <string_view>

#include "pmindex/status.h"

namespace pmindex::isa {

// The levels, numbered as PMINDEX_ISA_LEVEL (0 baseline x86-64-v2, 1 baseline plus AVX2).
enum class Level : unsigned char { baseline = 0, avx2 = 1 };

// What the CPU offers of the extensions the levels need.
struct CpuFeatures {
  bool sse42 = false;
  bool popcnt = false;
  bool avx2 = false;  // usable: the CPU has it and the OS saves the ymm state
};

// The level this library was compiled for.
Level built_level();
// "x86-64-v2" or "x86-64-v2+avx2".
std::string_view level_name(Level level);
// This CPU's features (cpuid through __builtin_cpu_supports).
CpuFeatures this_cpu();
// ok when a CPU with `cpu` runs code of `level`; else Code::unsupported naming what is missing.
Status check(Level level, const CpuFeatures& cpu);
// Exits the process with status 132 and a message on stderr if this CPU is below the built
// level. Run from a priority-101 constructor in isa.cpp, before the library's other static
// initialisers; pm/runtime.cpp refers to it so that a static link keeps isa.cpp's object
// (nothing else calls into it, and an archive member nobody refers to is not linked).
void require_built_level();

// The form of the run-time-dispatched hot searches (docs/isa.md: LB+-Tree, FPTree and NBTree
// lookups): avx2 when this CPU has AVX2, baseline (SSE4.2) otherwise, unless the environment
// variable PMINDEX_ISA says otherwise: "baseline" forces the baseline forms on any CPU (to test
// them), "avx2" asks for AVX2 (granted only if the CPU has it), "auto" or unset chooses by the
// CPU. Read once per process, at the first call; an unknown value or an avx2 request the CPU
// cannot meet is reported on stderr (once) and the choice falls back to the CPU's. An index
// reads this when it is opened and keeps its choice. Thread-safe.
Level search_level();
// search_level's rule for a PMINDEX_ISA value (nullptr: unset) and a CPU; a non-empty
// *warning (size > 0) says why the value was not followed.
Level choose_search_level(const char* env, const CpuFeatures& cpu, char* warning,
                          std::size_t size);

}  // namespace pmindex::isa

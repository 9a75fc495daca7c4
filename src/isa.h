// The instruction-set level the library was compiled for (PMINDEX_ISA, cmake/PmindexTargets.cmake)
// and the check that this CPU runs it. Internal: the public face is pmindex::isa_level() and
// pmindex::isa_check() in pmindex/index.h.
#pragma once

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

}  // namespace pmindex::isa

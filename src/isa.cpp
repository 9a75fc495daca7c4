// The ISA level check. This translation unit is compiled for plain x86-64 (SSE2 only; the
// -mno-sse3 -mno-popcnt in src/CMakeLists.txt), so the check itself runs on any x86-64 CPU and
// can stop a library built for a level the CPU lacks before any of its other code runs.
#include "isa.h"

#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pmindex/index.h"

#ifndef PMINDEX_ISA_LEVEL
#error "PMINDEX_ISA_LEVEL is set by cmake/PmindexTargets.cmake"
#endif

namespace pmindex {
namespace isa {

Level built_level() { return static_cast<Level>(PMINDEX_ISA_LEVEL); }

std::string_view level_name(Level level) {
  return level == Level::avx2 ? "x86-64-v2+avx2" : "x86-64-v2";
}

CpuFeatures this_cpu() {
  __builtin_cpu_init();  // may run from a constructor, before libgcc's own
  CpuFeatures f;
  f.sse42 = __builtin_cpu_supports("sse4.2") != 0;
  f.popcnt = __builtin_cpu_supports("popcnt") != 0;
  f.avx2 = __builtin_cpu_supports("avx2") != 0;
  return f;
}

// The reason a CPU with `cpu` cannot run code of `level`, written into out (empty if it can).
// Plain C string handling: the load-time check below runs it on a CPU that may lack the
// library's level, so it must not reach inline C++ code that another translation unit, built
// for that level, may have provided to the linker (std::string, Status).
void explain(Level level, const CpuFeatures& cpu, char* out, std::size_t size) {
  char missing[64] = "";
  const auto need = [&](bool have, const char* name) {
    if (have) return;
    if (missing[0] != '\0') std::strncat(missing, ", ", sizeof missing - std::strlen(missing) - 1);
    std::strncat(missing, name, sizeof missing - std::strlen(missing) - 1);
  };
  need(cpu.sse42, "SSE4.2");
  need(cpu.popcnt, "POPCNT");
  if (level == Level::avx2) need(cpu.avx2, "AVX2");
  out[0] = '\0';
  if (missing[0] == '\0') return;
  std::snprintf(out, size,
                "this libpmindex is built for %s (PMINDEX_ISA) and this CPU lacks %s; use a "
                "build with PMINDEX_ISA=baseline (the packaged library)",
                level == Level::avx2 ? "x86-64-v2+avx2" : "x86-64-v2", missing);
}

Status check(Level level, const CpuFeatures& cpu) {
  char why[256];
  explain(level, cpu, why, sizeof why);
  if (why[0] == '\0') return {};
  return Status(Code::unsupported, why);
}

void require_built_level() {
  char why[256];
  explain(built_level(), this_cpu(), why, sizeof why);
  if (why[0] == '\0') return;
  std::fprintf(stderr, "libpmindex: %s\n", why);
  _exit(132);
}

Level choose_search_level(const char* env, const CpuFeatures& cpu, char* warning,
                          std::size_t size) {
  if (size > 0) warning[0] = '\0';
  const Level by_cpu = cpu.avx2 ? Level::avx2 : Level::baseline;
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0) return by_cpu;
  if (std::strcmp(env, "baseline") == 0) return Level::baseline;
  if (std::strcmp(env, "avx2") == 0) {
    if (by_cpu == Level::avx2) return Level::avx2;
    std::snprintf(warning, size, "PMINDEX_ISA=avx2 but this CPU lacks AVX2; using x86-64-v2");
    return by_cpu;
  }
  std::snprintf(warning, size,
                "PMINDEX_ISA='%.40s' is not auto, baseline or avx2; ignored (using %s)", env,
                by_cpu == Level::avx2 ? "x86-64-v2+avx2" : "x86-64-v2");
  return by_cpu;
}

Level search_level() {
  static const Level level = [] {
    char warning[160];
    const Level l = choose_search_level(std::getenv("PMINDEX_ISA"), this_cpu(), warning,
                                        sizeof warning);
    if (warning[0] != '\0') std::fprintf(stderr, "libpmindex: %s\n", warning);
    return l;
  }();
  return level;
}

namespace {
// Runs before the library's other static initialisers (priority 101 precedes the default
// ones) and before main: a CPU below the built level would otherwise fault with SIGILL at
// the first vector instruction, anywhere. Exit status 132 is what that SIGILL would give.
[[gnu::constructor(101)]] void stop_below_built_level() { require_built_level(); }
}  // namespace

}  // namespace isa

std::string_view isa_level() { return isa::level_name(isa::built_level()); }

Status isa_check() { return isa::check(isa::built_level(), isa::this_cpu()); }

}  // namespace pmindex

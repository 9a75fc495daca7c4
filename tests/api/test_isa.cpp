// The ISA level (README "Minimum CPU"): the library reports the level the build asked for,
// and the CPU check refuses a CPU below a level and names what it lacks.
#include <gtest/gtest.h>

#include <string>

#include "isa.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

constexpr isa::CpuFeatures kAll{.sse42 = true, .popcnt = true, .avx2 = true};

TEST(Isa, ReportsTheLevelTheBuildAskedFor) {
  // PMINDEX_EXPECT_ISA: the PMINDEX_ISA this test was configured with (tests/CMakeLists.txt).
  const std::string want = PMINDEX_EXPECT_ISA;
  EXPECT_EQ(isa_level(), want == "avx2" ? "x86-64-v2+avx2" : "x86-64-v2");
  EXPECT_EQ(isa_level(), isa::level_name(isa::built_level()));
}

TEST(Isa, ThisCpuRunsTheLibrary) {
  // The library's load-time check let this process start, so the public check agrees.
  const Status s = isa_check();
  EXPECT_TRUE(s.ok()) << s.to_string();
  const isa::CpuFeatures cpu = isa::this_cpu();
  EXPECT_TRUE(cpu.sse42 && cpu.popcnt);  // the baseline: this test binary is built for it
}

TEST(Isa, BaselineNeedsSse42AndPopcntOnly) {
  EXPECT_TRUE(isa::check(isa::Level::baseline, kAll).ok());
  EXPECT_TRUE(isa::check(isa::Level::baseline, {.sse42 = true, .popcnt = true, .avx2 = false}).ok());
  const Status s = isa::check(isa::Level::baseline, {.sse42 = false, .popcnt = false, .avx2 = true});
  EXPECT_EQ(s.code(), Code::unsupported);
  EXPECT_NE(s.message().find("lacks SSE4.2, POPCNT;"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("built for x86-64-v2 "), std::string::npos) << s.message();
}

TEST(Isa, Avx2LevelRefusesACpuWithoutAvx2) {
  EXPECT_TRUE(isa::check(isa::Level::avx2, kAll).ok());
  const Status s = isa::check(isa::Level::avx2, {.sse42 = true, .popcnt = true, .avx2 = false});
  EXPECT_EQ(s.code(), Code::unsupported);
  EXPECT_NE(s.message().find("built for x86-64-v2+avx2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("lacks AVX2;"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("PMINDEX_ISA=baseline"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace pmindex

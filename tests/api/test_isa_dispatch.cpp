// Run-time dispatch of the hot searches (docs/isa.md): the rule that picks the form from
// PMINDEX_ISA and the CPU, the form this process picked, and the answers of LB+-Tree, FPTree
// and NBTree lookups in that form against std::map. tests/CMakeLists.txt runs this binary
// twice: as it is (the AVX2 forms on an AVX2 CPU) and with PMINDEX_ISA=baseline (the SSE4.2 /
// SWAR forms on the same CPU), telling it through PMINDEX_EXPECT_SEARCH which form to expect.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <string>

#include "index/common/map_checker.h"
#include "isa.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using namespace pmindex::testing;

constexpr isa::CpuFeatures kAvx2Cpu{.sse42 = true, .popcnt = true, .avx2 = true};
constexpr isa::CpuFeatures kV2Cpu{.sse42 = true, .popcnt = true, .avx2 = false};

isa::Level choose(const char* env, const isa::CpuFeatures& cpu, std::string* warning) {
  char buf[160];
  const isa::Level l = isa::choose_search_level(env, cpu, buf, sizeof buf);
  *warning = buf;
  return l;
}

TEST(IsaDispatch, UnsetOrAutoFollowsTheCpu) {
  std::string w;
  for (const char* env : {static_cast<const char*>(nullptr), "", "auto"}) {
    EXPECT_EQ(choose(env, kAvx2Cpu, &w), isa::Level::avx2);
    EXPECT_EQ(w, "");
    EXPECT_EQ(choose(env, kV2Cpu, &w), isa::Level::baseline);
    EXPECT_EQ(w, "");
  }
}

TEST(IsaDispatch, BaselineOverrideWinsOnAnAvx2Cpu) {
  std::string w;
  EXPECT_EQ(choose("baseline", kAvx2Cpu, &w), isa::Level::baseline);
  EXPECT_EQ(w, "");
  EXPECT_EQ(choose("avx2", kAvx2Cpu, &w), isa::Level::avx2);
  EXPECT_EQ(w, "");
}

// The known-bad inputs: never silently ignored.
TEST(IsaDispatch, UnknownValueIsReportedAndIgnored) {
  std::string w;
  EXPECT_EQ(choose("basline", kAvx2Cpu, &w), isa::Level::avx2);
  EXPECT_NE(w.find("PMINDEX_ISA='basline' is not auto, baseline or avx2"), std::string::npos) << w;
  EXPECT_EQ(choose("AVX2", kV2Cpu, &w), isa::Level::baseline);
  EXPECT_NE(w.find("ignored (using x86-64-v2)"), std::string::npos) << w;
}

TEST(IsaDispatch, Avx2RequestOnACpuWithoutItFallsBack) {
  std::string w;
  EXPECT_EQ(choose("avx2", kV2Cpu, &w), isa::Level::baseline);
  EXPECT_NE(w.find("lacks AVX2"), std::string::npos) << w;
}

// PMINDEX_EXPECT_SEARCH (set by ctest): "baseline" when PMINDEX_ISA=baseline is set, "cpu"
// otherwise. A build whose override were ignored fails here.
TEST(IsaDispatch, ThisProcessUsesTheExpectedForm) {
  const char* expect = std::getenv("PMINDEX_EXPECT_SEARCH");
  ASSERT_NE(expect, nullptr) << "run through ctest (tests/CMakeLists.txt)";
  const isa::Level want = std::string(expect) == "baseline" ? isa::Level::baseline
                          : isa::this_cpu().avx2            ? isa::Level::avx2
                                                            : isa::Level::baseline;
  EXPECT_EQ(isa::search_level(), want);
  std::printf("search form: %s\n", std::string(isa::level_name(isa::search_level())).c_str());
}

// Lookups of present and absent integer keys in trees of several levels (small nodes) and
// leaves of each fingerprint width, in whatever form this process chose.
class DispatchedLookups : public ::testing::TestWithParam<std::tuple<const char*, std::uint32_t>> {};

TEST_P(DispatchedLookups, AgreeWithAMap) {
  const auto [kind, node_size] = GetParam();
  TempDir dir;
  Options o;
  o.kind = kind;
  o.path = dir.file("d.pool");
  o.pool_size = 32 << 20;
  o.node_size = node_size;
  o.key_type = KeyType::u64;
  o.max_key_size = 8;
  o.max_value_size = 8;
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  std::map<std::uint64_t, std::uint64_t> model;
  std::mt19937_64 rng(25);
  for (int i = 0; i < 6000; ++i) {
    const std::uint64_t k = rng() >> (i % 3 == 0 ? 40 : 0);  // dense and sparse keys
    const std::uint64_t v = rng() | 1;
    const Code c = idx->insert(encode_u64(k), encode_u64(v));
    if (model.emplace(k, v).second) {
      ASSERT_EQ(c, Code::ok);
    } else {
      ASSERT_EQ(c, Code::already_present);
    }
  }
  std::string value;
  for (const auto& [k, v] : model) {
    ASSERT_EQ(idx->find(encode_u64(k), &value), Code::ok) << k;
    ASSERT_EQ(value, encode_u64(v)) << k;
    // Neighbours: absent unless in the model.
    for (const std::uint64_t n : {k - 1, k + 1}) {
      const Code c = idx->find(encode_u64(n), &value);
      ASSERT_EQ(c, model.count(n) != 0 ? Code::ok : Code::not_found) << n;
    }
  }
  for (const std::uint64_t edge : {std::uint64_t{0}, ~std::uint64_t{0}, std::uint64_t{1} << 63})
    ASSERT_EQ(idx->find(encode_u64(edge), &value),
              model.count(edge) != 0 ? Code::ok : Code::not_found);
}

INSTANTIATE_TEST_SUITE_P(Kinds, DispatchedLookups,
                         ::testing::Values(std::make_tuple("lbtree", 256u),
                                           std::make_tuple("lbtree", 1024u),
                                           std::make_tuple("fptree", 192u),    // 8 entries
                                           std::make_tuple("fptree", 576u),    // 32
                                           std::make_tuple("fptree", 1152u),   // 64
                                           std::make_tuple("nbtree", 128u),
                                           std::make_tuple("nbtree", 256u)));

}  // namespace
}  // namespace pmindex

// The shared-key counting test (shared_key_test.h) for every index kind, in every persistence
// mode: two threads insert / remove / update / upsert / find / scan the same 64 keys with
// small nodes, and per key the tallies must match presence at the end and after reopen.
// Label: stress (TSan in CI, PMINDEX_STRESS_SECONDS each); the `long` variant runs longer.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "index/common/shared_key_test.h"

namespace pmindex {
namespace {

using index_test::SharedKeyConfig;

// Small nodes, so splits (and in NBTree, where a leaf never reuses a slot, constant SMOs)
// happen every few operations on 64 keys.
std::uint32_t small_node(const std::string& kind) {
  if (kind == "nbtree") return 128;   // leaf capacity 7
  if (kind == "lbtree") return 256;   // the smallest tested layout
  if (kind == "fptree") return 192;   // sizeof(fptree::Leaf<8>)
  if (kind == "apex") return 1024;    // 56 records per data node
  if (kind == "utree") return 64;     // DRAM leaves of 2 entries
  if (kind == "pactree") return 192;  // data nodes of 4 slots
  if (kind == "dptree") return 320;   // 8-slot base leaves: a merge every 8 writes
  return 0;                           // reflist: no nodes
}

SharedKeyConfig config(const std::string& kind, pm::Mode mode) {
  SharedKeyConfig cfg;
  cfg.options.kind = kind;
  cfg.options.node_size = small_node(kind);
  cfg.options.persistence = mode;
  cfg.options.pool_size = 64 << 20;
  return cfg;
}

std::string report(const std::vector<std::string>& failures) {
  std::string s;
  for (const auto& f : failures) s += "\n  " + f;
  return s;
}

class SharedKeys : public ::testing::TestWithParam<std::tuple<std::string, pm::Mode>> {};

TEST_P(SharedKeys, TalliesMatchPresence) {
  const auto& [kind, mode] = GetParam();
  std::uint64_t ops = 0;
  const auto failures = index_test::run_shared_key_test(config(kind, mode), &ops);
  EXPECT_TRUE(failures.empty()) << kind << " " << pm::to_string(mode) << report(failures);
  EXPECT_GT(ops, 1000u) << "too few operations to mean anything";
  std::printf("[shared-key] %s %s: %llu operations\n", kind.c_str(),
              std::string(pm::to_string(mode)).c_str(), static_cast<unsigned long long>(ops));
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, SharedKeys,
    ::testing::Combine(::testing::Values("reflist", "lbtree", "fptree", "nbtree", "apex", "utree", "part",
                                         "dptree"),
                       ::testing::Values(pm::Mode::adr, pm::Mode::eadr, pm::Mode::dram)),
    [](const auto& p) {
      return std::get<0>(p.param) + "_" + std::string(pm::to_string(std::get<1>(p.param)));
    });
INSTANTIATE_TEST_SUITE_P(
    PacTree, SharedKeys,
    ::testing::Combine(::testing::Values("pactree"),
                       ::testing::Values(pm::Mode::adr, pm::Mode::eadr, pm::Mode::dram)),
    [](const auto& p) {
      return std::get<0>(p.param) + "_" + std::string(pm::to_string(std::get<1>(p.param)));
    });
INSTANTIATE_TEST_SUITE_P(
    Roart, SharedKeys,
    ::testing::Combine(::testing::Values("roart"),
                       ::testing::Values(pm::Mode::adr, pm::Mode::eadr, pm::Mode::dram)),
    [](const auto& p) {
      return std::get<0>(p.param) + "_" + std::string(pm::to_string(std::get<1>(p.param)));
    });

// The checker must be able to fail: a driver that does not tally one successful remove, and
// one that writes another key's value, on a correct index (reflist).
TEST(SharedKeysChecker, CatchesAnUntalliedRemove) {
  SharedKeyConfig cfg = config("reflist", pm::Mode::eadr);
  cfg.seconds = 0.3;
  cfg.fault = SharedKeyConfig::Fault::untallied_remove;
  const auto failures = index_test::run_shared_key_test(cfg);
  ASSERT_FALSE(failures.empty());
  EXPECT_NE(failures.front().find("removes_ok"), std::string::npos) << report(failures);
}

TEST(SharedKeysChecker, CatchesAForeignValue) {
  SharedKeyConfig cfg = config("reflist", pm::Mode::eadr);
  cfg.seconds = 0.3;
  cfg.fault = SharedKeyConfig::Fault::foreign_value;
  const auto failures = index_test::run_shared_key_test(cfg);
  ASSERT_FALSE(failures.empty());
  EXPECT_NE(report(failures).find("no thread wrote"), std::string::npos) << report(failures);
}

}  // namespace
}  // namespace pmindex

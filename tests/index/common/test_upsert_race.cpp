// Index::upsert against a concurrent remove, for every registered index kind (issue 27 item 5).
//
// An upsert is insert-or-update: whatever a concurrent remove does, it must end with the key
// present and answer ok. The old base-class upsert (insert, then update on already_present)
// answered not_found when a remove landed between its two steps; lbtree, fptree and reflist
// got that thousands of times per second in this test.
//
// One thread upserts 8 keys round-robin while another removes them, for
// PMINDEX_STRESS_SECONDS / 2 (default 1 s) per kind. Anonymous DRAM pool: no file.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "pmindex/index.h"

namespace pmindex {
namespace {

double seconds_per_kind() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  const double total = s != nullptr ? std::atof(s) : 2.0;
  return total > 0 ? total / 2 : 1.0;
}

class UpsertRace : public ::testing::TestWithParam<std::string> {};

TEST_P(UpsertRace, UpsertNeverAnswersNotFoundUnderConcurrentRemove) {
  Options o;
  o.kind = GetParam();
  o.persistence = pm::Mode::dram;
  o.expected_records = 1000;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Index& idx = **r;
  constexpr int kKeys = 8;
  std::string keys[kKeys];
  for (int i = 0; i < kKeys; ++i) keys[i] = encode_u64(1000 + 7 * i);
  const std::string value = encode_u64(42);

  std::atomic<bool> stop{false};  // relaxed is enough: only ends the loops, publishes nothing
  std::uint64_t removes = 0;
  std::thread remover([&] {
    auto scope = idx.attach_thread();
    for (int i = 0; !stop.load(std::memory_order_relaxed); i = (i + 1) % kKeys)
      if (idx.remove(keys[i]) == Code::ok) ++removes;
  });
  std::uint64_t upserts = 0, not_found = 0, other = 0;
  {
    auto scope = idx.attach_thread();
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::duration<double>(seconds_per_kind());
    while (std::chrono::steady_clock::now() < end) {
      for (int i = 0; i < kKeys; ++i, ++upserts) {
        const Code c = idx.upsert(keys[i], value);
        if (c == Code::not_found) ++not_found;
        else if (c != Code::ok) ++other;
      }
    }
  }
  stop.store(true, std::memory_order_relaxed);
  remover.join();
  EXPECT_EQ(not_found, 0u) << "of " << upserts << " upserts (" << removes << " removes)";
  EXPECT_EQ(other, 0u);
  // Without a remove in between, every key an upsert wrote is there with its value.
  for (const std::string& k : keys) {
    ASSERT_EQ(idx.upsert(k, value), Code::ok);
    std::string got;
    ASSERT_EQ(idx.find(k, &got), Code::ok);
    EXPECT_EQ(got, value);
  }
  EXPECT_TRUE(idx.verify().ok()) << idx.verify().to_string();
  EXPECT_GT(removes, 0u) << "the remover never removed: the race was not exercised";
}

INSTANTIATE_TEST_SUITE_P(AllKinds, UpsertRace, ::testing::ValuesIn(IndexRegistry::names()),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

// Index::find_many under a concurrent writer, for every registered index kind (issue 17): one
// thread inserts and removes a churn set of keys (splits, merges, leaf removals, SMOs) while
// two threads look up batches mixing stable keys (always present), churn keys and keys that
// are never present. Every batched answer must be one find could give: a stable key found
// with its value, a churn key absent or found with its value, a never-present key absent.
// Run under TSan (label stress) it also checks that the batched reader protocol has no data
// race. PMINDEX_STRESS_SECONDS / 4 per kind and key mode (default 0.5 s). Anonymous DRAM
// pool: no file.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "index/common/find_many_faults.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

double seconds_per_kind() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  const double total = s != nullptr ? std::atof(s) : 2.0;
  return total > 0 ? total / 4 : 0.5;
}

// Keys 4 i are stable, 4 i + 1 churn, 4 i + 2 never present; the value of key k is 3 k + 1.
constexpr std::uint64_t kIds = 3000;
std::string value_of(std::uint64_t k) { return encode_u64(3 * k + 1); }

struct RaceOutcome {
  std::uint64_t batches = 0, wrong = 0, writes = 0;
};

// Stable keys loaded, then the writer and two batched readers for seconds_per_kind().
RaceOutcome run_race(Index& idx) {
  RaceOutcome out;
  for (std::uint64_t i = 0; i < kIds; ++i)
    EXPECT_EQ(idx.insert(encode_u64(4 * i), value_of(4 * i)), Code::ok);
  std::atomic<bool> stop{false};  // relaxed: only ends the loops, publishes nothing
  std::thread writer([&] {
    auto scope = idx.attach_thread();
    while (!stop.load(std::memory_order_relaxed)) {
      for (std::uint64_t i = 0; i < kIds; ++i)
        if (idx.insert(encode_u64(4 * i + 1), value_of(4 * i + 1)) == Code::ok) ++out.writes;
      for (std::uint64_t i = 0; i < kIds; ++i)
        if (idx.remove(encode_u64(4 * i + 1)) == Code::ok) ++out.writes;
    }
  });
  std::atomic<std::uint64_t> batches{0}, wrong{0};
  auto reader = [&](std::uint64_t seed) {
    auto scope = idx.attach_thread();
    std::mt19937_64 rng(seed);
    std::vector<std::string> keys(Index::kFindBatch);
    std::vector<std::string_view> views(keys.size());
    std::vector<std::string> values(keys.size());
    std::vector<Code> codes(keys.size());
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::duration<double>(seconds_per_kind());
    while (std::chrono::steady_clock::now() < end) {
      for (std::size_t j = 0; j < keys.size(); ++j) {
        keys[j] = encode_u64(4 * (rng() % kIds) + rng() % 3);
        views[j] = keys[j];
      }
      if (idx.find_many(views, values, codes) != Code::ok) ++wrong;
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const std::uint64_t k = decode_u64(keys[j]);
        const bool ok = codes[j] == Code::ok && values[j] == value_of(k);
        switch (k % 4) {
          case 0: wrong += !ok; break;                                   // stable
          case 1: wrong += !(ok || codes[j] == Code::not_found); break;  // churn
          default: wrong += codes[j] != Code::not_found;                 // never present
        }
      }
      ++batches;
    }
  };
  std::thread r1(reader, 1), r2(reader, 2);
  r1.join();
  r2.join();
  stop.store(true, std::memory_order_relaxed);
  writer.join();
  out.batches = batches.load();
  out.wrong = wrong.load();
  return out;
}

Options race_options(const std::string& kind) {
  Options o;
  o.kind = kind;
  o.persistence = pm::Mode::dram;
  o.expected_records = 2 * kIds;
  return o;
}

class FindManyRace : public ::testing::TestWithParam<std::string> {};

TEST_P(FindManyRace, BatchedAnswersStayConsistentUnderAWriter) {
  auto r = Index::open(race_options(GetParam()));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const RaceOutcome out = run_race(**r);
  EXPECT_EQ(out.wrong, 0u) << "of " << out.batches << " batches";
  EXPECT_GT(out.writes, 0u) << "the writer never wrote: the race was not exercised";
  EXPECT_GT(out.batches, 0u);
  EXPECT_TRUE((*r)->verify().ok()) << (*r)->verify().to_string();
}

// The same race with the keys as byte strings (kinds that take them): the batched byte-key
// paths (lbtree's find_batch_general, part's trie) under a writer.
TEST_P(FindManyRace, BytesKeysStayConsistentUnderAWriter) {
  Options o = race_options(GetParam());
  o.key_type = KeyType::bytes;
  o.max_key_size = 8;
  auto r = Index::open(o);
  if (!r.ok()) GTEST_SKIP() << o.kind << " takes no byte-string keys: " << r.status().to_string();
  const RaceOutcome out = run_race(**r);
  EXPECT_EQ(out.wrong, 0u) << "of " << out.batches << " batches";
  EXPECT_GT(out.writes, 0u);
  EXPECT_TRUE((*r)->verify().ok()) << (*r)->verify().to_string();
}

// The check must be able to fail: batched answers that lose a stable key are counted wrong.
TEST(FindManyRaceChecker, CountsALostAnswer) {
  auto r = Index::open(race_options("reflist"));
  ASSERT_TRUE(r.ok());
  index_test::DropsLast idx(std::move(*r));
  const RaceOutcome out = run_race(idx);
  EXPECT_GT(out.batches, 0u);
  EXPECT_GT(out.wrong, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, FindManyRace, ::testing::ValuesIn(IndexRegistry::names()),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

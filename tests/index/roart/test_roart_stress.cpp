// Two threads, mixed insert / update / remove / find / scan on roart, checked against
// per-thread oracles (tests/index/common/hybrid_stress.h): thread t owns keys with
// key % 2 == t, so both threads change the same leaf arrays (grows, shrinks, splits race with
// optimistic readers and scans). Time-boxed by PMINDEX_STRESS_SECONDS (default 2).
// Run under TSan (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "index/common/hybrid_stress.h"
#include "index/roart/roart.h"

namespace pmindex {
namespace {

void stress(KeyType kt, std::uint64_t key_range, double seconds, const char* label) {
  Options o;
  o.kind = "roart";
  o.key_type = kt;
  o.max_key_size = 8;
  o.pool_size = 64 << 20;
  hybrid_test::run_two_thread_stress(
      o, key_range, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 2, .find = 1, .scan = 1}, 91,
      label);
}

TEST(RoartStress, TwoThreadsAgainstOracle) {
  const double t = hybrid_test::stress_seconds();
  stress(KeyType::u64, 300, t / 2, "roart u64 300 keys");
  stress(KeyType::u64, 100000, t / 2, "roart u64 sparse");
}

// Merges racing with inserts next door: the key space is cut into blocks of 40 keys owned by
// the two threads in turn (block b belongs to thread b % 2), so neighbouring leaf arrays hold
// different threads' keys. Each thread fills its blocks and drains them again in rounds
// (random order), so underfull arrays merge with neighbours the other thread is filling or
// draining (both lock orders of M0: rightward and leftward), while finds check each key.
TEST(RoartStress, MergesBesideInsertsInNeighbouringRanges) {
  constexpr std::uint64_t kBlock = 40, kBlocks = 16;
  Options o;
  o.kind = "roart";
  o.key_type = KeyType::u64;
  o.pool_size = 64 << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  const double seconds = hybrid_test::stress_seconds();
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  std::atomic<int> failures{0};
  std::set<std::uint64_t> kept[2];
  auto body = [&](int id) {
    auto scope = idx->attach_thread();
    std::mt19937_64 rng(77 + id);
    std::vector<std::uint64_t> mine;
    for (std::uint64_t b = id; b < kBlocks; b += 2)
      for (std::uint64_t k = 0; k < kBlock; ++k) mine.push_back(b * kBlock + k);
    std::set<std::uint64_t>& in = kept[id];
    auto expect = [&](bool ok, const char* what, std::uint64_t k) {
      if (!ok && failures.fetch_add(1) < 10) ADD_FAILURE() << "thread " << id << ": " << what << " " << k;
    };
    for (int round = 0; round < 4 || std::chrono::steady_clock::now() < until; ++round) {
      std::shuffle(mine.begin(), mine.end(), rng);
      for (const std::uint64_t k : mine) {
        if (in.count(k) != 0) continue;
        expect(idx->insert(encode_u64(k), encode_u64(k)) == Code::ok, "insert", k);
        in.insert(k);
      }
      std::shuffle(mine.begin(), mine.end(), rng);
      for (std::size_t j = 0; j < mine.size() * 9 / 10; ++j) {
        const std::uint64_t k = mine[j];
        expect(idx->remove(encode_u64(k)) == Code::ok, "remove", k);
        in.erase(k);
        const std::uint64_t probe = mine[rng() % mine.size()];
        std::string got;
        const Code c = idx->find(encode_u64(probe), &got);
        expect(in.count(probe) != 0 ? c == Code::ok && got == encode_u64(probe) : c == Code::not_found,
               "find", probe);
      }
    }
  };
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(failures.load(), 0);
  const Status s = idx->verify();
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (const auto& set : kept)
    for (const std::uint64_t k : set) EXPECT_EQ(idx->find(encode_u64(k), nullptr), Code::ok) << k;
  EXPECT_EQ(idx->size(), kept[0].size() + kept[1].size());
  EXPECT_GT(static_cast<const roart::Roart&>(*idx).merges(), 0u);
}

}  // namespace
}  // namespace pmindex

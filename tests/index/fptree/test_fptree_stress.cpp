// Two threads, mixed insert / update / remove / find / scan, checked against per-thread
// oracles. Thread t owns the keys with key % 2 == t, so both threads write the same leaves:
// leaf locks, splits (split micro-log), empty-leaf removal (delete micro-log, try-lock of the
// neighbour) and inner-node SMOs race, while each thread can still check its keys exactly.
// 8-entry leaves (many SMOs, inner fanout 4) and the paper's 64-entry leaves. Time-boxed by
// PMINDEX_STRESS_SECONDS (default 2). Run under TSan (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "index/fptree/leaf.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

using Map = std::map<std::string, std::string>;

class Worker {
 public:
  Worker(Index& idx, int id, std::uint64_t key_range, std::atomic<int>& failures)
      : idx_(idx), id_(id), range_(key_range), failures_(failures), rng_(77 + id) {}

  void step() {
    const std::uint64_t kn = (rng_() % range_) * 2 + static_cast<std::uint64_t>(id_);
    const std::string k = encode_u64(kn);
    const std::string v = encode_u64(rng_() | (std::uint64_t{1} << 63));
    const auto it = mine_.find(k);
    const bool present = it != mine_.end();
    switch (rng_() % 7) {
      case 0:
      case 1:
        expect(idx_.insert(k, v) == (present ? Code::already_present : Code::ok), "insert", kn);
        if (!present) mine_[k] = v;
        break;
      case 2:
        expect(idx_.update(k, v) == (present ? Code::ok : Code::not_found), "update", kn);
        if (present) it->second = v;
        break;
      case 3:
      case 4:
        expect(idx_.remove(k) == (present ? Code::ok : Code::not_found), "remove", kn);
        mine_.erase(k);
        break;
      case 5: {
        std::string got;
        const Code c = idx_.find(k, &got);
        expect(present ? c == Code::ok && got == it->second : c == Code::not_found, "find", kn);
        break;
      }
      default:
        check_scan(k, kn);
    }
  }
  const Map& oracle() const { return mine_; }

 private:
  void expect(bool ok, const char* what, std::uint64_t key) {
    if (!ok && failures_.fetch_add(1) < 10)
      ADD_FAILURE() << "thread " << id_ << ": " << what << " of key " << key;
  }
  // The scan is sorted, and restricted to my keys it equals my oracle from k on.
  void check_scan(const std::string& k, std::uint64_t kn) {
    constexpr std::size_t kLen = 20;
    idx_.scan(k, kLen, buf_);
    auto it = mine_.lower_bound(k);
    for (std::size_t j = 0; j < buf_.size(); ++j) {
      expect(j == 0 || buf_.key(j - 1) < buf_.key(j), "scan order", kn);
      if (decode_u64(buf_.key(j)) % 2 != static_cast<std::uint64_t>(id_)) continue;
      const bool same = it != mine_.end() && it->first == buf_.key(j) && it->second == buf_.value(j);
      expect(same, "scan content", kn);
      if (!same) return;
      ++it;
    }
    if (buf_.size() < kLen) expect(it == mine_.end(), "scan ended early", kn);
  }

  Index& idx_;
  int id_;
  std::uint64_t range_;
  std::atomic<int>& failures_;
  std::mt19937_64 rng_;
  Map mine_;
  ScanBuffer buf_;
};

void stress(std::uint32_t node_size, std::uint64_t key_range, double seconds) {
  Options o;
  o.kind = "fptree";
  o.node_size = node_size;
  o.pool_size = 64 << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> total{0};
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  std::vector<Worker> workers;
  for (int id = 0; id < 2; ++id) workers.emplace_back(*idx, id, key_range, failures);
  auto body = [&](int id) {
    auto scope = idx->attach_thread();
    std::uint64_t n = 0;
    for (; n < 200 || std::chrono::steady_clock::now() < until; ++n) workers[id].step();
    total.fetch_add(n);
  };
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(failures.load(), 0);
  const Status s = idx->verify();
  ASSERT_TRUE(s.ok()) << s.to_string();
  Map all = workers[0].oracle();
  all.insert(workers[1].oracle().begin(), workers[1].oracle().end());
  ScanBuffer out;
  ASSERT_EQ(idx->scan({}, all.size() + 1, out), all.size());
  std::size_t i = 0;
  for (const auto& [k, v] : all) {
    ASSERT_EQ(out.key(i), k);
    ASSERT_EQ(out.value(i), v);
    ++i;
  }
  std::printf("fptree leaf %u B: %llu ops, %zu keys at the end\n", node_size,
              static_cast<unsigned long long>(total.load()), all.size());
}

double seconds() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  return s != nullptr ? std::max(0.1, std::atof(s)) : 2.0;
}

TEST(FPTreeStress, TwoThreadsAgainstOracle) {
  stress(sizeof(fptree::Leaf<8>), 300, seconds() / 2);
  stress(sizeof(fptree::Leaf<64>), 3000, seconds() / 2);
}

}  // namespace
}  // namespace pmindex

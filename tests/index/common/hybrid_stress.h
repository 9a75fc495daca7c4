// Two-thread stress shared by the hybrid indexes' tests (LB+-Tree, FPTree): mixed insert /
// update / remove / find / scan against per-thread oracles. Thread t owns the keys with
// key % 2 == t, so both threads write the same leaves (leaf locks, splits, empty-leaf
// removal with the neighbour try-lock, inner-node SMOs race) while each thread can still check
// its own keys exactly. Values name their key (keyed_value), so what a thread reads of the
// other's keys (finds and scans) must be a whole value written for that key: a value of
// another key or the halves of two writes (a torn read) fail. At the end: verify() and a
// full scan against the union of the oracles. Time-boxed by PMINDEX_STRESS_SECONDS (default 2)
// and meant to run under TSan (cmake --preset tsan) for the race check.
//
// Thread safety: each Worker belongs to one thread; the index is the shared object under test.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pmindex/index.h"

namespace pmindex::hybrid_test {

using Map = std::map<std::string, std::string>;

// Relative weights of the operations in the mix.
struct StressMix {
  unsigned insert = 2, update = 1, remove = 1, find = 1, scan = 1;
  unsigned total() const { return insert + update + remove + find + scan; }
};

inline double stress_seconds() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  return s != nullptr ? std::max(0.1, std::atof(s)) : 2.0;
}

// An 8-byte value that names its key: the high half random (top bit set), the low half a mix
// of the high half and the key. Halves of two different writes of one key, or a value written
// for another key, fail is_keyed_value (but for a 2^-32 chance).
inline std::uint64_t keyed_low_half(std::uint64_t high, std::uint64_t key) {
  return ((high ^ key) * 0x9E3779B97F4A7C15ull) >> 32;
}
inline std::string keyed_value(std::uint64_t key, std::uint64_t random) {
  const std::uint64_t high = (random >> 32) | 0x80000000u;
  return encode_u64(high << 32 | keyed_low_half(high, key));
}
inline bool is_keyed_value(std::uint64_t key, std::string_view v) {
  if (v.size() != 8) return false;
  const std::uint64_t w = decode_u64(v);
  return (w >> 63) != 0 && (w & 0xFFFFFFFFu) == keyed_low_half(w >> 32, key);
}

class StressWorker {
 public:
  StressWorker(Index& idx, int id, std::uint64_t key_range, StressMix mix, std::uint64_t seed,
               std::atomic<int>& failures)
      : idx_(idx), id_(id), range_(key_range), mix_(mix), failures_(failures), rng_(seed + id) {}

  void step() {
    const std::uint64_t kn = (rng_() % range_) * 2 + static_cast<std::uint64_t>(id_);
    const std::string k = encode_u64(kn);
    const std::string v = keyed_value(kn, rng_());
    const auto it = mine_.find(k);
    const bool present = it != mine_.end();
    unsigned pick = static_cast<unsigned>(rng_() % mix_.total());
    if (pick < mix_.insert) {
      expect(idx_.insert(k, v) == (present ? Code::already_present : Code::ok), "insert", kn);
      if (!present) mine_[k] = v;
    } else if ((pick -= mix_.insert) < mix_.update) {
      expect(idx_.update(k, v) == (present ? Code::ok : Code::not_found), "update", kn);
      if (present) it->second = v;
    } else if ((pick -= mix_.update) < mix_.remove) {
      expect(idx_.remove(k) == (present ? Code::ok : Code::not_found), "remove", kn);
      mine_.erase(k);
    } else if ((pick -= mix_.remove) < mix_.find) {
      std::string got;
      const Code c = idx_.find(k, &got);
      expect(present ? c == Code::ok && got == it->second : c == Code::not_found, "find", kn);
      const Code other = idx_.find(encode_u64(kn ^ 1), &got);  // the other thread's key
      expect(other == Code::not_found || (other == Code::ok && is_keyed_value(kn ^ 1, got)),
             "find of the other thread's key (a torn or foreign value)", kn ^ 1);
    } else {
      check_scan(k, kn);
    }
  }
  const Map& oracle() const { return mine_; }

 private:
  // Sorted, and my keys in the scanned range are exactly my oracle's.
  void check_scan(const std::string& k, std::uint64_t kn) {
    constexpr std::size_t kLen = 30;
    idx_.scan(k, kLen, buf_);
    auto it = mine_.lower_bound(k);
    for (std::size_t j = 0; j < buf_.size(); ++j) {
      expect(j == 0 || buf_.key(j - 1) < buf_.key(j), "scan order", kn);
      const std::uint64_t key = decode_u64(buf_.key(j));
      if (key % 2 != static_cast<std::uint64_t>(id_)) {  // the other thread's: a whole value
        expect(is_keyed_value(key, buf_.value(j)), "scan of the other thread's key", key);
        continue;
      }
      if (it == mine_.end() || it->first != buf_.key(j) || it->second != buf_.value(j)) {
        expect(false, "scan content", kn);
        return;
      }
      ++it;
    }
    if (buf_.size() == kLen) {
      expect(it == mine_.end() || !(it->first < buf_.key(kLen - 1)), "scan missed", kn);
    } else {
      expect(it == mine_.end(), "scan ended early", kn);
    }
  }
  void expect(bool ok, const char* what, std::uint64_t k) {
    if (!ok && failures_.fetch_add(1) < 10)
      ADD_FAILURE() << "thread " << id_ << ": " << what << " key " << k;
  }

  Index& idx_;
  int id_;
  std::uint64_t range_;
  StressMix mix_;
  std::atomic<int>& failures_;
  std::mt19937_64 rng_;
  Map mine_;
  ScanBuffer buf_;
};

// The final checks once the workers stopped: verify(), then one scan from the lowest key must
// list exactly the union of the workers' oracles (their key ranges are disjoint), values
// included. Returns that union's size (0 after a failed check).
inline std::size_t expect_holds_workers_keys(const Index& idx,
                                             const std::vector<StressWorker>& workers) {
  const Status s = idx.verify();
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return 0;
  Map all;
  for (const StressWorker& w : workers) all.insert(w.oracle().begin(), w.oracle().end());
  ScanBuffer out;
  EXPECT_EQ(idx.scan({}, all.size() + 1, out), all.size());
  if (out.size() != all.size()) return 0;
  std::size_t i = 0;
  for (const auto& [k, v] : all) {
    EXPECT_EQ(out.key(i), k);
    EXPECT_EQ(out.value(i), v);
    if (out.key(i) != k || out.value(i) != v) return 0;
    ++i;
  }
  return all.size();
}

// Two workers for `seconds` (at least 200 steps each) on the empty `idx`, then the final checks.
inline void stress_two_threads(Index& idx, std::uint64_t key_range, double seconds,
                               StressMix mix, std::uint64_t seed, const std::string& label) {
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> total{0};
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  std::vector<StressWorker> workers;
  for (int id = 0; id < 2; ++id) workers.emplace_back(idx, id, key_range, mix, seed, failures);
  auto body = [&](int id) {
    auto scope = idx.attach_thread();
    std::uint64_t n = 0;
    for (; n < 200 || std::chrono::steady_clock::now() < until; ++n) workers[id].step();
    total.fetch_add(n);
  };
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(failures.load(), 0);
  const std::size_t keys = expect_holds_workers_keys(idx, workers);
  std::printf("%s: %llu ops, %zu keys at the end\n", label.c_str(),
              static_cast<unsigned long long>(total.load()), keys);
}

// stress_two_threads on a fresh index opened with `o`.
inline void run_two_thread_stress(const Options& o, std::uint64_t key_range, double seconds,
                                  StressMix mix, std::uint64_t seed, const std::string& label) {
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  stress_two_threads(**r, key_range, seconds, mix, seed, label);
}

// Writer t owns keys [t R, (t + 1) R). A round: insert the range ascending (half-full leaves),
// remove every other key (each leaf drops below the merge trigger: merges), check the rest
// with find, remove the rest (empty leaves unlinked). A reader scans the whole key space (keys
// strictly increasing, each key of the writer's even or odd class) and finds. Time-boxed.
// `merges` reads the index's merge counter; the run fails unless merges happened. Keys are u64
// in o.key_type's encoding (bytes mode: the same 8-byte strings, as key records).
inline void run_neighbouring_ranges(const Options& o, double seconds,
                                    const std::function<std::uint64_t(const Index&)>& merges,
                                    const std::string& label) {
  auto opened = Index::open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Index& idx = **opened;
  constexpr std::uint64_t kRange = 600;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  auto fail = [&](const char* what, std::uint64_t k) {
    if (failures.fetch_add(1) < 10) ADD_FAILURE() << what << " key " << k;
  };
  auto writer = [&](std::uint64_t t) {
    const std::uint64_t lo = t * kRange + 1;
    std::string got;
    while (!stop.load(std::memory_order_relaxed)) {
      for (std::uint64_t k = lo; k < lo + kRange; ++k)
        if (const Code c = idx.insert(encode_u64(k), encode_u64(k * 3)); c != Code::ok)
          fail(c == Code::pool_full ? "insert (pool_full)" : "insert", k);
      for (std::uint64_t k = lo; k < lo + kRange; k += 2)
        if (idx.remove(encode_u64(k)) != Code::ok) fail("remove", k);
      for (std::uint64_t k = lo; k < lo + kRange; ++k) {
        const Code c = idx.find(encode_u64(k), &got);
        const bool kept = (k - lo) % 2 == 1;
        if (c != (kept ? Code::ok : Code::not_found)) fail("find", k);
        if (kept && c == Code::ok && got != encode_u64(k * 3)) fail("value", k);
      }
      for (std::uint64_t k = lo + 1; k < lo + kRange; k += 2)
        if (idx.remove(encode_u64(k)) != Code::ok) fail("remove rest", k);
    }
  };
  auto reader = [&] {
    ScanBuffer buf;
    std::string got;
    std::uint64_t i = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint64_t start = (i++ * 97) % (2 * kRange);
      idx.scan(encode_u64(start), 64, buf);
      std::uint64_t prev = 0;
      for (std::size_t j = 0; j < buf.size(); ++j) {
        const std::uint64_t k = decode_u64(buf.key(j));
        if (k < start || (j > 0 && k <= prev)) fail("scan order", k);
        if (buf.value(j) != encode_u64(k * 3)) fail("scan value", k);
        prev = k;
      }
      const std::uint64_t k = start + 1;
      if (idx.find(encode_u64(k), &got) == Code::ok && got != encode_u64(k * 3))
        fail("find value", k);
    }
  };
  std::thread w0(writer, 0), w1(writer, 1), r(reader);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  w0.join();
  w1.join();
  r.join();
  EXPECT_EQ(failures.load(), 0);
  const Status v = idx.verify();
  EXPECT_TRUE(v.ok()) << v.to_string();
  const std::uint64_t n = merges(idx);
  std::printf("[%s] %llu merges\n", label.c_str(), static_cast<unsigned long long>(n));
  EXPECT_GT(n, 0u) << label << ": the workload never merged";
}

}  // namespace pmindex::hybrid_test

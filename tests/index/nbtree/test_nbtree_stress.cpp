// NBTree two-thread randomized stress with random delays injected at every hook (SMO phase
// boundaries and before each CAS), small leaves so SMOs are constant. Oracle:
//   * each thread owns the keys of its parity and writes them with increasing sequence
//     numbers: its own reads must return exactly its last write (it is the only writer);
//   * reads of the other thread's keys must never go back in time: the sequence number seen
//     for a key never decreases (a stale read after a newer one is a linearizability bug);
//   * a few shared keys take upserts and removes from both threads (contention on one slot);
//   * at the end the index equals the union of the owners' final maps, scan agrees, verify().
// Duration: PMINDEX_STRESS_SECONDS (default 2) per persistence mode. Two binaries (issue 16:
// hooks exist only in the tracing flavour): test_nbtree_stress (production flavour, label
// stress, TSan) runs without the delays; test_nbtree_stress_delays (tracing flavour, label
// unit, ASan, 1 s per case) runs the same tests with them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "index/common/shared_key_test.h"
#include "index/nbtree/nbtree.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

constexpr std::uint64_t kKeys = 600;      // owned keys 1..kKeys (parity = owner)
constexpr std::uint64_t kShared = 4;      // shared keys kKeys+1 .. kKeys+kShared

double stress_seconds() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  return s != nullptr ? std::atof(s) : 2.0;
}

class RandomDelays final : public nbtree::Hooks {
 public:
  void at(nbtree::HookPoint, const nbtree::Leaf*) override {
    thread_local std::minstd_rand rng(std::random_device{}());
    const unsigned r = rng() % 64;
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
    } else if (r < 16) {
      std::this_thread::yield();
    }
  }
};

// Installs `delays` (nullptr: removes them) where the library has hook points.
void set_delays(nbtree::NBTree& nb, RandomDelays* delays) {
  if constexpr (nbtree::NBTree::kHooks) nb.set_hooks(delays);
}

std::string make_value(std::uint64_t key, std::uint64_t seq, bool out_of_line) {
  if (!out_of_line) return encode_u64((key << 24) | seq);
  return encode_u64((key << 24) | seq) + "oolv";  // 12 bytes: a record
}

bool parse_value(const std::string& v, std::uint64_t* key, std::uint64_t* seq) {
  if (v.size() != 8 && !(v.size() == 12 && v.substr(8) == "oolv")) return false;
  const std::uint64_t w = decode_u64(v.substr(0, 8));
  *key = w >> 24;
  *seq = w & ((1u << 24) - 1);
  return true;
}

// Keys of `kt` for integer k: u64 the 8-byte big-endian k; bytes the same 8 bytes followed by
// k % 7 more (variable lengths 8..14, memcmp order = the order of k, decode: the first 8).
std::string key_of(KeyType kt, std::uint64_t k) {
  std::string s = encode_u64(k);
  if (kt == KeyType::bytes) s.append(k % 7, static_cast<char>(k));
  return s;
}

// One thread of `run`: owns the keys of its parity (oracle `mine`, sequence numbers `seq_of`)
// and remembers the highest sequence it has seen of each of the other thread's keys. The first
// failure of either thread stops both (`failed`).
class OwnerWorker {
 public:
  OwnerWorker(Index& idx, KeyType kt, int t, std::atomic<bool>& failed)
      : idx_(idx), kt_(kt), t_(t), failed_(failed), rng_(1234 + t) {}

  // Steps until the deadline or a failure; `ops` counts the steps that ran an operation.
  void run_until(std::chrono::steady_clock::time_point deadline, std::atomic<std::uint64_t>& ops) {
    const Index::ThreadScope scope = idx_.attach_thread();
    std::uint64_t n = 0;
    while (!failed_.load(std::memory_order_relaxed)) {
      if ((++n & 63) == 0 && std::chrono::steady_clock::now() > deadline) break;
      if (step()) ops.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const std::map<std::uint64_t, std::string>& mine() const { return mine_; }

 private:
  // One random operation: 70% on my keys, 20% reads of the other's, 7% on the shared keys, 3%
  // short scans. False when the step picked none of the other's keys (no operation ran).
  bool step() {
    const unsigned op = static_cast<unsigned>(rng_() % 100);
    std::uint64_t k = 1 + rng_() % kKeys;
    if (op < 70) {
      own_op(k);
    } else if (op < 90) {
      return foreign_read(k);
    } else if (op < 97) {
      shared_op();
    } else {
      scan_op(k);
    }
    return true;
  }

  // Insert / update / remove / find of one of my keys (the nearest one of my parity to k): the
  // answers are exact, I am the only writer.
  void own_op(std::uint64_t k) {
    const auto me = static_cast<std::uint64_t>(t_);
    if (k % 2 != me) k = k == kKeys ? 2 - me : k + 1;
    if (k % 2 != me) k = 2 - me;
    const std::uint64_t seq = ++seq_of_[k];
    const bool ool = rng_() % 8 == 0;
    const std::string v = make_value(k, seq, ool);
    const bool present = mine_.count(k) != 0;
    const unsigned kind = static_cast<unsigned>(rng_() % 10);
    if (kind < 4) {
      const Code c = idx_.insert(key_of(kt_, k), v);
      if (c != (present ? Code::already_present : Code::ok)) fail("insert result");
      if (!present) mine_[k] = v;
    } else if (kind < 7) {
      const Code c = idx_.update(key_of(kt_, k), v);
      if (c != (present ? Code::ok : Code::not_found)) fail("update result");
      if (present) mine_[k] = v;
    } else if (kind < 9) {
      const Code c = idx_.remove(key_of(kt_, k));
      if (c != (present ? Code::ok : Code::not_found)) fail("remove result");
      mine_.erase(k);
    } else {
      const Code c = idx_.find(key_of(kt_, k), &got_);
      if (present != (c == Code::ok)) fail("own find presence for key " + std::to_string(k));
      if (present && got_ != mine_[k]) fail("own find value for key " + std::to_string(k));
    }
  }

  // A read of the other thread's key next to k: its value belongs to it and its sequence never
  // goes back in time. False when k and k + 1 are both mine (no read).
  bool foreign_read(std::uint64_t k) {
    const auto me = static_cast<std::uint64_t>(t_);
    if (k % 2 == me) k = k == kKeys ? 1 + me : k + 1;
    if (k % 2 == me) return false;
    if (idx_.find(key_of(kt_, k), &got_) == Code::ok) {
      std::uint64_t vk = 0, seq = 0;
      if (!parse_value(got_, &vk, &seq) || vk != k) {
        fail("foreign value is garbage for key " + std::to_string(k));
      } else {
        if (seq < seen_other_[k]) fail("stale read for key " + std::to_string(k));
        seen_other_[k] = seq;
      }
    }
    return true;
  }

  // Both threads upsert and remove the shared keys: an upsert always succeeds.
  void shared_op() {
    const std::uint64_t sk = kKeys + 1 + rng_() % kShared;
    if (rng_() % 2 == 0) {
      const Code c = idx_.upsert(key_of(kt_, sk), make_value(sk, 1, rng_() % 4 == 0));
      if (c != Code::ok) fail("shared upsert");
    } else {
      const Code c = idx_.remove(key_of(kt_, sk));
      if (c != Code::ok && c != Code::not_found) fail("shared remove");
    }
  }

  // A short scan from k: keys ascend from k, values belong to their keys.
  void scan_op(std::uint64_t k) {
    const std::size_t cnt = idx_.scan(key_of(kt_, k), 8, buf_);
    for (std::size_t i = 0; i < cnt; ++i) {
      std::uint64_t vk = 0, seq = 0;
      const std::uint64_t key = decode_u64(buf_.key(i).substr(0, 8));
      if (key < k || (i > 0 && key <= decode_u64(buf_.key(i - 1).substr(0, 8))))
        fail("scan order");
      if (!parse_value(std::string(buf_.value(i)), &vk, &seq) || vk != key) fail("scan value");
    }
  }

  void fail(const std::string& what) {
    if (!failed_.exchange(true)) ADD_FAILURE() << "thread " << t_ << ": " << what;
  }

  Index& idx_;
  KeyType kt_;
  int t_;
  std::atomic<bool>& failed_;
  std::mt19937_64 rng_;
  std::map<std::uint64_t, std::string> mine_;          // my keys: their last value
  std::map<std::uint64_t, std::uint64_t> seq_of_;      // my keys: last sequence written
  std::map<std::uint64_t, std::uint64_t> seen_other_;  // other's keys: highest seq seen
  std::string got_;
  ScanBuffer buf_;
};

// After the run: each owner's keys hold exactly its final map, and a full scan counts those
// plus the shared keys present.
void expect_owners_contents(Index& idx, KeyType kt, const OwnerWorker (&workers)[2]) {
  std::string got;
  std::size_t expected = 0;
  for (int t = 0; t < 2; ++t) {
    for (std::uint64_t k = 1; k <= kKeys; ++k) {
      if (k % 2 != static_cast<std::uint64_t>(t)) continue;
      auto it = workers[t].mine().find(k);
      const Code c = idx.find(key_of(kt, k), &got);
      if (it == workers[t].mine().end()) {
        EXPECT_EQ(c, Code::not_found) << k;
      } else {
        ++expected;
        ASSERT_EQ(c, Code::ok) << k;
        EXPECT_EQ(got, it->second) << k;
      }
    }
  }
  for (std::uint64_t sk = kKeys + 1; sk <= kKeys + kShared; ++sk) {
    if (idx.find(key_of(kt, sk), &got) == Code::ok) ++expected;
  }
  ScanBuffer buf;
  EXPECT_EQ(idx.scan("", 1 << 20, buf), expected);
}

void run(pm::Mode mode, KeyType kt = KeyType::u64) {
  Options o;
  o.kind = "nbtree";
  o.key_type = kt;
  o.max_key_size = 16;
  o.pool_size = 256 << 20;
  o.node_size = 128;
  o.persistence = mode;
  o.max_value_size = 16;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  auto* nb = dynamic_cast<nbtree::NBTree*>(idx.get());
  RandomDelays delays;
  set_delays(*nb, &delays);

  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(stress_seconds()));
  std::atomic<bool> failed{false};
  std::atomic<std::uint64_t> ops{0};
  OwnerWorker workers[2] = {{*idx, kt, 0, failed}, {*idx, kt, 1, failed}};
  std::thread a([&] { workers[0].run_until(deadline, ops); });
  std::thread b([&] { workers[1].run_until(deadline, ops); });
  a.join();
  b.join();
  set_delays(*nb, nullptr);
  ASSERT_FALSE(failed.load());
  Status s = idx->verify();
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_owners_contents(*idx, kt, workers);
  std::printf("%s%s: %llu ops, %zu leaves, %llu merges, %llu reads persisted a line written by "
              "another thread (R1)\n",
              std::string(pm::to_string(mode)).c_str(), kt == KeyType::bytes ? " bytes keys" : "",
              static_cast<unsigned long long>(ops.load()), nb->leaf_count(),
              static_cast<unsigned long long>(nb->merges_linked()),
              static_cast<unsigned long long>(nb->reader_persists()));
}

// Both threads update the same hot keys while filler inserts and removes around them keep
// splitting their leaves, so concurrent updates of one key meet every SMO phase (the sync
// race of PROTOCOL.md S7). Values are (writer, sequence). Checks: a reader never sees a
// writer's sequence go back for a key, and each hot key ends with the last update of one of
// the two threads (an older value winning is a lost update).
void run_hot(pm::Mode mode) {
  Options o;
  o.kind = "nbtree";
  o.pool_size = 256 << 20;
  o.node_size = 128;
  o.persistence = mode;
  o.max_value_size = 16;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  auto* nb = dynamic_cast<nbtree::NBTree*>(idx.get());
  constexpr std::uint64_t kHot = 8;
  auto hot_key = [](std::uint64_t i) { return 1000 * (i + 1); };
  auto value = [](int t, std::uint64_t seq, bool ool) {
    const std::string v = encode_u64((static_cast<std::uint64_t>(t) << 40) | seq);
    return ool ? v + "oolv" : v;
  };
  for (std::uint64_t i = 0; i < kHot; ++i) {
    ASSERT_EQ(idx->insert(encode_u64(hot_key(i)), value(0, 0, false)), Code::ok);
  }
  RandomDelays delays;
  set_delays(*nb, &delays);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(stress_seconds());
  std::atomic<bool> failed{false};
  std::string last[2][kHot];
  auto worker = [&](int t) {
    const Index::ThreadScope scope = idx->attach_thread();
    std::mt19937_64 rng(77 + t);
    std::uint64_t seq = 0;
    std::uint64_t seen[2][kHot] = {};
    std::string got;
    auto fail = [&](const std::string& what) {
      if (!failed.exchange(true)) ADD_FAILURE() << "thread " << t << ": " << what;
    };
    std::uint64_t n = 0;
    while (!failed.load(std::memory_order_relaxed)) {
      if ((++n & 63) == 0 && std::chrono::steady_clock::now() > deadline) break;
      const unsigned op = static_cast<unsigned>(rng() % 10);
      const std::uint64_t h = rng() % kHot;
      if (op < 4) {
        const std::string v = value(t, ++seq, rng() % 8 == 0);
        if (idx->update(encode_u64(hot_key(h)), v) != Code::ok) fail("hot update");
        last[t][h] = v;
      } else if (op < 6) {
        if (idx->find(encode_u64(hot_key(h)), &got) != Code::ok) {
          fail("hot key missing");
          continue;
        }
        const std::uint64_t w = decode_u64(got.substr(0, 8));
        const int writer = static_cast<int>(w >> 40);
        const std::uint64_t s = w & ((std::uint64_t{1} << 40) - 1);
        if (writer > 1 || s < seen[writer][h]) fail("hot key read went back in time");
        else seen[writer][h] = s;
      } else {
        // Fillers next to the hot keys: the leaves holding them keep splitting.
        const std::uint64_t f = hot_key(h) - 400 + rng() % 800;
        if (f == hot_key(h)) continue;
        // Both threads touch the fillers: a remove finds the key or not, an upsert writes it.
        if (rng() % 3 == 0) {
          const Code c = idx->remove(encode_u64(f));
          if (c != Code::ok && c != Code::not_found) fail("filler remove failed");
        } else if (idx->upsert(encode_u64(f), value(t, 0, false)) != Code::ok) {
          fail("filler upsert failed");
        }
      }
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  set_delays(*nb, nullptr);
  ASSERT_FALSE(failed.load());
  Status s = idx->verify();
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::string got;
  for (std::uint64_t h = 0; h < kHot; ++h) {
    ASSERT_EQ(idx->find(encode_u64(hot_key(h)), &got), Code::ok);
    EXPECT_TRUE(got == last[0][h] || got == last[1][h] ||
                (last[0][h].empty() && last[1][h].empty()))
        << "hot key " << hot_key(h) << " ends with a value that a later update replaced";
  }
  std::printf("%s hot keys: %zu leaves, %llu merges\n", std::string(pm::to_string(mode)).c_str(),
              nb->leaf_count(), static_cast<unsigned long long>(nb->merges_linked()));
}

TEST(NBTreeStress, HotKeysDuringSmosAdr) { run_hot(pm::Mode::adr); }
TEST(NBTreeStress, HotKeysDuringSmosEadr) { run_hot(pm::Mode::eadr); }

TEST(NBTreeStress, TwoThreadsAdr) { run(pm::Mode::adr); }
TEST(NBTreeStress, TwoThreadsEadr) { run(pm::Mode::eadr); }
TEST(NBTreeStress, TwoThreadsBytesKeysAdr) { run(pm::Mode::adr, KeyType::bytes); }
TEST(NBTreeStress, TwoThreadsBytesKeysEadr) { run(pm::Mode::eadr, KeyType::bytes); }

// The shared-key counting test (tests/index/common/shared_key_test.h) with the random delays
// at every hook: both threads insert and remove the same 64 keys while SMOs stall at their
// phase boundaries and writers before their CAS (W2's race, issue 18, shows far more often).
void run_shared(pm::Mode mode) {
  index_test::SharedKeyConfig cfg;
  cfg.options.kind = "nbtree";
  cfg.options.node_size = 128;
  cfg.options.persistence = mode;
  cfg.options.pool_size = 64 << 20;
  RandomDelays delays;
  cfg.before_run = [&delays](Index& idx) {
    set_delays(dynamic_cast<nbtree::NBTree&>(idx), &delays);
  };
  cfg.after_run = [](Index& idx) { set_delays(dynamic_cast<nbtree::NBTree&>(idx), nullptr); };
  std::uint64_t ops = 0;
  const auto failures = index_test::run_shared_key_test(cfg, &ops);
  std::string all;
  for (const auto& f : failures) all += "\n  " + f;
  EXPECT_TRUE(failures.empty()) << all;
  EXPECT_GT(ops, 1000u);
}

TEST(NBTreeStress, SharedKeysWithDelaysAdr) { run_shared(pm::Mode::adr); }
TEST(NBTreeStress, SharedKeysWithDelaysEadr) { run_shared(pm::Mode::eadr); }
TEST(NBTreeStress, SharedKeysWithDelaysDram) { run_shared(pm::Mode::dram); }

}  // namespace
}  // namespace pmindex

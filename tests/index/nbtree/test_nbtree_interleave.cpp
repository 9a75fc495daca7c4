// NBTree deterministic interleavings (paper Fig. 3 and Table 3). A Pauser hook stops one
// worker thread at a chosen SMO phase boundary or before a CAS; the test thread then runs
// other operations, releases the worker, and checks every result against the one
// linearization the schedule allows (an std::map that replays it).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "index/nbtree/nbtree.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

using nbtree::HookPoint;
// Hooks exist only in the tracing flavour (issue 16); this binary must link it.
static_assert(nbtree::NBTree::kHooks, "test_nbtree_interleave needs the tracing flavour");

thread_local bool tl_target = false;

class Pauser final : public nbtree::Hooks {
 public:
  void arm(HookPoint p) {
    std::lock_guard<std::mutex> lock(mu_);
    point_ = p;
    armed_ = true;
  }
  void at(HookPoint p, const nbtree::Leaf* leaf) override {
    if (!tl_target) return;
    std::unique_lock<std::mutex> lock(mu_);
    if (!armed_ || p != point_) return;
    armed_ = false;
    last_leaf_ = leaf;
    ++arrivals_;
    const std::uint64_t gen = releases_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return releases_ > gen; });
  }
  // Waits until the worker has paused `n` times in total.
  bool wait_arrivals(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return arrivals_ >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    ++releases_;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  HookPoint point_ = HookPoint::smo_done;
  bool armed_ = false;
  int arrivals_ = 0;
  std::uint64_t releases_ = 0;
  const nbtree::Leaf* last_leaf_ = nullptr;
};

std::string K(std::uint64_t k) { return encode_u64(k); }
std::string V(std::uint64_t v) { return encode_u64(v); }

class Interleave : public ::testing::TestWithParam<pm::Mode> {
 protected:
  void SetUp() override {
    Options o;
    o.kind = "nbtree";
    o.pool_size = 16 << 20;
    o.node_size = 128;  // capacity 7
    o.persistence = GetParam();
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    idx_ = std::move(r).value();
    nb_ = dynamic_cast<nbtree::NBTree*>(idx_.get());
    ASSERT_EQ(nb_->leaf_capacity(), 7);
    // One full leaf: keys 10..70. The next insert starts an SMO that splits it in two.
    for (std::uint64_t k = 10; k <= 70; k += 10) put(k, k);
    nb_->set_hooks(&pauser_);
  }
  void TearDown() override {
    if (worker_.joinable()) worker_.join();
    if (nb_ != nullptr) {
      nb_->set_hooks(nullptr);
      Status s = idx_->verify();
      EXPECT_TRUE(s.ok()) << s.to_string();
      check_oracle();
    }
  }
  void put(std::uint64_t k, std::uint64_t v) {
    ASSERT_EQ(idx_->insert(K(k), V(v)), Code::ok);
    oracle_[k] = v;
  }
  // The worker runs `fn` with the pause hooks active for it only.
  template <class F>
  void start_worker(F fn) {
    worker_ = std::thread([fn] {
      tl_target = true;
      fn();
      tl_target = false;
    });
  }
  std::optional<std::uint64_t> get(std::uint64_t k) {
    std::string v;
    const Code c = idx_->find(K(k), &v);
    if (c == Code::not_found) return std::nullopt;
    EXPECT_EQ(c, Code::ok);
    return decode_u64(v);
  }
  void check_oracle() {
    for (std::uint64_t k = 1; k <= 120; ++k) {
      auto it = oracle_.find(k);
      const auto got = get(k);
      if (it == oracle_.end()) {
        EXPECT_FALSE(got.has_value()) << "key " << k << " should be absent";
      } else {
        EXPECT_EQ(got, std::optional<std::uint64_t>(it->second)) << "key " << k;
      }
    }
    ScanBuffer buf;
    EXPECT_EQ(idx_->scan(K(0), 1000, buf), oracle_.size());
  }

  std::unique_ptr<Index> idx_;
  nbtree::NBTree* nb_ = nullptr;
  Pauser pauser_;
  std::thread worker_;
  std::map<std::uint64_t, std::uint64_t> oracle_;
};

// Fig. 3 update(2,s): an update lands in the old leaf while the copy phase runs; the sync
// phase must carry it over (otherwise: lost update).
TEST_P(Interleave, UpdateDuringCopyPhase) {
  pauser_.arm(HookPoint::smo_before_copy_ptr_cas);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  ASSERT_EQ(idx_->update(K(20), V(2000)), Code::ok);
  EXPECT_EQ(get(20), 2000u);  // copy phase: the old leaf is latest and clean
  pauser_.release();
  worker_.join();
  oracle_[80] = 80;
  oracle_[20] = 2000;
  EXPECT_EQ(nb_->leaf_count(), 2u);
}

// Fig. 3 update(8,y) / delete(3): after the copy phase, updates and deletes sync themselves
// into the new leaf (sync-on-write).
TEST_P(Interleave, UpdateAndDeleteAfterCopyPhase) {
  nbtree::Leaf* old_leaf = nb_->leaf_for_testing(30);
  pauser_.arm(HookPoint::smo_after_copy_ptr);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  ASSERT_EQ(idx_->update(K(30), V(3000)), Code::ok);
  ASSERT_EQ(idx_->remove(K(40)), Code::ok);
  // White box: both reached the new leaves already (no help from the paused SMO).
  const nbtree::SmoDesc* d = old_leaf->copy_ptr.load();
  ASSERT_NE(d, nullptr);
  std::uint64_t w = 0;
  bool found30 = false, found40 = false;
  for (int i = 0; i < d->count; ++i) {
    if (nb_->peek_for_testing(d->leaves[i], 30, &w)) {
      found30 = true;
      EXPECT_EQ(nbtree::payload_of(w), 3000u);
    }
    found40 |= nb_->peek_for_testing(d->leaves[i], 40, &w);
  }
  EXPECT_TRUE(found30);
  EXPECT_FALSE(found40);
  EXPECT_EQ(get(30), 3000u);
  EXPECT_FALSE(get(40).has_value());
  pauser_.release();
  worker_.join();
  oracle_[80] = 80;
  oracle_[30] = 3000;
  oracle_.erase(40);
}

// Table 3, sync phase: an update made during the copy phase is not yet in the new leaf while
// the sync phase is stopped before its CAS; a search must sync it itself (sync-on-read)
// rather than read the stale new leaf.
TEST_P(Interleave, SearchDuringSyncPhase) {
  nbtree::Leaf* old_leaf = nb_->leaf_for_testing(20);
  pauser_.arm(HookPoint::smo_before_copy_ptr_cas);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  ASSERT_EQ(idx_->update(K(20), V(2222)), Code::ok);  // missed by the copy
  pauser_.arm(HookPoint::sync_before_cas);
  pauser_.release();
  ASSERT_TRUE(pauser_.wait_arrivals(2));  // the SMO is about to sync key 20
  const nbtree::SmoDesc* d = old_leaf->copy_ptr.load();
  ASSERT_NE(d, nullptr);
  std::uint64_t w = 0;
  ASSERT_TRUE(nb_->peek_for_testing(d->leaves[0], 20, &w));
  EXPECT_EQ(nbtree::payload_of(w), 20u) << "the new leaf is stale before the sync";
  EXPECT_EQ(get(20), 2222u);  // sync-on-read
  ASSERT_TRUE(nb_->peek_for_testing(d->leaves[0], 20, &w));
  EXPECT_EQ(nbtree::payload_of(w), 2222u) << "sync-on-read wrote the new leaf";
  pauser_.release();
  worker_.join();
  oracle_[80] = 80;
  oracle_[20] = 2222;
}

// Lost-update race inside the sync phase: the SMO read the old value, then an update and its
// sync-on-write run; the SMO's CAS must fail and leave the newer value.
TEST_P(Interleave, UpdateRacesSyncPhaseCas) {
  pauser_.arm(HookPoint::smo_before_copy_ptr_cas);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  ASSERT_EQ(idx_->update(K(50), V(5000)), Code::ok);
  pauser_.arm(HookPoint::sync_before_cas);
  pauser_.release();
  ASSERT_TRUE(pauser_.wait_arrivals(2));  // SMO about to CAS 50 -> 5000 in the new leaf
  ASSERT_EQ(idx_->update(K(50), V(5001)), Code::ok);
  EXPECT_EQ(get(50), 5001u);
  pauser_.release();
  worker_.join();
  oracle_[80] = 80;
  oracle_[50] = 5001;
}

// Table 3 / Fig. 3 delete(3) during the sync phase: the SMO is stopped before syncing an
// update of key 20; a delete of 20 (and of 60) must win over the late sync.
TEST_P(Interleave, DeleteDuringSyncPhase) {
  pauser_.arm(HookPoint::smo_before_copy_ptr_cas);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  ASSERT_EQ(idx_->update(K(20), V(2020)), Code::ok);
  pauser_.arm(HookPoint::sync_before_cas);
  pauser_.release();
  ASSERT_TRUE(pauser_.wait_arrivals(2));
  ASSERT_EQ(idx_->remove(K(20)), Code::ok);
  ASSERT_EQ(idx_->remove(K(60)), Code::ok);
  EXPECT_FALSE(get(20).has_value());
  EXPECT_FALSE(get(60).has_value());
  EXPECT_EQ(idx_->remove(K(20)), Code::not_found);
  pauser_.release();
  worker_.join();
  oracle_[80] = 80;
  oracle_.erase(20);
  oracle_.erase(60);
}

// Cooperative SMO: the first inserter stalls before publishing its copy; a second inserter
// into the same full leaf finishes the whole SMO itself and inserts; the first one's copy
// loses the copy_ptr CAS, is freed, and its insert retries on the new leaves.
TEST_P(Interleave, TwoInsertersCooperateOnOneSmo) {
  pauser_.arm(HookPoint::smo_before_copy_ptr_cas);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  const auto before = idx_->footprint().pm_bytes;  // includes the stalled copy's two blocks
  ASSERT_EQ(idx_->insert(K(90), V(90)), Code::ok);  // helps: copy, sync, link, then inserts
  EXPECT_EQ(get(90), 90u);
  EXPECT_FALSE(get(80).has_value());  // the stalled insert has not taken effect
  pauser_.release();
  worker_.join();
  oracle_[80] = 80;
  oracle_[90] = 90;
  nb_->collect_garbage();
  // The loser's blocks and the old leaf are freed: two 128 B blocks replaced one.
  EXPECT_EQ(idx_->footprint().pm_bytes, before - 128);
}

// An insert that claimed a slot and wrote its key is stopped before its commit CAS; other
// inserts fill the leaf and complete an SMO. The stalled commit CAS then fails on the smo
// bit: the insert withdraws its PM copy, helps, and retries on the new leaf.
TEST_P(Interleave, CommitCasFailsOnSmoBit) {
  nb_->set_hooks(nullptr);
  put(80, 80);  // split: {10,20,30} and {40,50,60,70,80}
  nbtree::Leaf* right = nb_->leaf_for_testing(85);
  ASSERT_EQ(right->num.load(), 5u);
  pauser_.arm(HookPoint::insert_before_commit_cas);
  nb_->set_hooks(&pauser_);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(85), V(85)), Code::ok); });  // slot 5
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  put(86, 86);  // slot 6
  put(87, 87);  // no slot left: SMO (85 is not committed, so it is not copied), then insert
  EXPECT_FALSE(get(85).has_value());
  EXPECT_NE(nb_->leaf_for_testing(85), right);
  pauser_.release();
  worker_.join();
  oracle_[85] = 85;
}

// An SMO stalled in the middle of its link phase (lists switched, parent not yet updated):
// reads, updates and deletes of its keys, and inserts into other leaves, proceed; an insert
// into the stalled leaf helps the link phase finish (S9..S14 are lock-free).
TEST_P(Interleave, SmoStalledMidLink) {
  for (std::uint64_t k = 100; k <= 106; ++k) put(k, k);  // more keys to the right
  // After the splits, find the leaf holding 10 and fill it.
  pauser_.arm(HookPoint::smo_link_after_list);
  nbtree::Leaf* target = nb_->leaf_for_testing(10);
  std::uint64_t k = 11;
  while (true) {  // fill the leaf of key 10 until one insert is left before the SMO
    const std::uint32_t used = target->num.load();
    if (used >= 7) break;
    put(k, k);
    ++k;
  }
  const std::uint64_t trigger = k++;
  start_worker([this, trigger] { EXPECT_EQ(idx_->insert(K(trigger), V(trigger)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  EXPECT_EQ(get(10), 10u);
  ASSERT_EQ(idx_->update(K(10), V(1010)), Code::ok);
  EXPECT_EQ(get(10), 1010u);
  ASSERT_EQ(idx_->remove(K(11)), Code::ok);
  EXPECT_FALSE(get(11).has_value());
  const nbtree::Leaf* far = nb_->leaf_for_testing(105000);
  ASSERT_LT(far->num.load(), 7u) << "the test needs a leaf with room";
  ASSERT_EQ(idx_->insert(K(105000), V(1)), Code::ok);  // a leaf that does not split
  std::thread third([this, k] { EXPECT_EQ(idx_->insert(K(k), V(k)), Code::ok); });
  pauser_.release();
  worker_.join();
  third.join();
  oracle_[trigger] = trigger;
  oracle_[k] = k;
  oracle_[10] = 1010;
  oracle_.erase(11);
  oracle_[105000] = 1;
  EXPECT_EQ(get(105000), 1u);
}

// Counts the SMO's drain waits (S8b, any thread) and passes every point on to the Pauser.
class DrainWatch final : public nbtree::Hooks {
 public:
  explicit DrainWatch(Pauser& p) : pauser_(p) {}
  void at(HookPoint p, const nbtree::Leaf* leaf) override {
    if (p == HookPoint::smo_drain_wait) waits.fetch_add(1);
    pauser_.at(p, leaf);
  }
  std::atomic<int> waits{0};

 private:
  Pauser& pauser_;
};

// Waits up to 20 s until `done` or at least `n` drain waits.
bool wait_until(const std::atomic<bool>& done, const DrainWatch& w, int n) {
  for (int i = 0; i < 20000; ++i) {
    if (done.load() || w.waits.load() >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// A slow update found the old leaf and stalls before its CAS (registered, W2). The SMO of
// that leaf seals it and, before its new leaves become reachable, waits for the update
// (S8b); readers are not blocked meanwhile. Released, the update lands in the old leaf and
// its sync-on-write carries it over; a second SMO of the new leaf keeps it.
TEST_P(Interleave, SlowUpdaterIsSyncedBeforeTheNewLeavesAreReachable) {
  DrainWatch watch(pauser_);
  nb_->set_hooks(&watch);
  pauser_.arm(HookPoint::update_before_cas);
  start_worker([this] { EXPECT_EQ(idx_->update(K(20), V(2000)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  std::atomic<bool> smo_done{false};
  std::thread smo([&] {
    EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok);  // the SMO: {10,20,30} {40..80}
    smo_done.store(true);
  });
  ASSERT_TRUE(wait_until(smo_done, watch, 1));
  EXPECT_FALSE(smo_done.load()) << "the SMO went on while an update of its old leaf was in flight";
  EXPECT_EQ(get(20), 20u);  // readers proceed; the update has not taken effect yet
  pauser_.release();
  worker_.join();
  smo.join();
  oracle_[80] = 80;
  oracle_[20] = 2000;
  EXPECT_EQ(get(20), 2000u);
  nb_->set_hooks(nullptr);
  nbtree::Leaf* left = nb_->leaf_for_testing(20);
  for (std::uint64_t k = 11; left->num.load() < 7; ++k) put(k, k);
  put(15, 15);  // the left leaf splits again
  ASSERT_NE(nb_->leaf_for_testing(20), left);
  EXPECT_EQ(get(20), 2000u);
}

// Issue 18: a delete that found key 20 in the old leaf stalls before its CAS. Meanwhile the
// leaf's SMO runs, and a second thread removes 20 and inserts it again. Before the fix the
// SMO completed, the second thread did both in the new leaf (remove ok, insert ok), and the
// stalled delete then cleared the dead old slot, found the new copy already deleted and also
// answered ok: two removes and one insert after one initial insert, yet 20 is present. Now
// the SMO seals the old leaf and waits for the delete (S8a/S8b, W2); the second thread's
// remove, finding the seal, helps and retries on the new leaf. Whatever the outcome, it must
// be linearizable: 1 (initial) - removes_ok + inserts_ok == presence at the end.
TEST_P(Interleave, StalledDeleteOfOldLeafRacesRemoveAndReinsert) {
  DrainWatch watch(pauser_);
  nb_->set_hooks(&watch);
  pauser_.arm(HookPoint::delete_before_cas);
  std::atomic<Code> a_remove{Code::unsupported};
  start_worker([&] { a_remove.store(idx_->remove(K(20))); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  std::atomic<bool> smo_done{false};
  std::thread smo([&] {
    EXPECT_EQ(idx_->insert(K(80), V(80)), Code::ok);  // starts the SMO of the leaf
    smo_done.store(true);
  });
  ASSERT_TRUE(wait_until(smo_done, watch, 1));  // done (old code) or sealed and draining
  std::atomic<bool> b_done{false};
  std::atomic<Code> b_remove{Code::unsupported}, b_insert{Code::unsupported};
  std::thread b([&] {
    b_remove.store(idx_->remove(K(20)));
    b_insert.store(idx_->insert(K(20), V(2)));
    b_done.store(true);
  });
  ASSERT_TRUE(wait_until(b_done, watch, 2));  // done (old code) or waiting in the drain too
  pauser_.release();
  worker_.join();
  smo.join();
  b.join();
  nb_->set_hooks(nullptr);
  const int removes = (a_remove.load() == Code::ok) + (b_remove.load() == Code::ok);
  const int inserts = b_insert.load() == Code::ok;
  const bool present = get(20).has_value();
  EXPECT_EQ(1 - removes + inserts, present ? 1 : 0)
      << "not linearizable: stalled remove " << to_string(a_remove.load()) << ", remove "
      << to_string(b_remove.load()) << ", insert " << to_string(b_insert.load())
      << ", key present at the end: " << present;
  EXPECT_EQ(a_remove.load(), Code::ok);  // it found 20 first; the others wait for it
  EXPECT_EQ(b_remove.load(), Code::not_found);
  EXPECT_EQ(b_insert.load(), Code::ok);
  oracle_[80] = 80;
  if (present) oracle_[20] = 2;
  else oracle_.erase(20);
}

// The link phase takes no lock: with the SMO of the left leaf stalled after its DRAM switch
// and before its PM link (S11), an insert into that leaf finishes the link itself, and the
// right neighbour's SMO (whose predecessor is the stalled leaf, next frozen) helps it and
// then links into its replacement. The stalled thread's late PM CAS must fail harmlessly.
TEST_P(Interleave, StalledLinkIsFinishedByHelpers) {
  put(80, 80);  // split: L = {10,20,30}, R = {40,...,80}
  nbtree::Leaf* left = nb_->leaf_for_testing(10);
  nbtree::Leaf* right = nb_->leaf_for_testing(40);
  ASSERT_NE(left, right);
  for (std::uint64_t k = 11; left->num.load() < 7; ++k) put(k, k);
  pauser_.arm(HookPoint::smo_link_before_pm);
  start_worker([this] { EXPECT_EQ(idx_->insert(K(5), V(5)), Code::ok); });
  ASSERT_TRUE(pauser_.wait_arrivals(1));
  // The worker stalls inside L's link phase. An insert into L's range helps and completes.
  put(6, 6);
  EXPECT_NE(nb_->leaf_for_testing(10), left);
  // Fill R and make it split: its link finds L (or L's replacement) as predecessor.
  for (std::uint64_t k = 81; right->num.load() < 7; ++k) put(k, k);
  put(95, 95);
  EXPECT_NE(nb_->leaf_for_testing(40), right);
  EXPECT_EQ(get(6), 6u);
  EXPECT_EQ(get(95), 95u);
  pauser_.release();
  worker_.join();
  oracle_[5] = 5;
  ASSERT_TRUE(idx_->verify().ok()) << idx_->verify().to_string();
}

INSTANTIATE_TEST_SUITE_P(Modes, Interleave, ::testing::Values(pm::Mode::adr, pm::Mode::eadr));

// Regression (stress failures "scan order" / "update result"): S13 used to replace the old
// leaf's child pointer by the left new leaf in one inner-node write and insert the split key
// with the right leaf in a second one. A reader descending between the two reached the left
// leaf for a key >= split: an insert put the key in a leaf whose range excludes it (later
// updates and finds, which descend to the right leaf, missed it) and a scan set its cursor
// back to the left leaf's high + 1, below its start key. The hook runs after every inner-node
// write (structure mutex held, on the SMO's thread) and checks what any concurrent reader
// would see at that instant: every key descends to a leaf whose range covers it.
class CoverCheck final : public nbtree::Hooks {
 public:
  explicit CoverCheck(nbtree::NBTree* nb) : nb_(nb) {}
  void at(HookPoint p, const nbtree::Leaf*) override {
    if (p != HookPoint::inner_node_written) return;
    ++writes;
    for (std::uint64_t k = 1; k <= kMax + 10; ++k) {
      const nbtree::Leaf* l = nb_->leaf_for_testing(k);
      if (k < l->low || k > l->high) {
        ++uncovered;
        if (first.empty()) {
          first = "key " + std::to_string(k) + " reached leaf [" + std::to_string(l->low) +
                  ", " + std::to_string(l->high) + "]";
        }
      }
    }
  }
  static constexpr std::uint64_t kMax = 200;
  int writes = 0;
  int uncovered = 0;
  std::string first;

 private:
  nbtree::NBTree* nb_;
};

TEST(NBTreeInnerInstall, EveryInnerWriteLeavesEveryKeyCovered) {
  for (const pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    Options o;
    o.kind = "nbtree";
    o.pool_size = 16 << 20;
    o.node_size = 128;  // leaf capacity 7, inner fanout 8: leaf and inner splits both happen
    o.persistence = mode;
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::unique_ptr<Index> idx = std::move(r).value();
    auto* nb = dynamic_cast<nbtree::NBTree*>(idx.get());
    CoverCheck check(nb);
    nb->set_hooks(&check);
    // Ascending and descending halves: splits at both ends of leaves and inner nodes.
    for (std::uint64_t k = 2; k <= CoverCheck::kMax; k += 2) {
      ASSERT_EQ(idx->insert(K(k), V(k)), Code::ok);
    }
    for (std::uint64_t k = CoverCheck::kMax - 1; k >= 1 && k < CoverCheck::kMax; k -= 2) {
      ASSERT_EQ(idx->insert(K(k), V(k)), Code::ok);
    }
    EXPECT_GT(check.writes, 20);  // leaf splits and inner splits happened
    EXPECT_EQ(check.uncovered, 0) << check.first;
    // Merges (M6 removes a child, M0b merges a level-1 node into its left sibling): every key
    // stays covered after each of their writes too. All but every 25th key removed.
    const int before = check.writes;
    std::size_t kept = 0;
    for (std::uint64_t k = 1; k <= CoverCheck::kMax; ++k) {
      if (k % 25 == 0) {
        ++kept;
        continue;
      }
      ASSERT_EQ(idx->remove(K(k)), Code::ok);
    }
    nb->set_hooks(nullptr);
    EXPECT_GT(nb->merges_linked(), 10u);
    EXPECT_GT(check.writes, before + 10);
    EXPECT_EQ(check.uncovered, 0) << check.first;
    Status s = idx->verify();
    EXPECT_TRUE(s.ok()) << s.to_string();
    ScanBuffer buf;
    EXPECT_EQ(idx->scan(K(1), 1000, buf), kept);
  }
}

// --- merges (PROTOCOL.md M0..M7) --------------------------------------------------------------

// Twelve bulk-loaded leaves of three keys (1000 j + 100, 200, 300), six per level-1 node (fanout
// 8). P = leaf 2, E = leaf 3: children 2 and 3 of the first level-1 node. Merges are off while
// the test prepares the leaves and on for the worker's delete.
class MergeInterleave : public ::testing::TestWithParam<pm::Mode> {
 protected:
  void SetUp() override {
    Options o;
    o.kind = "nbtree";
    o.pool_size = 16 << 20;
    o.node_size = 128;  // leaf capacity 7, inner fanout 8
    o.persistence = GetParam();
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    idx_ = std::move(r).value();
    nb_ = dynamic_cast<nbtree::NBTree*>(idx_.get());
    std::vector<std::string> keys;
    std::vector<KeyValue> kv;
    for (std::uint64_t j = 0; j < 12; ++j) {
      for (std::uint64_t i = 1; i <= 3; ++i) oracle_[1000 * j + 100 * i] = 1000 * j + 100 * i;
    }
    for (const auto& entry : oracle_) keys.push_back(K(entry.first));
    for (const std::string& k : keys) kv.push_back({k, k});
    ASSERT_TRUE(idx_->bulk_load(kv, 0.45).ok());
    ASSERT_EQ(nb_->leaf_count(), 12u);
    nb_->set_merges_for_testing(false);
    nb_->set_hooks(&pauser_);
  }
  void TearDown() override {
    if (worker_.joinable()) worker_.join();
    nb_->set_hooks(nullptr);
    Status s = idx_->verify();
    EXPECT_TRUE(s.ok()) << s.to_string();
    for (std::uint64_t k = 10; k <= 13000; k += 10) {
      std::string v;
      const auto it = oracle_.find(k);
      const Code c = idx_->find(K(k), &v);
      if (it == oracle_.end()) {
        EXPECT_EQ(c, Code::not_found) << "key " << k;
      } else {
        ASSERT_EQ(c, Code::ok) << "key " << k;
        EXPECT_EQ(decode_u64(v), it->second) << "key " << k;
      }
    }
    ScanBuffer buf;
    EXPECT_EQ(idx_->scan(K(0), 1000, buf), oracle_.size());
  }
  void put(std::uint64_t k, std::uint64_t v) {
    ASSERT_EQ(idx_->insert(K(k), V(v)), Code::ok);
    oracle_[k] = v;
  }
  void del(std::uint64_t k) {
    ASSERT_EQ(idx_->remove(K(k)), Code::ok);
    oracle_.erase(k);
  }
  // The worker removes `k` with merges on: its delete starts the merge (M0) and pauses at `at`.
  void start_merge_at(HookPoint at, std::uint64_t k) {
    nb_->set_merges_for_testing(true);
    pauser_.arm(at);
    oracle_.erase(k);
    worker_ = std::thread([this, k] {
      tl_target = true;
      EXPECT_EQ(idx_->remove(K(k)), Code::ok);
      tl_target = false;
    });
    ASSERT_TRUE(pauser_.wait_arrivals(1));
  }
  // Splits leaves 0, 4 and 5 (five inserts each): the first level-1 node then holds nine
  // children and splits after its fourth, which is P, unless a published merge keeps P and E
  // together (M6).
  void split_first_inner_node() {
    for (std::uint64_t base : {0u, 4000u, 5000u}) {
      for (std::uint64_t i = 1; i <= 5; ++i) put(base + 110 + 10 * i, i);
    }
  }

  std::unique_ptr<Index> idx_;
  nbtree::NBTree* nb_ = nullptr;
  Pauser pauser_;
  std::thread worker_;
  std::map<std::uint64_t, std::uint64_t> oracle_;
};

// M6's open point, settled: an inner split between M1 and M3 that puts P and E under two
// level-1 nodes makes the merge give up at M3 (checked under inner_mu_), leaving both leaves
// as they were (E empty, still in the tree).
TEST_P(MergeInterleave, InnerSplitBeforePublishMakesTheMergeGiveUp) {
  del(3100);
  del(3200);
  start_merge_at(HookPoint::smo_before_copy_ptr_cas, 3300);
  split_first_inner_node();
  pauser_.release();
  worker_.join();
  EXPECT_EQ(nb_->merges_linked(), 0u);
  EXPECT_EQ(nb_->leaf_count(), 15u);  // 12 + 3 splits; E stays
  put(3150, 7);                        // E takes inserts again (its smo bit was undone)
}

// After M3 an inner split keeps a published merge's P and E in one node (merge_pair), so M6
// removes E with one node write.
TEST_P(MergeInterleave, InnerSplitAfterPublishKeepsThePair) {
  del(3100);
  del(3200);
  start_merge_at(HookPoint::smo_after_copy_ptr, 3300);
  split_first_inner_node();
  pauser_.release();
  worker_.join();
  EXPECT_EQ(nb_->merges_linked(), 1u);
  EXPECT_EQ(nb_->leaf_count(), 14u);  // 12 + 3 splits - 1 merge
}

// An insert into E after M1 meets E's smo bit, runs the whole merge itself (C1) and retries
// into the new leaf; the paused merger loses M3 and finds the merge done.
TEST_P(MergeInterleave, InsertIntoFrozenRightLeafRetriesIntoMergedLeaf) {
  del(3100);
  del(3200);
  start_merge_at(HookPoint::smo_before_copy_ptr_cas, 3300);
  put(3150, 31);
  EXPECT_EQ(nb_->merges_linked(), 1u);
  EXPECT_EQ(nb_->leaf_count(), 11u);
  pauser_.release();
  worker_.join();
  EXPECT_EQ(nb_->merges_linked(), 1u);
}

// Sparse merge (E keeps two records, a third of 7): an update of P and a delete in E while the
// merge is published but not yet synced reach the new leaf by sync-on-write (W1).
TEST_P(MergeInterleave, UpdateOfLeftAndDeleteInRightDuringSync) {
  nbtree::Leaf* p = nb_->leaf_for_testing(2200);
  start_merge_at(HookPoint::smo_after_copy_ptr, 3100);  // E: 3200, 3300 stay; P: 3
  ASSERT_EQ(idx_->update(K(2200), V(22)), Code::ok);
  oracle_[2200] = 22;
  del(3300);
  const nbtree::SmoDesc* d = p->copy_ptr.load();
  ASSERT_NE(d, nullptr);
  ASSERT_NE(d->merge, nullptr);
  std::uint64_t w = 0;
  ASSERT_TRUE(nb_->peek_for_testing(d->leaves[0], 2200, &w));
  EXPECT_EQ(nbtree::payload_of(w), 22u);
  EXPECT_FALSE(nb_->peek_for_testing(d->leaves[0], 3300, &w));
  pauser_.release();
  worker_.join();
  EXPECT_EQ(nb_->merges_linked(), 1u);
  EXPECT_EQ(nb_->leaf_count(), 11u);
}

// succ's link racing M5: the merge stopped after freezing E's next and switching P's
// predecessor in DRAM, before M5p; a split of succ (leaf 4) finds its predecessor E frozen,
// finishes the merge's link itself (M5p, M6, M7), then links into N. The stalled merger's
// late M5p CAS fails harmlessly.
TEST_P(MergeInterleave, SuccessorSplitFinishesAStalledMergeLink) {
  del(3100);
  del(3200);
  start_merge_at(HookPoint::smo_link_before_pm, 3300);
  for (std::uint64_t i = 1; i <= 5; ++i) put(4110 + 10 * i, i);  // splits leaf 4
  EXPECT_EQ(nb_->merges_linked(), 1u);
  pauser_.release();
  worker_.join();
  EXPECT_EQ(nb_->merges_linked(), 1u);
  EXPECT_EQ(nb_->leaf_count(), 12u);  // 12 - 1 merge + 1 split
}

// succ's split links first (it switches E's next to its first new leaf before the merge
// freezes E's next): N's next takes the new leaf.
TEST_P(MergeInterleave, SuccessorSplitBeforeMergeLink) {
  del(3100);
  del(3200);
  start_merge_at(HookPoint::smo_after_sync, 3300);
  for (std::uint64_t i = 1; i <= 5; ++i) put(4110 + 10 * i, i);  // splits leaf 4
  pauser_.release();
  worker_.join();
  EXPECT_EQ(nb_->merges_linked(), 1u);
  EXPECT_EQ(nb_->leaf_count(), 12u);
}

INSTANTIATE_TEST_SUITE_P(Modes, MergeInterleave, ::testing::Values(pm::Mode::adr, pm::Mode::eadr),
                         [](const auto& p) { return std::string(pm::to_string(p.param)); });

}  // namespace
}  // namespace pmindex

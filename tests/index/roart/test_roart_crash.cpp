// roart under the crash simulator (adr and eadr). Key spaces chosen for what they exercise:
// 24 keys fit one array (it grows 8 -> 16 -> 32 slots and shrinks back); 400 keys split full
// 64-slot arrays again and again (A4-A8: intent, separator into the trie, the array's name
// moved), with grows and shrinks of the halves; 4,000 keys are sparse (splits at several trie
// depths; the oracle looks up the whole key space after every image, so it stays small). Recovery after every image meets the state each step leaves, splits interrupted
// after their commit (A5) included, which the first touch finishes (R6). Sized by
// PMINDEX_CRASH_IMAGES (about 1,000 per run in CI; the `long` variant runs 10,000); a failure
// prints a replay token: PMINDEX_CRASH_REPLAY='roart.adr/<seed>/<op>/<point>/<choice>'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "index/roart/roart.h"
#include "pmindex/crash/index_driver.h"
#include "pmindex/pm/pool.h"

namespace pmindex::crash {
namespace {

IndexCrashConfig roart_config(std::uint64_t key_space) {
  IndexCrashConfig cfg;
  cfg.options.kind = "roart";
  cfg.options.key_type = KeyType::u64;
  cfg.pool_size = 1024 * 1024;
  cfg.key_space = key_space;
  return cfg;
}

crash_kit::SmoTally::Levels roart_levels(const Index& idx) {
  const auto& r = static_cast<const roart::Roart&>(idx);
  return {{"splits", r.splits()},
          {"grows", r.grows()},
          {"shrinks", r.shrinks()},
          {"merges", r.merges()}};
}

// share: the fraction of PMINDEX_CRASH_IMAGES this suite checks; 0: every candidate image.
// The cut checks at the end hold whatever the seed only where every image is checked or the
// budget is the full one (a split cut, A5-A8, is a small share of the images: at half the
// budget the eadr merge suite met none for seed 3559217115), so a suite below the full budget
// reports its cuts without requiring them.
// pinned_seed: the workload (and the sample) of this seed instead of PMINDEX_CRASH_SEED's, for a
// sampled suite whose named SMO only some workloads reach (a replay token carries its seed).
void run(pm::Mode mode, std::uint64_t key_space, const std::string& name,
         std::vector<std::string> smos, double share = 1.0, bool drain = false,
         std::optional<std::uint64_t> pinned_seed = {}) {
  IndexCrashConfig cfg = roart_config(key_space);
  const std::string label = name + "." + std::string(pm::to_string(mode));
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  if (!opt.replay && pinned_seed) opt.seed = *pinned_seed;
  if (!opt.replay && share == 0) opt.images_budget = 0;
  if (!opt.replay && share > 0 && share < 1.0)
    opt.images_budget = std::max<std::size_t>(100, static_cast<std::size_t>(opt.images_budget * share));
  const bool require_cuts = !opt.replay && (share == 0 || share >= 1.0);
  const std::size_t ops = default_crash_ops(opt.images_budget) * (mode == pm::Mode::eadr ? 3 : 2) / 2;
  cfg.ops = std::max<std::size_t>(key_space > 100 ? 400 : 120, ops);
  if (drain) cfg.drain_from = cfg.ops / 2;
  crash_kit::SmoTally tally(&roart_levels);
  cfg.observe = tally.observer();
  const std::uint64_t finished = roart::Roart::finished_splits_total();
  const std::uint64_t merged = roart::Roart::finished_merges_total();
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  const bool splits = std::find(smos.begin(), smos.end(), "splits+") != smos.end();
  crash_kit::expect_explored(r, opt, {.smos = std::move(smos)}, &tally);
  const std::uint64_t cut = roart::Roart::finished_splits_total() - finished;
  std::cout << label << ": " << cut << " recovered images finished a split cut after A5 (R6)\n";
  // The suites that split must also have recovered images cut inside a split (A5-A8).
  if (splits && require_cuts) {
    EXPECT_GT(cut, 0u) << "no image crashed inside a split";
  }
  // The draining suites must also have recovered images cut inside a merge (M2-M5) that the
  // recovery walk finished (R7).
  const std::uint64_t mcut = roart::Roart::finished_merges_total() - merged;
  std::cout << label << ": " << mcut << " recovered images finished a merge cut after M2 (R7)\n";
  if (drain && require_cuts) {
    EXPECT_GT(mcut, 0u) << "no image crashed inside a merge";
  }
}

TEST(CrashRoart, AdrOneArray) { run(pm::Mode::adr, 24, "roart_small", {"grows+"}, 0.5); }
TEST(CrashRoart, AdrSplits) { run(pm::Mode::adr, 400, "roart", {"splits+", "grows+"}); }
TEST(CrashRoart, EadrSplits) { run(pm::Mode::eadr, 400, "roart", {"splits+", "grows+"}); }
TEST(CrashRoart, AdrSparse) { run(pm::Mode::adr, 4000, "roart_sparse", {"splits+"}, 0.5); }
// Fill then drain: the first half of the workload inserts (splits), the second removes, so
// underfull arrays merge (M0-M5) and recovered images meet merges cut after their commit (M2).
// eadr checks every image (about 2,600-4,200, a few seconds), so it proves both cuts for any
// seed; adr (about 50,000 candidates) samples half the budget of one pinned workload: whether
// a 400-op drain merges depends on its key order (CI's seed 1578805207 split and shrank arrays
// but merged none), and the pinned one merges.
TEST(CrashRoart, AdrMerges) {
  run(pm::Mode::adr, 200, "roart_merge", {"splits+", "merges+"}, 0.5, true, 20261122);
}
TEST(CrashRoart, EadrMerges) {
  run(pm::Mode::eadr, 200, "roart_merge", {"splits+", "merges+"}, 0, true);
}

// The known-bad variant: merges without their intent (no M1 intent block, no M2) leave, cut
// between M3 and M4, an image where the left array's separator is gone and nothing moves its
// records to the merged array: the crash suite must report lost records.
TEST(CrashRoart, MergeWithoutIntentIsCaught) {
  IndexCrashConfig cfg = roart_config(200);
  cfg.ops = 400;
  cfg.drain_from = 200;
  crash_kit::SmoTally tally(&roart_levels);
  cfg.observe = tally.observer();
  ExploreOptions opt;
  opt.label = "roart.merge_without_intent";
  opt.mode = pm::Mode::eadr;
  opt.images_budget = 0;  // every image (about 2,600; it stops at the first failures)
  opt.max_failures = 1;
  roart::Roart::set_merge_without_intent_for_testing(true);
  const ExploreReport r = run_index_crash(cfg, opt);
  roart::Roart::set_merge_without_intent_for_testing(false);
  EXPECT_GT(tally.count("merges+"), 0u) << "the workload never merged";
  ASSERT_FALSE(r.ok()) << "a merge without its intent went unnoticed";
  std::cout << "known-bad merge caught: " << r.failures.front().message << "\n";
}

// R6 on a full pool. A split is cut right after its commit (A5) and the image is reopened with
// the pool then filled to the last block, so the first touch cannot insert the separator (A6).
// The split must be undone as the live path undoes it (R6u): the array stays live and unsplit,
// every key in it is found, removes work, an insert answers pool_full, and once space is freed
// inserts succeed and the split completes. (Before R6u the array read as damaged for good.)

// Copies the pool at the first fence that finds the watched intent word set: the state right
// after A5's persist, with every store so far written back (an image the adr model allows).
class SnapshotAtIntent final : public pm::TraceSink {
 public:
  SnapshotAtIntent(const pm::Pool& pool, std::uint64_t intent_word, char* out)
      : pool_(pool), word_(intent_word), out_(out) {}
  void on_store(const void*, std::size_t) override {}
  void on_flush(const void*, std::size_t) override {}
  void on_fence() override {
    if (taken || art::load_word(*pool_.at<const std::uint64_t>(word_)) == 0) return;
    taken = true;
    std::memcpy(out_, pool_.base(), pool_.size());
  }
  void on_yield_point(std::string_view) override {}
  bool taken = false;

 private:
  const pm::Pool& pool_;
  const std::uint64_t word_;
  char* const out_;  // pool_.size() bytes
};

struct AlignedImage {
  explicit AlignedImage(std::size_t n)
      : bytes(n), data(static_cast<char*>(std::aligned_alloc(4096, n))) {}
  AlignedImage(const AlignedImage&) = delete;
  AlignedImage& operator=(const AlignedImage&) = delete;
  ~AlignedImage() { std::free(data); }
  template <class T>
  T* at(std::uint64_t off) const { return reinterpret_cast<T*>(data + off); }
  std::size_t bytes;
  char* data;
};

constexpr std::uint64_t kR6Full = 64;  // keys 0, 10, ..., 630 fill the tail; key 640 splits it

Options r6_options() {
  Options o;
  o.kind = "roart";
  o.key_type = KeyType::u64;
  o.pool_size = 256 * 1024;
  return o;
}

// The image of the split of a full 64-slot tail, cut right after A5; returns the tail's offset.
std::uint64_t split_image_after_a5(const Options& o, AlignedImage* image) {
  auto r = Index::open(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return 0;
  std::unique_ptr<Index> idx = std::move(r).value();
  for (std::uint64_t k = 0; k < kR6Full; ++k)
    EXPECT_EQ(idx->insert(encode_u64(k * 10), encode_u64(k)), Code::ok);
  const pm::Pool& pool = idx->pool();
  EXPECT_EQ(pool.size(), image->bytes);
  const std::uint64_t tail = pool.at<const roart::Root>(pool.root())->tail;
  EXPECT_EQ(pool.at<const roart::ArrayHeader>(tail)->meta & 0xff, 64u);
  SnapshotAtIntent sink(pool, tail + offsetof(roart::ArrayHeader, intent), image->data);
  pm::Runtime::set_trace_sink(&sink);
  const Code c = idx->insert(encode_u64(kR6Full * 10), encode_u64(kR6Full));  // A4-A8
  pm::Runtime::set_trace_sink(nullptr);
  EXPECT_EQ(c, Code::ok);
  EXPECT_TRUE(sink.taken) << "the split never committed its intent (A5)";
  return sink.taken ? tail : 0;
}  // dropped without close: only the image matters

std::unique_ptr<Index> recover_image(const Options& o, AlignedImage& image, pm::Pool** pool) {
  auto p = pm::Pool::open_image(image.data, image.bytes, pm::Mode::adr,
                                roart::Roart::layout_for(o), "r6 image");
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  if (!p.ok()) return nullptr;
  if (pool != nullptr) *pool = p.value().get();  // owned by the index
  auto rec = roart::Roart::recover(std::move(p).value(), o);
  EXPECT_TRUE(rec.ok()) << rec.status().to_string();
  if (!rec.ok()) return nullptr;
  EXPECT_TRUE(static_cast<roart::Roart&>(*rec.value()).wait_recovery_walk().ok());
  return std::move(rec).value();
}

// Every class, largest first, until nothing is left: a real pool_full for any request.
std::vector<std::pair<std::uint64_t, std::size_t>> fill_pool(pm::Allocator& al) {
  std::vector<std::pair<std::uint64_t, std::size_t>> held;
  for (int cls = pm::Allocator::num_classes() - 1; cls >= 0; --cls) {
    const std::size_t bytes = pm::Allocator::class_size(cls);
    Code code = Code::ok;
    for (std::uint64_t off; (off = al.allocate(bytes, &code)) != 0;) held.emplace_back(off, bytes);
    EXPECT_EQ(code, Code::pool_full);
  }
  return held;
}

TEST(CrashRoart, FirstTouchOnAFullPoolUndoesTheSplit) {
  ASSERT_TRUE(pm::kTracing) << "needs the tracing flavour (a trace sink takes the image)";
  const Options o = r6_options();
  AlignedImage image(o.pool_size);
  ASSERT_NE(split_image_after_a5(o, &image), 0u);
  AlignedImage after_undo(o.pool_size);
  {
    pm::Pool* pool = nullptr;
    std::unique_ptr<Index> idx = recover_image(o, image, &pool);
    ASSERT_NE(idx, nullptr);
    auto& ro = static_cast<roart::Roart&>(*idx);
    auto held = fill_pool(pool->allocator());
    const std::uint64_t finished = roart::Roart::finished_splits_total();
    const std::uint64_t undone = roart::Roart::undone_splits_total();
    for (std::uint64_t k = 0; k < kR6Full; ++k) {  // the first find touches the array: R6
      std::string v;
      ASSERT_EQ(idx->find(encode_u64(k * 10), &v), Code::ok) << "key " << k * 10;
      EXPECT_EQ(decode_u64(v), k);
    }
    EXPECT_EQ(roart::Roart::undone_splits_total(), undone + 1);
    EXPECT_EQ(roart::Roart::finished_splits_total(), finished);
    std::memcpy(after_undo.data, image.data, image.bytes);  // a crash image after U1 (below)
    // The insert that split never returned: undone with its split, it is not there.
    EXPECT_EQ(idx->find(encode_u64(kR6Full * 10), nullptr), Code::not_found);
    EXPECT_EQ(idx->size(), kR6Full);
    EXPECT_EQ(idx->insert(encode_u64(7), encode_u64(7)), Code::pool_full);
    EXPECT_EQ(idx->find(encode_u64(7), nullptr), Code::not_found);
    ASSERT_EQ(idx->remove(encode_u64(30)), Code::ok);
    EXPECT_EQ(idx->find(encode_u64(30), nullptr), Code::not_found);
    ASSERT_EQ(idx->insert(encode_u64(30), encode_u64(3)), Code::ok);  // into the freed slot
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    for (const auto& [off, bytes] : held) pool->allocator().deallocate(off, bytes);  // space
    ASSERT_EQ(idx->insert(encode_u64(kR6Full * 10), encode_u64(kR6Full)), Code::ok);
    EXPECT_EQ(ro.splits(), 1u);
    for (std::uint64_t k = 0; k <= kR6Full; ++k)
      EXPECT_EQ(idx->find(encode_u64(k * 10), nullptr), Code::ok) << "key " << k * 10;
    EXPECT_EQ(idx->size(), kR6Full + 1);
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    ASSERT_TRUE(idx->close().ok());
  }
  // A crash after U1: no intent is left; the walk leaves the split's blocks (and the test's
  // filler) unmarked, so they are free, and the array splits normally.
  std::unique_ptr<Index> idx = recover_image(o, after_undo, nullptr);
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(idx->size(), kR6Full);
  for (std::uint64_t k = 0; k < kR6Full; ++k)
    EXPECT_EQ(idx->find(encode_u64(k * 10), nullptr), Code::ok) << "key " << k * 10;
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  ASSERT_EQ(idx->insert(encode_u64(kR6Full * 10), encode_u64(kR6Full)), Code::ok);
  EXPECT_EQ(static_cast<roart::Roart&>(*idx).splits(), 1u);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
}

// R6u's check fed a known-bad case: the array names a record neither split array holds (one
// of the left array's slots cleared in the image). That is damage, not a full pool: the array
// stays damaged and its keys answer corrupted.
TEST(CrashRoart, FirstTouchOnAFullPoolKeepsRealDamage) {
  const Options o = r6_options();
  AlignedImage image(o.pool_size);
  const std::uint64_t tail = split_image_after_a5(o, &image);
  ASSERT_NE(tail, 0u);
  const std::uint64_t ioff = image.at<roart::ArrayHeader>(tail)->intent;
  ASSERT_NE(ioff, 0u);
  auto* left = image.at<roart::ArrayHeader>(image.at<roart::Intent>(ioff)->left);
  reinterpret_cast<std::uint64_t*>(left + 1)[0] = 0;  // its first slot word
  pm::Pool* pool = nullptr;
  std::unique_ptr<Index> idx = recover_image(o, image, &pool);
  ASSERT_NE(idx, nullptr);
  const std::uint64_t undone = roart::Roart::undone_splits_total();
  auto held = fill_pool(pool->allocator());
  EXPECT_EQ(idx->find(encode_u64(10), nullptr), Code::corrupted);
  EXPECT_EQ(roart::Roart::undone_splits_total(), undone);
  EXPECT_FALSE(idx->verify().ok());
  for (const auto& [off, bytes] : held) pool->allocator().deallocate(off, bytes);
}

// Keeps the pool as it was at the last fence before the watched tail word changed, once the
// watched intent word is set: a split of the tail cut after A6 (separator in the trie), before
// A7 (tail moved to the right array).
class SnapshotBeforeA7 final : public pm::TraceSink {
 public:
  SnapshotBeforeA7(const pm::Pool& pool, std::uint64_t tail_word, std::uint64_t intent_word,
                   char* out)
      : pool_(pool), tail_word_(tail_word), intent_word_(intent_word), out_(out),
        tail_(art::load_word(*pool.at<const std::uint64_t>(tail_word))) {}
  void on_store(const void*, std::size_t) override {}
  void on_flush(const void*, std::size_t) override {}
  void on_fence() override {
    if (art::load_word(*pool_.at<const std::uint64_t>(tail_word_)) != tail_) return;
    if (art::load_word(*pool_.at<const std::uint64_t>(intent_word_)) == 0) return;
    std::memcpy(out_, pool_.base(), pool_.size());
    ++taken;
  }
  void on_yield_point(std::string_view) override {}
  int taken = 0;

 private:
  const pm::Pool& pool_;
  const std::uint64_t tail_word_, intent_word_;
  char* const out_;
  const std::uint64_t tail_;
};

// A split of the tail cut between A6 and A7; the next run empties the left half before the
// tail is touched. A3e must let R6 finish the split first (it needs the separator in the
// trie): before that guard, A3e removed the separator, and R6 then named the freed left
// array again (operations on its range restarted forever; the next walk would mark it).
TEST(CrashRoart, EmptiedLeftHalfBeforeR6) {
  const Options o = r6_options();
  AlignedImage image(o.pool_size);
  {
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok());
    std::unique_ptr<Index> idx = std::move(r).value();
    for (std::uint64_t k = 0; k < kR6Full; ++k)
      ASSERT_EQ(idx->insert(encode_u64(k * 10), encode_u64(k)), Code::ok);
    const pm::Pool& pool = idx->pool();
    const std::uint64_t root = pool.root();
    const std::uint64_t tail = pool.at<const roart::Root>(root)->tail;
    SnapshotBeforeA7 sink(pool, root + offsetof(roart::Root, tail),
                          tail + offsetof(roart::ArrayHeader, intent), image.data);
    pm::Runtime::set_trace_sink(&sink);
    ASSERT_EQ(idx->insert(encode_u64(kR6Full * 10), encode_u64(kR6Full)), Code::ok);
    pm::Runtime::set_trace_sink(nullptr);
    ASSERT_GT(sink.taken, 1);
  }
  std::unique_ptr<Index> idx = recover_image(o, image, nullptr);
  ASSERT_NE(idx, nullptr);
  auto& ro = static_cast<roart::Roart&>(*idx);
  ASSERT_EQ(ro.array_count_for_testing(), 2u);  // left (named by 310) and the old tail
  const std::uint64_t finished = roart::Roart::finished_splits_total();
  for (std::uint64_t k = 0; k < 32; ++k)  // the left half: 0 ... 310
    ASSERT_EQ(idx->remove(encode_u64(k * 10)), Code::ok) << "key " << k * 10;
  // The last remove emptied the left array; A3e touched the old tail first (R6 finished).
  ASSERT_EQ(roart::Roart::finished_splits_total(), finished + 1);
  ASSERT_EQ(ro.array_count_for_testing(), 1u);  // only the right array, now the tail
  for (std::uint64_t k = 32; k <= kR6Full; ++k)
    EXPECT_EQ(idx->find(encode_u64(k * 10), nullptr), Code::ok) << "key " << k * 10;
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  EXPECT_EQ(idx->insert(encode_u64(5), encode_u64(5)), Code::ok);
  EXPECT_EQ(idx->size(), kR6Full - 32 + 2);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  ASSERT_TRUE(idx->close().ok());
  idx = recover_image(o, image, nullptr);  // the walk after a clean close: counts agree
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(idx->find(encode_u64(5), nullptr), Code::ok);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
}

// A merge cut right after its commit (M2). Keys 0, 10, ..., 640 split the tail into a left
// array (0..310) and the tail (320..640); 17 removes leave the tail at 16 records, then 16
// removes leave the left array at 16: it merges with the tail (M0, rightward). The image is
// taken at the first fence after the tail's intent word is set.
std::uint64_t merge_image_after_m2(const Options& o, AlignedImage* image) {
  auto r = Index::open(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return 0;
  std::unique_ptr<Index> idx = std::move(r).value();
  for (std::uint64_t k = 0; k <= kR6Full; ++k)
    EXPECT_EQ(idx->insert(encode_u64(k * 10), encode_u64(k)), Code::ok);
  for (std::uint64_t k = 48; k <= kR6Full; ++k) EXPECT_EQ(idx->remove(encode_u64(k * 10)), Code::ok);
  const pm::Pool& pool = idx->pool();
  const std::uint64_t tail = pool.at<const roart::Root>(pool.root())->tail;
  SnapshotAtIntent sink(pool, tail + offsetof(roart::ArrayHeader, intent), image->data);
  pm::Runtime::set_trace_sink(&sink);
  for (std::uint64_t k = 0; k < 16; ++k) EXPECT_EQ(idx->remove(encode_u64(k * 10)), Code::ok);
  pm::Runtime::set_trace_sink(nullptr);
  EXPECT_EQ(static_cast<roart::Roart&>(*idx).merges(), 1u);
  EXPECT_TRUE(sink.taken) << "the merge never committed its intent (M2)";
  return sink.taken ? tail : 0;
}

TEST(CrashRoart, WalkFinishesAMergeCutAfterM2) {
  ASSERT_TRUE(pm::kTracing) << "needs the tracing flavour (a trace sink takes the image)";
  const Options o = r6_options();
  AlignedImage image(o.pool_size);
  ASSERT_NE(merge_image_after_m2(o, &image), 0u);
  const std::uint64_t finished = roart::Roart::finished_merges_total();
  std::unique_ptr<Index> idx = recover_image(o, image, nullptr);
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(roart::Roart::finished_merges_total(), finished + 1);
  auto& ro = static_cast<roart::Roart&>(*idx);
  EXPECT_EQ(ro.array_count_for_testing(), 1u);
  // Key 150 was removed by the remove whose merge was cut: its A2c came first.
  for (std::uint64_t k = 0; k <= kR6Full; ++k) {
    const bool kept = k >= 16 && k < 48;
    EXPECT_EQ(idx->find(encode_u64(k * 10), nullptr), kept ? Code::ok : Code::not_found) << k * 10;
  }
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  EXPECT_EQ(idx->insert(encode_u64(5), encode_u64(5)), Code::ok);
  ASSERT_TRUE(idx->close().ok());
  idx = recover_image(o, image, nullptr);  // the walk after a clean close: counts agree
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(idx->size(), 33u);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
}

// Known-bad images for the walk's merge checks (R5): the intent's left array forged to the
// merged array (the trie names another array at the separator), and the intent's kind word
// forged to an unknown kind. Each must be refused as damage, not finished.
TEST(CrashRoart, WalkRefusesAForgedMergeIntent) {
  ASSERT_TRUE(pm::kTracing) << "needs the tracing flavour (a trace sink takes the image)";
  const Options o = r6_options();
  AlignedImage image(o.pool_size);
  const std::uint64_t tail = merge_image_after_m2(o, &image);
  ASSERT_NE(tail, 0u);
  const std::uint64_t ioff = image.at<roart::ArrayHeader>(tail)->intent;
  ASSERT_NE(ioff, 0u);
  for (int forge = 0; forge < 2; ++forge) {
    AlignedImage bad(o.pool_size);
    std::memcpy(bad.data, image.data, image.bytes);
    roart::Intent* in = bad.at<roart::Intent>(ioff);
    if (forge == 0) in->left = in->right;
    else in->reserved = 7;
    auto p = pm::Pool::open_image(bad.data, bad.bytes, pm::Mode::adr, roart::Roart::layout_for(o),
                                  "forged merge");
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    const std::uint64_t finished = roart::Roart::finished_merges_total();
    auto rec = roart::Roart::recover(std::move(p).value(), o);
    ASSERT_TRUE(rec.ok()) << rec.status().to_string();
    auto& ro = static_cast<roart::Roart&>(*rec.value());
    EXPECT_EQ(ro.wait_recovery_walk().code(), Code::corrupted) << "forge " << forge;
    EXPECT_EQ(roart::Roart::finished_merges_total(), finished) << "forge " << forge;
    EXPECT_NE(rec.value()->insert(encode_u64(7), encode_u64(7)), Code::ok) << "forge " << forge;
  }
}

// The driver's oracle must be able to fail on roart too: a forged "root never published"
// state makes recovery build an empty index, which loses acknowledged records.
TEST(CrashRoart, DriverCatchesLostRecords) {
  IndexCrashConfig cfg = roart_config(400);
  cfg.ops = 60;
  cfg.tamper_image = hybrid_test::forget_root;
  ExploreOptions opt;
  opt.label = "roart.tampered";
  opt.images_budget = 100;
  const ExploreReport r = run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace pmindex::crash

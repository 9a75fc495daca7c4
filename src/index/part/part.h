// part: a persistent adaptive radix tree (RECIPE's P-ART design point, SOSP'19), the shared
// trie core (src/index/common/art/) with its nodes and records in the pool. README.md:
// design and numbers; PROTOCOL.md: persistence steps P1-P11, bulk load B1-B2, recovery R1-R5.
//
// Thread safety: every operation may run concurrently (lock-free readers, writers lock the
// nodes they change; art_tree.h). Writers wait while the start-now recovery walk runs after
// a restart; readers answer at once.
// Invariants: those of art::Tree (art_tree.h (1)-(4)), plus
//   (5) the root object is published in the pool header and never moves; its `top` word is
//       the tree's root child word;
//   (6) every block reachable from the root (root object, nodes, records, out-of-line
//       values) is owned; everything else is free after the recovery walk.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "index/common/art/art_tree.h"
#include "index/common/root_stamp.h"
#include "index/common/value_codec.h"
#include "pmindex/index.h"
#include "index/part/layout.h"

namespace pmindex::part {

using PmTree = art::Tree<art::PmPlacement>;

class Part final : public Index {
 public:
  static pm::Layout layout_for(const Options& options);
  static Status validate(const Options& options);
  static std::size_t default_pool_size(const Options& options);
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);
  static IndexRegistry::Entry registry_entry();

  ~Part() override;
  std::string_view kind() const override { return "part"; }
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code find(std::string_view key, std::string* value) const override;
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override;
  Code remove(std::string_view key) override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Status bulk_load(std::span<const KeyValue> sorted, double fill) override;
  Status verify() const override;
  RecoveryStats recovery_stats() const override {
    std::lock_guard<std::mutex> lock(walk_mu_);  // the walker fills records and nodes
    return recovery_;
  }
  Footprint footprint() const override;
  Status close() override;
  const pm::Pool& pool() const override { return *pool_; }

  // verify() with the walk's node counts (tests: every node type and transition happened,
  // stale prefixes met after a crash).
  Status verify_with(art::TreeStats* stats) const;
  // Prefix splits (P5-P6) done since open: the crash suites' SmoTally reads it.
  std::uint64_t prefix_splits() const { return tree_->prefix_splits(); }
  // Seconds from the start of open to the first answered lookup (0 until one is answered).
  double first_answer_seconds() const { return first_answer_.load(std::memory_order_relaxed); }
  // Waits for the start-now recovery walk (tests, close).
  Status wait_recovery_walk() const;
  // Test only: bulk_load writes its nodes and records without persisting them (the known-bad
  // of B1, which the crash suite must catch in adr mode).
  void set_unpersisted_bulk_load_for_test() { tree_->set_unpersisted_build_for_test(); }

  // Record relocation (PROTOCOL.md P11; README.md "Full pool"). sparse_units: the 256 B units
  // that hold records and nothing else are taken emptiest first, as long as the free bytes
  // left in the other such units can take their records, and every record in them moves to
  // a block outside them (insert runs this on pool_full after removes, so the emptied units
  // merge back into extents for nodes). every_record: every record moves once, wherever the
  // allocator puts it (tests: the crash simulator's background thread). Returns how many
  // records moved. One caller at a time (another returns 0 at once); the tree walk that
  // finds the records runs beside readers and writers under an epoch pin, and each move
  // rechecks under the container's lock that the record is still there.
  enum class Relocate { sparse_units, every_record };
  std::size_t relocate_records(Relocate what);
  // Known-bad variant for tests: relocation publishes a copy before persisting it (P11b
  // before P11a). Call before any thread uses the index.
  void break_relocation_for_test() { relocation_copy_first_ = false; }

 private:
  explicit Part(std::unique_ptr<pm::Pool> pool);
  Status init_root(std::uint32_t max_key, std::uint32_t max_value);
  void make_tree(std::uint32_t tag);
  void start_walk(std::uint64_t root_off);
  Code check_key(std::string_view key) const;
  // find for any key and any state (find's general way; notes the first answer).
  [[gnu::noinline]] Code find_any(std::string_view key, std::string* value) const;
  void note_answer() const;
  Code writable() const;
  void retire_value(std::uint64_t word);
  static void release_value(void* ctx, std::uint64_t word);

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  pm::KeyMode key_mode_ = pm::KeyMode::u64;
  index_common::ValueCodec values_;
  std::unique_ptr<PmTree> tree_;
  RecoveryStats recovery_;
  std::chrono::steady_clock::time_point open_start_;
  mutable std::atomic<double> first_answer_{0};
  // find's flat way is open: 8-byte keys are well formed whatever their bytes (u64, or bytes
  // with max_key_size >= 8; not f64, whose NaN keys are refused), values are inline (an
  // out-of-line one is read under a Guard), and the first answer is noted.
  mutable std::atomic<bool> flat_find_{false};
  // Start-now recovery (R4-R5): the walker marks reachable blocks; writers wait for it.
  mutable std::mutex walk_mu_;
  mutable std::condition_variable walk_cv_;
  std::atomic<bool> walk_done_{true};
  std::atomic<bool> corrupted_{false};
  // P11: one relocation at a time; a remove since the last one that found nothing to move
  // (relaxed: a stale answer only runs or skips one attempt at pool_full).
  std::mutex relocate_mu_;
  std::atomic<bool> removed_since_relocation_{false};
  bool relocation_copy_first_ = true;
  Status walk_status_;  // guarded by walk_mu_
  std::thread walker_;
  bool closed_ = false;
};

}  // namespace pmindex::part

// reflist: the reference index. A persistent sorted singly linked list of records with a DRAM
// std::map over it. It is deliberately simple: it exercises the native API, the pool, the
// allocator's reachability recovery, pmpool and the crash simulator before the real indexes,
// and it shows a newcomer how an index is written here. Persistence steps: PROTOCOL.md.
//
// Thread safety: every operation takes one mutex (the reference index is not concurrent).
// Invariants (checked by verify()):
//   (1) the chain from root.head visits records in strictly increasing key order (memcmp, then
//       length), which also rules out cycles;
//   (2) every record lies inside the heap, 16 B aligned, with lengths within the root's limits;
//   (3) every link carries the tag of the record it names (record_tag of its content), and
//       the last one is the end mark (PROTOCOL.md W1t);
//   (4) the DRAM map holds exactly the chain's keys, each pointing at its record.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "index/common/root_stamp.h"
#include "pmindex/index.h"
#include "pmindex/pm/pptr.h"
#include "index/reflist/layout.h"

namespace pmindex::reflist {

class RefList final : public Index {
 public:
  // IndexRegistry entry points.
  static pm::Layout layout_for(const Options& options);
  static Status validate(const Options& options);  // before any file is touched
  static std::size_t default_pool_size(const Options& options);
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);

  ~RefList() override;
  std::string_view kind() const override { return "reflist"; }
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code find(std::string_view key, std::string* value) const override;
  Code remove(std::string_view key) override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Status verify() const override;
  RecoveryStats recovery_stats() const override { return recovery_; }
  Footprint footprint() const override;
  Status close() override;
  const pm::Pool& pool() const override { return *pool_; }

  // Known-bad switch for the damage tests: recovery and verify() read links as offsets only
  // (no tag check, a link of 0 reads as the end). Process-wide; set before opening. The
  // tracing flavour only (elsewhere the switch aborts and the check reads a constant).
  static void set_ignore_link_tags_for_testing(bool on) {
    if (on && !pm::kTracing) std::abort();
    ignore_link_tags_for_testing_.store(on, std::memory_order_relaxed);  // relaxed: set before opens
  }

 private:
  explicit RefList(std::unique_ptr<pm::Pool> pool);
  Status init_root(std::uint32_t max_key, std::uint32_t max_value);
  // Walks the chain from root.head (W1, W1t); `untagged_ok`: a REFLIST1 pool, whose links may
  // still be untagged (each tagged one is checked).
  Status rebuild(bool untagged_ok);
  // The record a link word names, checked (bounds, alignment, lengths, tag): its offset, 0 at
  // the end mark. `from` is the offset of the record holding the link, 0 for root.head.
  Status follow(std::uint64_t link, std::uint64_t from, bool untagged_ok,
                std::uint64_t* off) const;
  // R10, R11: tags every untagged link of a recovered REFLIST1 chain, then flips the magic.
  void upgrade_links();
  Code check_key(std::string_view key) const;
  Code check_value(std::string_view value) const;
  // Writes a new record (not yet reachable) and persists it; 0 with *code on failure.
  std::uint64_t write_record(std::string_view key, std::string_view value, std::uint64_t next,
                             Code* code);
  // The word that points at the first record with key >= `key`: root.head or a record's next.
  std::uint64_t* link_before(std::string_view key) const;
  std::size_t record_size(const Record* r) const;
  std::string_view key_of(const Record* r) const { return {r->bytes(), r->key_len}; }

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  pm::KeyMode key_mode_ = pm::KeyMode::u64;
  mutable std::mutex mu_;
  std::map<std::string, std::uint64_t, std::less<>> map_;  // key -> record offset
  RecoveryStats recovery_;
  bool closed_ = false;
  static std::atomic<bool> ignore_link_tags_for_testing_;
};

}  // namespace pmindex::reflist

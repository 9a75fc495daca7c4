// reflist: the reference index. A persistent sorted singly linked list of records with a DRAM
// std::map over it. It is deliberately simple: it exercises the native API, the pool, the
// allocator's reachability recovery, pmpool and the crash simulator before the real indexes,
// and it shows a newcomer how an index is written here. Persistence steps: PROTOCOL.md.
//
// Thread safety: every operation takes one mutex (the reference index is not concurrent).
// Invariants (checked by verify()):
//   (1) the chain from root.head visits records in strictly increasing key order (memcmp, then
//       length), which also rules out cycles;
//   (2) every record lies inside the heap, 64 B aligned, with lengths within the root's limits;
//   (3) the DRAM map holds exactly the chain's keys, each pointing at its record.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "index/common/root_stamp.h"
#include "pmindex/index.h"
#include "pmindex/pm/pptr.h"

namespace pmindex::reflist {

// Root object, one per pool (64 B, one line).
//   [ 0, 8) magic "REFLIST1"    [ 8,16) head: offset of the first record, 0 if empty
//   [16,20) max_key_size        [20,24) max_value_size
//   [24,64) reserved (0)
struct Record;
struct Root {
  std::uint64_t magic;
  pm::PPtr<Record> head;
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[24];
};
static_assert(sizeof(Root) == 64);
static_assert(offsetof(Root, head) == 8 && offsetof(Root, max_key_size) == 16);
static_assert(offsetof(Root, stamp) == 24, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x315453494c464552ull;  // "REFLIST1"

// Record: a 16 B header followed by the key and value bytes, in one block.
//   [ 0, 8) next: offset of the next record, 0 at the end
//   [ 8,12) key_len             [12,16) value_len
//   [16, 16+key_len) key        [16+key_len, ...) value
struct Record {
  pm::PPtr<Record> next;
  std::uint32_t key_len;
  std::uint32_t value_len;
  // key and value bytes follow
  char* bytes() { return reinterpret_cast<char*>(this + 1); }
  const char* bytes() const { return reinterpret_cast<const char*>(this + 1); }
};
static_assert(sizeof(Record) == 16);
static_assert(std::is_standard_layout_v<Record> && std::is_trivially_copyable_v<Record>);

inline constexpr std::uint32_t kMaxKeySize = 4096;
inline constexpr std::uint32_t kMaxValueSize = 4096;

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

 private:
  explicit RefList(std::unique_ptr<pm::Pool> pool);
  Status init_root(std::uint32_t max_key, std::uint32_t max_value);
  Status rebuild();
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
};

}  // namespace pmindex::reflist

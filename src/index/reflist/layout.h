// reflist's persistent layout: the root object and the record, byte offsets drawn and
// asserted (PROTOCOL.md cites them). The index itself: reflist.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/root_stamp.h"
#include "pmindex/pm/pptr.h"

namespace pmindex::reflist {

// Root object, one per pool (64 B, one line).
//   [ 0, 8) magic "REFLIST1"    [ 8,16) head: offset of the first record, 0 if empty
//   [16,20) max_key_size        [20,24) max_value_size
//   [24,40) layout stamp        [40,64) reserved (0)
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

}  // namespace pmindex::reflist

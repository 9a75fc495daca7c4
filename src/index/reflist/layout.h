// reflist's persistent layout: the root object and the record, byte offsets drawn and
// asserted (PROTOCOL.md cites them). The index itself: reflist.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "index/common/root_stamp.h"

namespace pmindex::reflist {

// Link words (PROTOCOL.md, "Tagged links"): root.head and every record's `next`.
//   bits  0-39  pool offset of the record it names (16 B aligned; pools are below 1 TiB:
//               validate() refuses larger ones, recovery refuses a larger pool)
//   bits 40-63  that record's tag, record_tag() of its content: 1..kEndTag-1
//   kListEnd    offset 0 with tag kEndTag: the last record's next, or root.head of an empty
//               list. A link word of 0 is never an end: it is damage (W1t).
// Records are immutable while linked (an update writes a new record out of place, R4-R7), so a
// tag derived from the content needs no field and also sees damage inside a linked record.
// A REFLIST1 pool (before tagged links) holds untagged links (bits 40-63 zero, 0 at the end);
// the open upgrades it in place (R10, R11) and accepts both forms until the magic says REFLIST2.
inline constexpr unsigned kTagShift = 40;
inline constexpr std::uint64_t kEndTag = 0xffffff;
inline constexpr std::uint64_t kListEnd = kEndTag << kTagShift;
inline constexpr std::uint64_t kMaxPoolBytes = std::uint64_t{1} << kTagShift;
constexpr std::uint64_t link_off(std::uint64_t link) { return link & (kMaxPoolBytes - 1); }
constexpr std::uint64_t link_tag(std::uint64_t link) { return link >> kTagShift; }
constexpr std::uint64_t make_link(std::uint64_t off, std::uint64_t tag) {
  return off | tag << kTagShift;
}
static_assert(link_off(make_link(0xff'ffff'fff0ull, 5)) == 0xff'ffff'fff0ull &&
              link_tag(make_link(0xff'ffff'fff0ull, 5)) == 5 && link_off(kListEnd) == 0);

// Root object, one per pool (64 B, one line).
//   [ 0, 8) magic "REFLIST2"    [ 8,16) head: link word to the first record (kListEnd if empty)
//   [16,20) max_key_size        [20,24) max_value_size
//   [24,40) layout stamp        [40,64) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t head;  // a link word (above)
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[24];
};
static_assert(sizeof(Root) == 64);
static_assert(offsetof(Root, head) == 8 && offsetof(Root, max_key_size) == 16);
static_assert(offsetof(Root, stamp) == 24, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x325453494c464552ull;          // "REFLIST2"
inline constexpr std::uint64_t kRootMagicUntagged = 0x315453494c464552ull;  // "REFLIST1"

// Record: a 16 B header followed by the key and value bytes, in one block.
//   [ 0, 8) next: link word to the next record (kListEnd at the end)
//   [ 8,12) key_len             [12,16) value_len
//   [16, 16+key_len) key        [16+key_len, ...) value
struct Record {
  std::uint64_t next;  // a link word (above)
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

// W1t: a record's tag, mixed from everything a linked record holds but its `next`: key_len,
// value_len and the key and value bytes (the caller has bounds-checked the lengths). Each
// 8-byte word goes through a step that is a bijection of the state for a fixed word and of the
// word for a fixed state, so any change confined to one word (a flipped byte) always changes
// the 64-bit state; murmur3's finaliser then spreads it over 1..kEndTag-1, so other damage, or
// a link redirected to another record, passes by chance about 1 in 2^24. Cost (callgrind, -O2):
// about 40 instructions for 16 B of key and value, then about 11 per further 8 bytes.
inline std::uint64_t record_tag(std::uint32_t key_len, std::uint32_t value_len,
                                const char* bytes) {
  constexpr std::uint64_t kMul = 0xff51afd7ed558ccdull;
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ ((std::uint64_t{key_len} << 32 | value_len) * kMul);
  const std::size_t n = std::size_t{key_len} + value_len;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 32;
  }
  if (i < n) {
    std::uint64_t w = 0;
    std::memcpy(&w, bytes + i, n - i);
    h = (h ^ w) * kMul;
    h ^= h >> 32;
  }
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return 1 + (h >> kTagShift) % (kEndTag - 1);
}
inline std::uint64_t record_tag(const Record* r) {
  return record_tag(r->key_len, r->value_len, r->bytes());
}

}  // namespace pmindex::reflist

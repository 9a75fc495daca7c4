// roart's persistent layout: the root object, the leaf array and the split/merge intent, byte
// offsets drawn and asserted (PROTOCOL.md cites them). The trie's nodes and records are the
// shared core's (src/index/common/art/art_node.h); the index: roart.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/root_stamp.h"

namespace pmindex::roart {

// Root object, 64 B (one line):
//   [ 0, 8) magic "ROARTRT1"   [ 8,16) top: the trie's root child word (0 = empty)
//   [16,24) lock: NodeLock word guarding `top` (volatile)
//   [24,28) max_key_size       [28,32) max_value_size
//   [32,48) layout stamp       [48,56) tail: pool offset of the last leaf array (never 0)
//   [56,64) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t top;
  std::uint64_t lock;
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  index_common::RootStamp stamp;
  std::uint64_t tail;
  std::uint64_t reserved;
};
static_assert(sizeof(Root) == 64 && offsetof(Root, top) == 8 && offsetof(Root, stamp) == 32 &&
              offsetof(Root, tail) == 48);
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x3154525452414f52ull;  // "ROARTRT1"

// Leaf array, 64 + 16 * slots bytes (size classes of 8, 16, 32, 64 slots: 192, 320, 576,
// 1088 B), 64 B aligned:
//   [ 0, 8) lock     art::NodeLock word (volatile: run-tagged, reset at first touch)
//   [ 8,16) meta     kArrayMagic << 32 | slots (immutable)
//   [16,24) intent   0, or the pool offset of this array's split intent (A5: its commit) or
//                    merge intent (M2: its commit; this array is the merge's right one)
//   [24,32) bitmap   bit i = slot i live (volatile: rebuilt from the slots at first touch)
//   [32,64) reserved (0)
//   [64, 64 + 8 * slots)           slot words: fingerprint << 48 | record offset (0 = empty);
//                                  the persistent truth, each published by one 8-byte store
//   [64 + 8 * slots, 64 + 16 * slots) prefix words: the first 8 key bytes of the slot's
//                                  record, big-endian (volatile: rebuilt at first touch)
struct ArrayHeader {
  std::uint64_t lock;
  std::uint64_t meta;
  std::uint64_t intent;
  std::uint64_t bitmap;
  std::uint64_t reserved[4];
};
static_assert(sizeof(ArrayHeader) == 64 && offsetof(ArrayHeader, intent) == 16 &&
              offsetof(ArrayHeader, bitmap) == 24);
inline constexpr std::uint64_t kArrayMagic = 0x52414c41;  // "ALAR"
inline constexpr unsigned kMinSlots = 8;
inline constexpr unsigned kMaxSlots = 64;
constexpr std::size_t array_bytes(unsigned slots) { return sizeof(ArrayHeader) + 16 * slots; }
constexpr bool valid_class(std::uint64_t s) { return s == 8 || s == 16 || s == 32 || s == 64; }
inline constexpr std::uint64_t kOffsetMask = (std::uint64_t{1} << 48) - 1;

// Split intent (redo record of one split, written before the split changes anything
// reachable), 24 B + separator key, 8 B aligned:
//   [0,4) separator length   [4,8) kind: 0   [8,16) left array   [16,24) right array
//   [24, 24 + length) the separator: the greatest key of the left array
// Merge intent (redo record of one merge, named by the merge's RIGHT array B, PROTOCOL.md
// M1-M5), the same 24 B + key:
//   [0,4) separator length   [4,8) kind: kMergeKind   [8,16) the left array A (it leaves)
//   [16,24) the merged array M (takes B's name)   [24, 24 + length) A's separator
struct Intent {
  std::uint32_t key_len;
  std::uint32_t reserved;
  std::uint64_t left;
  std::uint64_t right;
  const char* key() const { return reinterpret_cast<const char*>(this + 1); }
};
static_assert(sizeof(Intent) == 24);
inline constexpr std::uint32_t kMergeKind = 0x4752454d;  // "MERG"
// Merges (PROTOCOL.md M0): an array a remove leaves with at most kMergeBelow records merges
// with a neighbour when both together hold at most kMergeMax (into the smallest class that
// holds them). Hysteresis: a merged array holds at most 32 records, so >= 33 inserts come
// before it splits (at 65); a split's halves hold 32 and 33, so >= 33 removes come before
// they merge back, and >= 16 before either looks for a merge.
inline constexpr unsigned kMergeBelow = 16;
inline constexpr unsigned kMergeMax = 32;

}  // namespace pmindex::roart

// uTree layouts: the PM root object and list nodes (persistent), the DRAM array-layer leaf
// (volatile, rebuilt at recovery). Persistence steps: PROTOCOL.md (cited as `// Un:`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/root_stamp.h"
#include "pmindex/sync/optimistic_lock.h"

namespace pmindex::utree {

// --- link words (root.head, node.next) -------------------------------------------------------
//   bit 0      mark   the node holding this word is logically deleted (D1); never in root.head
//   bit 1      dirty  set by the CAS that links a new node (U2) until that word is persisted;
//                     whoever acts on a dirty word persists it first (W1)
//   bits 2-3   zero
//   bits 4-39  pool offset of the next node (16-byte aligned; below 64 GiB, so bits 36-39 are
//              zero: a larger offset fails the bounds check)
//   bits 40-63 the next node's tag, node_tag() of its key word (and key record offset):
//              1..kEndTag-1, checked by recovery and verify() against the node reached (R1t)
//   kListEnd   offset 0 with tag kEndTag: the last node's next (with its flags), or root.head of
//              an empty list. A link word of 0 is never an end: it is damage (R1t).
// A node's `next` is 0 only before U1 writes it, while nothing links the node.
inline constexpr std::uint64_t kMarkBit = 1;
inline constexpr std::uint64_t kDirtyBit = 2;
inline constexpr std::uint64_t kFlagMask = 0xF;
inline constexpr unsigned kTagShift = 40;
inline constexpr std::uint64_t kEndTag = 0xffffff;
inline constexpr std::uint64_t kListEnd = kEndTag << kTagShift;
inline constexpr std::uint64_t kTargetMask = ((std::uint64_t{1} << kTagShift) - 1) & ~kFlagMask;
constexpr std::uint64_t link_target(std::uint64_t w) { return w & kTargetMask; }
constexpr std::uint64_t link_tag(std::uint64_t w) { return w >> kTagShift; }
constexpr std::uint64_t make_link(std::uint64_t off, std::uint64_t tag) {
  return off | tag << kTagShift;
}
// The word without its flags: what a link names (offset and tag), or kListEnd.
constexpr std::uint64_t link_word(std::uint64_t w) { return w & ~kFlagMask; }
static_assert(link_target(0x1233) == 0x1230 && link_target(kListEnd | kMarkBit) == 0);
static_assert(link_target(make_link(0xff'ffff'fff0ull, 5)) == 0xff'ffff'fff0ull &&
              link_tag(make_link(0xff'ffff'fff0ull, 5) | kDirtyBit) == 5);

// R1t: a node's tag, mixed from the words that never change while the node is linked: its key
// word and (bytes keys; 0 for integer keys) its key record's offset. An update rewrites only
// `value`; a node's memory is reused only after it is unlinked and persisted so (U9). The mix
// (murmur3's 64-bit finaliser over the two words, a constant added so that an all-zero node
// gets no special tag) is spread over 1..kEndTag-1, so a link redirected to another node
// passes its check by chance about 1 in 2^24.
constexpr std::uint64_t node_tag(std::uint64_t key, std::uint64_t key_record) {
  std::uint64_t h = (key + 0x9e3779b97f4a7c15ull) ^ (key_record * 0xc2b2ae3d27d4eb4full);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return 1 + (h >> kTagShift) % (kEndTag - 1);
}
static_assert(node_tag(0, 0) != node_tag(1, 0) && node_tag(0, 0) >= 1 &&
              node_tag(~std::uint64_t{0}, 0) < kEndTag);

// Root object (64 B, one line), written once at creation (U0) except `head`.
//   [ 0, 8) magic "UTREE002"    [ 8,16) head: link word to the first list node (kListEnd: empty)
//   [16,20) node_size (DRAM leaf bytes)   [20,24) key_mode
//   [24,28) max_key_size        [28,32) max_value_size (8 = inline values)
//   [32,40) hints: offset of the skip-hint block (0 = none; hints only, R0/R4)
//   [40,64) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t head;
  std::uint32_t node_size;
  std::uint32_t key_mode;
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  std::uint64_t hints;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[8];
};
static_assert(sizeof(Root) == 64);
static_assert(offsetof(Root, head) == 8 && offsetof(Root, node_size) == 16 &&
              offsetof(Root, key_mode) == 20 && offsetof(Root, max_value_size) == 28 &&
              offsetof(Root, hints) == 32);
static_assert(offsetof(Root, stamp) == 40, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x3230304545525455ull;  // "UTREE002"
// Links without tags (before R1t): refused at open with a message, never read as a list.
inline constexpr std::uint64_t kRootMagicUntagged = 0x3130304545525455ull;  // "UTREE001"

// PM list node: one per record, allocated at its natural size (never rounded up by us):
//   u64 / f64 keys (24 B):            bytes keys (32 B):
//   [ 0, 8) next   link word          [ 0, 8) next        link word
//   [ 8,16) key    key word           [ 8,16) key         8-byte big-endian key prefix
//   [16,24) value  8 bytes or record  [16,24) value       8 bytes or record offset
//                                     [24,32) key_record  pool offset of the PM key record
// A 24 B node does not have the key_record field: code touches it in bytes mode only. The key
// word of integer modes is the key's big-endian bytes read as an integer (memcmp order); the
// prefix of a bytes key is its first 8 bytes, zero-padded, read the same way, so a prefix
// comparison decides the order unless the prefixes are equal. Every word is written with one
// 8-byte atomic store (pm::publish): optimistic readers and list walkers read them.
struct ListNode {
  std::uint64_t next;
  std::uint64_t key;
  std::uint64_t value;
  std::uint64_t key_record;
};
static_assert(sizeof(ListNode) == 32);
static_assert(offsetof(ListNode, next) == 0 && offsetof(ListNode, key) == 8 &&
              offsetof(ListNode, value) == 16 && offsetof(ListNode, key_record) == 24);
static_assert(std::is_standard_layout_v<ListNode> && std::is_trivially_copyable_v<ListNode>);
inline constexpr std::size_t kNodeBytesWord = 24;   // integer keys
inline constexpr std::size_t kNodeBytesBytes = 32;  // bytes keys
// Node offsets are stored in DRAM leaves as 32-bit indexes of 16-byte units, so a pool holds at
// most 64 GiB (validate refuses larger ones).
inline constexpr unsigned kNodeShift = 4;
inline constexpr std::uint64_t kNodeAlign = std::uint64_t{1} << kNodeShift;
inline constexpr std::uint64_t kMaxPoolBytes = std::uint64_t{1} << (32 + kNodeShift);
constexpr std::uint32_t node_index(std::uint64_t off) {
  return static_cast<std::uint32_t>(off >> kNodeShift);
}
constexpr std::uint64_t node_offset(std::uint32_t idx) {
  return std::uint64_t{idx} << kNodeShift;
}

// Skip-hint block (PM, written at the end of recovery and at close, R4): offsets of every
// stride-th live list node at that moment, so recovery can walk list segments in parallel.
// Nothing in it is trusted: a hint counts only if the walk of the previous segment, which
// starts at a validated node, reaches it through links (R1).
//   [ 0, 8) count n             [ 8,16) stride (informational)
//   [16, 16 + 8n) node offsets, in list order when written
struct HintBlock {
  std::uint64_t count;
  std::uint64_t stride;
  std::uint64_t node[1];  // count entries
};
static_assert(offsetof(HintBlock, node) == 16);
inline constexpr std::uint64_t kHintStride = 4096;
constexpr std::size_t hint_block_bytes(std::uint64_t n) { return 16 + 8 * n; }

// DRAM leaf of the array layer (node_size bytes from the DRAM arena, 64 B aligned):
//   [ 0, 8) OptimisticLock         [ 8,12) count       [12,16) capacity (constant)
//   [16,24) next: the right sibling (Leaf*, 0 at the end; written under this leaf's lock)
//   [24,32) prev: a leaf to the left (Leaf*, a hint; written by the left neighbour's holder)
//   [32, 32 + 8 cap)             keys[cap]:  key words / key prefixes, sorted
//   [.., + 4 cap)                nodes[cap]: node_index of each key's list node
// 12 bytes per entry: capacity = (node_size - 32) / 12 (40 for the default 512 B).
struct LeafHeader {
  sync::OptimisticLock lock;
  std::uint32_t count;
  std::uint32_t capacity;
  std::uint64_t next;
  std::uint64_t prev;
};
static_assert(sizeof(LeafHeader) == 32);
static_assert(offsetof(LeafHeader, count) == 8 && offsetof(LeafHeader, next) == 16 &&
              offsetof(LeafHeader, prev) == 24);
static_assert(std::is_standard_layout_v<LeafHeader>);

struct Leaf {
  LeafHeader h;
  std::uint64_t* keys() { return reinterpret_cast<std::uint64_t*>(this + 1); }
  const std::uint64_t* keys() const { return reinterpret_cast<const std::uint64_t*>(this + 1); }
  std::uint32_t* nodes() { return reinterpret_cast<std::uint32_t*>(keys() + h.capacity); }
  const std::uint32_t* nodes() const {
    return reinterpret_cast<const std::uint32_t*>(keys() + h.capacity);
  }
};
static_assert(sizeof(Leaf) == 32);

inline constexpr std::size_t kLeafHeaderBytes = sizeof(LeafHeader);
constexpr std::uint32_t leaf_capacity(std::uint32_t node_size) {
  return static_cast<std::uint32_t>((node_size - kLeafHeaderBytes) / 12);
}
static_assert(leaf_capacity(512) == 40 && leaf_capacity(64) == 2 && leaf_capacity(256) == 18);
inline constexpr std::uint32_t kDefaultNodeSize = 512;
inline constexpr std::uint32_t kMinNodeSize = 64;
inline constexpr std::uint32_t kMaxNodeSize = 65536;

}  // namespace pmindex::utree

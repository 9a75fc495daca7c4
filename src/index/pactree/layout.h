// PACTree's persistent layouts: the root object, the data node and the SMO log entry. Every
// word an optimistic reader may read is an aligned 8-byte word written by the node's lock
// holder with pm::publish (or before the node is reachable); PROTOCOL.md cites the steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/chain_tag.h"
#include "index/common/root_stamp.h"
#include "pmindex/pm/thread_slot.h"

namespace pmindex::pactree {

inline constexpr unsigned kMaxSlots = 64;      // one bitmap word
inline constexpr unsigned kMinSlots = 2;
inline constexpr std::uint32_t kHeaderBytes = 128;  // header line + fingerprint line
inline constexpr std::uint32_t kSlotBytes = 16;     // key word + value word
inline constexpr std::uint32_t kDefaultNodeSize = kHeaderBytes + kMaxSlots * kSlotBytes;  // 1152
// Nodes own at least one 256 B granule so their DRAM version slot (LeafVersions) is theirs.
inline constexpr std::uint32_t kMinNodeBlock = 256;
inline constexpr unsigned kLogRing = 4;  // SMO log entries per thread slot (PROTOCOL.md L1)

constexpr unsigned slots_of(std::uint32_t node_size) {
  return (node_size - kHeaderBytes) / kSlotBytes;
}
constexpr std::uint32_t block_of(std::uint32_t node_size) {
  return node_size < kMinNodeBlock ? kMinNodeBlock : node_size;
}

// Data node, `node_size` bytes (default 1152 = 18 lines), 256 B aligned:
//   line 0  [ 0, 8) bitmap: bit i = slot i holds a record (the commit word of inserts/removes)
//           [ 8,16) next: tagged link to the right neighbour (common/chain_tag.h): bits 0-47
//                   its pool offset, bits 48-63 its tag; kChainEnd for the last node (max =
//                   +inf). A next of 0 is damage (PROTOCOL.md "Tagged links", R2t)
//           [16,24) prev: pool offset of the left neighbour (a hint, repaired by recovery;
//                   not tagged: recovery never follows it)
//           [24,32) anchor: key word of the node's lowest possible key (unused in the head)
//           [32,40) flags: bit 0 head (anchor = -inf); no other bit is used
//           [40,48) tag: the node's own tag (1..kEndTag-1), written before anything names it
//           [48,64) reserved (0)
//   line 1  [64,128) fingerprints: one byte per slot (mix of the key), valid where the bit is
//   [128, node_size) slots: {key word, value word} x slots_of(node_size)
// The node's max key is its next node's anchor: anchors never change while a node lives, so
// a reader compares against it without the neighbour's lock.
struct NodeHeader {
  std::uint64_t bitmap;
  std::uint64_t next;
  std::uint64_t prev;
  std::uint64_t anchor;
  std::uint64_t flags;
  std::uint64_t tag;
  std::uint64_t reserved[2];
};
static_assert(sizeof(NodeHeader) == 64 && offsetof(NodeHeader, next) == 8 &&
              offsetof(NodeHeader, anchor) == 24 && offsetof(NodeHeader, flags) == 32 &&
              offsetof(NodeHeader, tag) == 40);

struct Slot {
  std::uint64_t key;
  std::uint64_t value;
};
static_assert(sizeof(Slot) == kSlotBytes);

struct DataNode {
  NodeHeader h;
  std::uint64_t fp_words[kMaxSlots / 8];  // fingerprints, 8 per word (byte i%8 of word i/8)
  Slot slots[kMaxSlots];                  // only slots_of(node_size) exist
};
static_assert(offsetof(DataNode, fp_words) == 64 && offsetof(DataNode, slots) == kHeaderBytes);
static_assert(std::is_standard_layout_v<DataNode> && std::is_trivially_copyable_v<DataNode>);

inline constexpr std::uint64_t kFlagHead = 1;

// Links carry the tag of the node they name (common/chain_tag.h).
using index_common::kChainEnd;
using index_common::kEndTag;
using index_common::link_off;
using index_common::link_tag;
using index_common::make_link;
using index_common::valid_tag;

// SMO log entry, 64 B (one line), kLogRing per thread slot in a block named by the root:
//   [ 0, 8) state: 0 = free | (lsn << 8) | stage   (written last, PROTOCOL.md L2)
//   [ 8,16) left: the node that splits (merge: the survivor), as a link word (its offset
//           and own tag)
//   [16,24) right: the new node (merge: the right neighbour that leaves the list), as the
//           link word S4 writes into left's next (merge: left's next as M1 finds it)
//   [24,32) anchor: the right node's anchor key word
//   [32,64) reserved
struct LogEntry {
  std::uint64_t state;
  std::uint64_t left;
  std::uint64_t right;
  std::uint64_t anchor;
  std::uint64_t reserved[4];
};
static_assert(sizeof(LogEntry) == 64 && offsetof(LogEntry, anchor) == 24);
static_assert(std::is_standard_layout_v<LogEntry> && std::is_trivially_copyable_v<LogEntry>);

// Log stages (low 8 bits of state).
inline constexpr std::uint64_t kStageSplitLogged = 1;  // data-layer split in progress
inline constexpr std::uint64_t kStageSplitDone = 2;    // data layer done; search layer pending
inline constexpr std::uint64_t kStageMergeLogged = 3;  // data-layer merge in progress
inline constexpr std::uint64_t kStageMergeDone = 4;    // data layer done; search layer pending
constexpr std::uint64_t stage_of(std::uint64_t state) { return state & 0xff; }
constexpr std::uint64_t lsn_of(std::uint64_t state) { return state >> 8; }

// Root object (4160 B):
//   [ 0, 8) magic "PACTREE2"   [ 8,16) head: the first data node (anchor -inf), never moves;
//                                      a plain offset (PROTOCOL.md "Tagged links": the head
//                                      flag tells the head from any other node)
//   [16,20) node_size          [20,24) max_key_size     [24,28) max_value_size
//   [28,32) log_ring           [32,48) stamp (the layout id at creation, checked at open)
//   [48,56) search_top: the PM search layer's root child word (art core; 0 = empty trie, and
//           always 0 with the DRAM search layer)
//   [56,60) search_layer: kSearchDram (0) or kSearchPm (1), fixed at creation (pools made
//           before the PM search layer existed hold 0 here: DRAM)
//   [60,64) reserved
// The PM trie's root lock word is volatile and kept in DRAM (PacTree::Search).
//   [64, 64 + 8 * kMaxThreadSlots) logs: per thread slot, the offset of its SMO log block
//                                        (kLogRing entries; 0 until the slot first splits)
struct Root {
  std::uint64_t magic;
  std::uint64_t head;
  std::uint32_t node_size;
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  std::uint32_t log_ring;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint64_t search_top;
  std::uint32_t search_layer;
  std::uint8_t reserved[4];
  std::uint64_t logs[pm::kMaxThreadSlots];
};
static_assert(offsetof(Root, node_size) == 16 && offsetof(Root, stamp) == 32 &&
              offsetof(Root, search_top) == 48 && offsetof(Root, search_layer) == 56 &&
              offsetof(Root, logs) == 64 &&
              sizeof(Root) == 64 + 8 * pm::kMaxThreadSlots);
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x3245455254434150ull;  // "PACTREE2"
// Before tagged links (untagged next words, 0 at the end): refused with a message.
inline constexpr std::uint64_t kRootMagicUntagged = 0x3145455254434150ull;  // "PACTREE1"
inline constexpr std::uint32_t kSearchDram = 0;
inline constexpr std::uint32_t kSearchPm = 1;

}  // namespace pmindex::pactree

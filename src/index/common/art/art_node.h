// The adaptive radix tree's node and record layouts, child words and node lock (the shared trie
// core: README.md in this folder; persistence steps: src/index/part/PROTOCOL.md).
//
// Child word (8 bytes, one failure-atomic store publishes it):
//   0                  empty slot
//   bits  0-55         target: a pool offset (PM placement) or an address (DRAM placement)
//                      bit 0 set: a record (records are 8 B aligned, so the bit is free)
//                      bit 0 clear: a node (64 B aligned)
//                      bit 1 reserved for a second terminal type (ROART's leaf array)
//   bits 56-63         the key byte the slot is for (0 in end slots and the root word)
// The byte inside the word is the persistent truth of which byte a slot holds: the per-node
// key bytes (N4/N16) and index (N48) are accelerators rebuilt at a node's first touch in a run
// (art_tree.h admit()), so inserting or removing a child is ONE persisted 8-byte store.
//
// Thread safety: nodes are read optimistically (NodeLock below, the OLC protocol of
// include/pmindex/sync/optimistic_lock.h); every field a reader reads is an 8-byte word read
// with an acquire load and written with a release store (pm::publish or std::atomic_ref), or
// is immutable once the node is published (type).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>

#include "pmindex/pm/persist.h"

namespace pmindex::art {

// Longest key the core stores (bytes). Depths and prefix lengths are 32-bit.
inline constexpr std::uint32_t kMaxKeyBytes = 4096;
// Prefix bytes stored in a node; longer prefixes are checked against a record's key.
inline constexpr std::uint32_t kStoredPrefix = 8;

// --- child words -------------------------------------------------------------------------------
inline constexpr std::uint64_t kRecordTag = 1;
inline constexpr std::uint64_t kTargetMask = (std::uint64_t{1} << 56) - 1;
inline constexpr std::uint64_t kNodeAlign = 64;
inline constexpr std::uint64_t kRecordAlign = 8;

constexpr bool is_record(std::uint64_t w) { return (w & kRecordTag) != 0; }
constexpr std::uint64_t target_of(std::uint64_t w) { return w & kTargetMask & ~std::uint64_t{7}; }
constexpr std::uint8_t byte_of(std::uint64_t w) { return static_cast<std::uint8_t>(w >> 56); }
constexpr std::uint64_t node_word(std::uint8_t byte, std::uint64_t ref) {
  return (std::uint64_t{byte} << 56) | ref;
}
constexpr std::uint64_t record_word(std::uint8_t byte, std::uint64_t ref) {
  return (std::uint64_t{byte} << 56) | ref | kRecordTag;
}
// The same target under another slot byte (a node moved to another slot, or into the root).
constexpr std::uint64_t rebyte(std::uint64_t w, std::uint8_t byte) {
  return (w & kTargetMask) | (std::uint64_t{byte} << 56);
}

// --- node lock -----------------------------------------------------------------------------------
// Lock word, 64 bits, in the node (so a lookup's node visit touches one line, not a side table):
//   bit 0      obsolete   (bits 0 and 1 both set: the node failed its first-touch check)
//   bit 1      locked
//   bits 2-31  version    +1 per write critical section (wraps at 2^30, see README)
//   bits 32-63 run tag    the run that last touched the word
// A word whose run tag is not this run's is a leftover of an earlier run (a crashed run's lock
// included): it means "unlocked, never touched in this run", and the first thread to see it
// checks the node and rebuilds its volatile metadata (admit). Written through the placement's
// cas / publish (traced in the crash simulator's flavour), never persisted.
struct NodeLock {
  static constexpr std::uint64_t kObsolete = 1;
  static constexpr std::uint64_t kLocked = 2;
  static constexpr std::uint64_t kDamaged = 3;
  static constexpr std::uint64_t kLowMask = 0xffffffffull;

  static constexpr std::uint64_t fresh(std::uint32_t tag) { return std::uint64_t{tag} << 32 | 4; }
  static constexpr std::uint32_t tag_of(std::uint64_t w) { return static_cast<std::uint32_t>(w >> 32); }
  static constexpr bool locked(std::uint64_t w) { return (w & kLocked) != 0; }
  static constexpr bool obsolete(std::uint64_t w) { return (w & kObsolete) != 0; }
  static constexpr bool damaged(std::uint64_t w) { return (w & kDamaged) == kDamaged; }
  // The word after adding `delta` to the low half; the run tag never changes.
  static constexpr std::uint64_t bump(std::uint64_t w, std::uint64_t delta) {
    return (w & ~kLowMask) | ((w + delta) & kLowMask);
  }

  // acquire: a reader must see every write of the critical sections that unlocked before the
  // value it reads (optimistic_lock.h R1/R3).
  static std::uint64_t load(const std::uint64_t& word) {
    return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(word))
        .load(std::memory_order_acquire);
  }
};

// This run's NodeLock tag: the pool generation (bumped by every open) in the low 16 bits and
// 16 random bits above, never 0. A lock word from another run differs unless both halves
// repeat (part's README: the limit). Every index on the core tags its run with it.
inline std::uint32_t run_tag(std::uint64_t generation) {
  std::random_device rd;
  const std::uint32_t tag = static_cast<std::uint32_t>(generation & 0xffff) |
                            (static_cast<std::uint32_t>(rd()) << 16);
  return tag != 0 ? tag : 1;
}

// --- nodes ---------------------------------------------------------------------------------------
enum class NodeType : std::uint8_t { n4 = 1, n16 = 2, n48 = 3, n256 = 4 };

// Node header, 40 B, the first 40 bytes of every node:
//   [ 0, 8) lock     NodeLock word (volatile)
//   [ 8,16) shape    bits 0-31 level: the key depth at which this node's prefix starts
//                    bits 32-63 prefix length; level + length is the branch depth, at which the
//                    node chooses a child by the key byte (one word: both change atomically)
//   [16,24) prefix   the first min(length, 8) prefix bytes; meaningful only while level equals
//                    the depth the node is reached at (a stale level, left by a crash between a
//                    prefix split's publish and its prefix update, makes them untrusted: the
//                    prefix is then read from a record's key; PROTOCOL.md P6)
//   [24,32) end      record word of the key that ends at the branch depth, or 0
//   [32]    type     NodeType (immutable)
//   [33]    reserved
//   [34,36) count    live children, volatile: rebuilt at first touch, used by writers only
//   [36,40) reserved
struct NodeHeader {
  std::uint64_t lock;
  std::uint64_t shape;
  std::uint64_t prefix;
  std::uint64_t end;
  std::uint8_t type;
  std::uint8_t reserved0;
  std::uint16_t count;
  std::uint32_t reserved1;
};
static_assert(sizeof(NodeHeader) == 40);
static_assert(offsetof(NodeHeader, shape) == 8 && offsetof(NodeHeader, end) == 24 &&
              offsetof(NodeHeader, type) == 32 && offsetof(NodeHeader, count) == 34);
static_assert(std::is_standard_layout_v<NodeHeader> && std::is_trivially_copyable_v<NodeHeader>);

constexpr std::uint64_t make_shape(std::uint32_t level, std::uint32_t len) {
  return std::uint64_t{len} << 32 | level;
}
constexpr std::uint32_t level_of(std::uint64_t shape) { return static_cast<std::uint32_t>(shape); }
constexpr std::uint32_t prefix_len_of(std::uint64_t shape) {
  return static_cast<std::uint32_t>(shape >> 32);
}

// N4, 80 B (two lines):
//   [0,40) header   [40,44) key bytes of slots 0-3 (accelerator)  [44,48) 0
//   [48,80) child words 0-3 (unordered; a slot is live iff its word is non-zero)
struct N4 {
  static constexpr unsigned kCapacity = 4;
  NodeHeader h;
  std::uint64_t keys;
  std::uint64_t child[4];
};
static_assert(sizeof(N4) == 80 && offsetof(N4, keys) == 40 && offsetof(N4, child) == 48);

// N16, 184 B (three lines):
//   [0,40) header   [40,56) key bytes of slots 0-15 (accelerator)
//   [56,184) child words 0-15 (unordered)
struct N16 {
  static constexpr unsigned kCapacity = 16;
  NodeHeader h;
  std::uint64_t keys[2];
  std::uint64_t child[16];
};
static_assert(sizeof(N16) == 184 && offsetof(N16, keys) == 40 && offsetof(N16, child) == 56);

// N48, 680 B:
//   [0,40) header   [40,296) index: byte b -> slot + 1, 0 = none (accelerator)
//   [296,680) child words 0-47
struct N48 {
  static constexpr unsigned kCapacity = 48;
  NodeHeader h;
  std::uint64_t index[32];
  std::uint64_t child[48];
};
static_assert(sizeof(N48) == 680 && offsetof(N48, index) == 40 && offsetof(N48, child) == 296);

// N256, 2088 B:
//   [0,40) header   [40,2088) child words, indexed by the key byte
struct N256 {
  static constexpr unsigned kCapacity = 256;
  NodeHeader h;
  std::uint64_t child[256];
};
static_assert(sizeof(N256) == 2088 && offsetof(N256, child) == 40);
static_assert(std::is_standard_layout_v<N4> && std::is_trivially_copyable_v<N4> &&
              std::is_standard_layout_v<N16> && std::is_standard_layout_v<N48> &&
              std::is_standard_layout_v<N256> && std::is_trivially_copyable_v<N256>);

inline constexpr std::size_t kMaxNodeBytes = sizeof(N256);

constexpr bool valid_type(std::uint8_t t) { return t >= 1 && t <= 4; }
constexpr std::size_t node_bytes(NodeType t) {
  switch (t) {
    case NodeType::n4: return sizeof(N4);
    case NodeType::n16: return sizeof(N16);
    case NodeType::n48: return sizeof(N48);
    case NodeType::n256: return sizeof(N256);
  }
  return 0;
}
constexpr unsigned capacity_of(NodeType t) {
  switch (t) {
    case NodeType::n4: return 4;
    case NodeType::n16: return 16;
    case NodeType::n48: return 48;
    case NodeType::n256: return 256;
  }
  return 0;
}
// The child-word array of a node and its length (every type has one).
inline std::uint64_t* children_of(NodeHeader* n) {
  switch (static_cast<NodeType>(n->type)) {
    case NodeType::n4: return reinterpret_cast<N4*>(n)->child;
    case NodeType::n16: return reinterpret_cast<N16*>(n)->child;
    case NodeType::n48: return reinterpret_cast<N48*>(n)->child;
    case NodeType::n256: return reinterpret_cast<N256*>(n)->child;
  }
  return nullptr;
}
inline const std::uint64_t* children_of(const NodeHeader* n) {
  return children_of(const_cast<NodeHeader*>(n));
}
// Grow and shrink targets. Shrinking leaves room below the smaller capacity (hysteresis), so a
// node at the boundary does not flip between types on alternating insert and remove.
constexpr NodeType grown(NodeType t) {
  return t == NodeType::n4 ? NodeType::n16 : t == NodeType::n16 ? NodeType::n48 : NodeType::n256;
}
constexpr NodeType shrunk(NodeType t) {
  return t == NodeType::n256 ? NodeType::n48 : t == NodeType::n48 ? NodeType::n16 : NodeType::n4;
}
// Shrink when the count after a remove is at most this.
constexpr unsigned shrink_at(NodeType t) {
  return t == NodeType::n16 ? 3 : t == NodeType::n48 ? 12 : t == NodeType::n256 ? 40 : 0;
}

// --- records ----------------------------------------------------------------------------------
// Record (16 + key length bytes, 8 B aligned; 24 B for an 8-byte key):
//   [0,4)  key length    [4,8) 0
//   [8,16) value word: the 8 value bytes, or the pool offset of an out-of-line value record
//          (index/common/value_codec.h); replaced in place by one failure-atomic store
//   [16, 16 + key length) key bytes
// The key is immutable from publication until the record is freed.
struct Record {
  std::uint32_t key_len;
  std::uint32_t reserved;
  std::uint64_t value;
  const char* key() const { return reinterpret_cast<const char*>(this + 1); }
  char* key() { return reinterpret_cast<char*>(this + 1); }
};
static_assert(sizeof(Record) == 16 && offsetof(Record, value) == 8);
static_assert(std::is_standard_layout_v<Record> && std::is_trivially_copyable_v<Record>);
constexpr std::size_t record_bytes(std::size_t key_len) { return sizeof(Record) + key_len; }

// Acquire load of a word another thread publishes (child words, shape, prefix, end, value).
inline std::uint64_t load_word(const std::uint64_t& w) {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(w))
      .load(std::memory_order_acquire);
}

}  // namespace pmindex::art

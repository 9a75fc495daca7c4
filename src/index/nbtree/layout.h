// nbtree's persistent layout: the root object, the key-value block and its entries, the value
// word and the out-of-line value record, byte offsets drawn and asserted (PROTOCOL.md cites
// them), and the limits they imply. The DRAM leaves and inner nodes: nbtree.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/chain_tag.h"
#include "index/common/root_stamp.h"

namespace pmindex::nbtree {

// Root object (64 B, one line).
//   [ 0, 8) magic "BNTREE03" (02: value words with the little_endian bit; 03: tagged links)
//   [ 8,16) head: link to the first key-value block (offset and tag, common/chain_tag.h)
//   [16,24) zero_present: 1 if key 0 is live (key 0 lives here, not in a leaf: 0 = empty slot)
//   [24,32) zero_value: key 0's value word (same encoding as a leaf value)
//   [32,36) node_size              [36,40) max_value_size
//   [40,44) max_key_size (KeyType::bytes: the longest key, <= kMaxKeyBytes; 0 otherwise)
//   [44,64) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t head;
  std::uint64_t zero_present;
  std::uint64_t zero_value;
  std::uint32_t node_size;
  std::uint32_t max_value_size;
  std::uint32_t max_key_size;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[4];
};
static_assert(sizeof(Root) == 64);
static_assert(offsetof(Root, head) == 8 && offsetof(Root, zero_value) == 24 &&
              offsetof(Root, node_size) == 32 && offsetof(Root, max_key_size) == 40);
static_assert(offsetof(Root, stamp) == 44, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x3330454552544e42ull;  // "BNTREE03" little-endian
inline constexpr std::uint64_t kRootMagicUntagged = 0x3230454552544e42ull;  // "BNTREE02": refused

// Key-value entry (16 B; four per cache line, never straddling one).
//   [0,8) key word: 0 = empty (never written, or deleted)    [8,16) value word (below)
// Key word: u64/f64 keys: the key's big-endian integer (key 0 lives in the root, Z*);
// KeyType::bytes: the pool offset (never 0) of an immutable PM key record (pm_record.h, K1-K3).
struct Entry {
  std::uint64_t key;
  std::uint64_t value;
};
static_assert(sizeof(Entry) == 16 && offsetof(Entry, value) == 8);
static_assert(std::is_standard_layout_v<Entry> && std::is_trivially_copyable_v<Entry>);

// Key-value block: one per leaf, node_size bytes (64..1024), 64 B aligned (256 B from 256 B).
//   [0,8) next: link to the next block in key order (common/chain_tag.h: its offset in bits
//         0-47, its tag in bits 48-63; kChainEnd after the last block; 0 only while a new
//         block is not yet linked, S9/M5)
//   [8,16) tag: the block's own tag (1..kEndTag-1), written with the zeroed block (S2, B1, C1)
//   [16, node_size) entries[capacity], capacity = node_size / 16 - 1 (63 for 1 KiB)
struct BlockHeader {
  std::uint64_t next;
  std::uint64_t tag;
};
static_assert(sizeof(BlockHeader) == 16 && offsetof(BlockHeader, tag) == 8);
static_assert(std::is_standard_layout_v<BlockHeader> && std::is_trivially_copyable_v<BlockHeader>);

// Value word. Bits: 63 copy_bit | 62 sync_bit | 61 out_of_line | 60 little_endian | 59..0.
//   inline, big-endian:    an 8-byte value whose big-endian integer is < 2^60 (word = it)
//   inline, little-endian: otherwise, an 8-byte value whose little-endian integer is < 2^60
//                          (word = it | little_endian): pmbench's values (48-bit words stored
//                          little-endian, like a record pointer) take this common path
//   out_of_line:           payload is the offset of a ValueRecord (any length up to
//                          max_value_size, and 8-byte values too large both ways)
inline constexpr std::uint64_t kCopyBit = std::uint64_t{1} << 63;
inline constexpr std::uint64_t kSyncBit = std::uint64_t{1} << 62;
inline constexpr std::uint64_t kOutOfLine = std::uint64_t{1} << 61;
inline constexpr std::uint64_t kLittleEndian = std::uint64_t{1} << 60;
inline constexpr std::uint64_t kStateBits = kCopyBit | kSyncBit;
inline constexpr std::uint64_t kInlineLimit = kLittleEndian;
inline constexpr std::uint64_t payload_of(std::uint64_t w) { return w & ~kStateBits; }

// Out-of-line value record, 64 B aligned.
//   [0,4) length   [4,8) reserved   [8, 8+length) bytes
struct ValueRecord {
  std::uint32_t length;
  std::uint32_t reserved;
};
static_assert(sizeof(ValueRecord) == 8);
static_assert(std::is_standard_layout_v<ValueRecord> && std::is_trivially_copyable_v<ValueRecord>);

inline constexpr std::uint32_t kDefaultNodeSize = 1024;
inline constexpr std::uint32_t kMinNodeSize = 64;
inline constexpr std::uint32_t kMaxNodeSize = 1024;  // capacity 63 + the smo bit fit one word
inline constexpr int kMaxSlots = 63;
inline constexpr std::uint32_t kMaxValueSize = 4096;
// Documented limit (README / PROTOCOL.md): KeyType::bytes keys are 0..max_key_size bytes and
// max_key_size is at most kMaxKeyBytes; a longer key is Code::key_too_large.
inline constexpr std::uint32_t kMaxKeyBytes = 8192;

}  // namespace pmindex::nbtree

// DPTree layouts: the PM root object, base-tree leaves with two metadata versions, and the
// write-ahead log's pages and records. Persistence steps: PROTOCOL.md (cited as `// Xn:`).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/chain_tag.h"
#include "index/common/root_stamp.h"

namespace pmindex::dptree {

// Root object (128 B, two lines), written once at creation (C1) except state, head[] and log_head.
//   [ 0, 8) magic "DPTREE02" (02: tagged links; "DPTREE01" pools are refused)
//   [ 8,16) state: bit 0 = gv, the current metadata version; bits 1-63 = covered, the highest
//           log sequence number the base tree holds. One 8-byte store flips both (M5).
//   [16,32) head[2]: tagged link (chain_tag.h) to the first leaf of the chain of version v
//   [32,40) log_head: tagged link to the first log page (kChainEnd = empty log; 0 is damage)
//   [40,44) slots per leaf     [44,48) key_mode
//   [48,52) max_key_size       [52,56) max_value_size
//   [56,60) log_page_bytes: the log's page size, fixed at creation (log_page_bytes_for)
//   [60,64) reserved (0)
//   [64,80) stamp: the layout id at creation (index_common::RootStamp), checked at open
//   [80,128) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t state;
  std::uint64_t head[2];
  std::uint64_t log_head;
  std::uint32_t slots;
  std::uint32_t key_mode;
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  std::uint32_t log_page_bytes;
  std::uint32_t reserved;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved2[48];
};
static_assert(sizeof(Root) == 128 && offsetof(Root, stamp) == 64);
static_assert(offsetof(Root, state) == 8 && offsetof(Root, head) == 16 &&
              offsetof(Root, log_head) == 32 && offsetof(Root, slots) == 40 &&
              offsetof(Root, max_value_size) == 52 && offsetof(Root, log_page_bytes) == 56);
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x3230454552545044ull;          // "DPTREE02"
inline constexpr std::uint64_t kRootMagicUntagged = 0x3130454552545044ull;  // "DPTREE01"
constexpr std::uint64_t state_word(std::uint64_t covered, unsigned gv) {
  return covered << 1 | gv;
}
constexpr unsigned state_gv(std::uint64_t s) { return static_cast<unsigned>(s & 1); }
constexpr std::uint64_t state_covered(std::uint64_t s) { return s >> 1; }

// One metadata version of a leaf (64 B, one line):
//   [ 0,32) bitmap: bit i = slot i holds a live record (slots >= S are always 0)
//   [32,40) bound: the leaf holds keys in (previous leaf's bound, bound]; the last leaf's is ~0
//   [40,48) next: tagged link (chain_tag.h) to the next leaf of this version's chain: its offset
//           and its own tag; the last leaf's is kChainEnd, so 0 is damage
//   [48,56) count: popcount of bitmap (checked at recovery)
//   [56,64) tag: the leaf's own 16-bit tag (1..0xfffe), the same in every version M3 writes
//           (PROTOCOL.md, "Tagged links")
// The sorted order of the live slots (the paper's order array) is DRAM-only, rebuilt at
// recovery by sorting at most S keys.
struct Meta {
  std::uint64_t bitmap[4];
  std::uint64_t bound;
  std::uint64_t next;
  std::uint64_t count;
  std::uint64_t tag;
};
static_assert(sizeof(Meta) == 64);
static_assert(offsetof(Meta, bound) == 32 && offsetof(Meta, next) == 40 &&
              offsetof(Meta, count) == 48 && offsetof(Meta, tag) == 56);
static_assert(std::is_standard_layout_v<Meta> && std::is_trivially_copyable_v<Meta>);

// Record slot: key word (big-endian key bytes read as an integer) and the full 64-bit value.
struct Slot {
  std::uint64_t key;
  std::uint64_t value;
};
static_assert(sizeof(Slot) == 16);

// Base-tree leaf of S slots (S a power of two in 8..256), node_size = leaf_bytes(S):
//   [  0, 64) meta[0]     [ 64,128) meta[1]
//   [128, 128 + fp_bytes(S))        fp[S]: 1-byte fingerprints, padded to a line
//   [kv_offset(S), + 16 S)          slots[S]
// A key's home slot is hash(key) mod S; it lives in the first free slot of the probe window
// [home, home + window(S)) (wrapping), so a lookup reads at most two fingerprint lines.
inline constexpr std::uint32_t kMinSlots = 8;
inline constexpr std::uint32_t kMaxSlots = 256;
inline constexpr std::uint32_t kDefaultSlots = 256;
constexpr std::size_t fp_bytes(std::uint32_t s) { return (s + 63) / 64 * 64; }
constexpr std::size_t kv_offset(std::uint32_t s) { return 128 + fp_bytes(s); }
constexpr std::size_t leaf_bytes(std::uint32_t s) { return kv_offset(s) + 16 * std::size_t{s}; }
constexpr std::uint32_t window(std::uint32_t s) { return s < 64 ? s : 64; }
static_assert(leaf_bytes(8) == 320 && leaf_bytes(256) == 4480);
// The slot count for a node_size, 0 if node_size is not one of leaf_bytes(8..256).
constexpr std::uint32_t slots_for(std::size_t node_size) {
  for (std::uint32_t s = kMinSlots; s <= kMaxSlots; s *= 2)
    if (leaf_bytes(s) == node_size) return s;
  return 0;
}
static_assert(slots_for(4480) == 256 && slots_for(320) == 8 && slots_for(100) == 0);

struct LeafView {
  char* base;
  std::uint32_t slots;
  Meta* meta(unsigned v) const { return reinterpret_cast<Meta*>(base) + v; }
  std::uint8_t* fp() const { return reinterpret_cast<std::uint8_t*>(base + 128); }
  Slot* slot(std::uint32_t i) const {
    return reinterpret_cast<Slot*>(base + kv_offset(slots)) + i;
  }
};

// Key hashing: home slot from the low bits, fingerprint from the top byte.
constexpr std::uint64_t key_hash(std::uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}
constexpr std::uint8_t key_fp(std::uint64_t h) { return static_cast<std::uint8_t>(h >> 56); }

// --- write-ahead log -------------------------------------------------------------------------
// Log page (root.log_page_bytes, a multiple of 64 B): a header line, then one-line records.
//   header [0,8) next: tagged link to the next page (kChainEnd = last; 0 is damage)
//          [8,16) first_lsn: sequence number of record 0
//          [16,24) tag: the page's own 16-bit tag (1..0xfffe), written with the header (L4)
//          [24,64) reserved
// Record j of a page carries sequence number first_lsn + j.
// The page size is chosen at creation (log_page_bytes_for): the allocator's block for a base
// leaf when that is at least kMinLogPageBytes (256 slots: 4,480 B leaves in 5,120 B blocks, so
// pages of 5,120 B with 79 records), else kMinLogPageBytes. Log pages and leaves then share one
// size class, and the pages a merge frees serve the next merge's leaves and the reverse: with 4
// KiB pages, 660 MiB of freed pages sat unusable beside the leaves at 100M records (issue 19,
// docs/allocator.md). Recording the size in the root keeps the log's format independent of the
// allocator's class table.
inline constexpr std::size_t kMinLogPageBytes = 4096;
inline constexpr std::size_t kMaxLogPageBytes = 64 * 1024;
constexpr bool valid_log_page_bytes(std::uint64_t b) {
  return b % 64 == 0 && b >= kMinLogPageBytes && b <= kMaxLogPageBytes;
}
constexpr std::uint32_t records_per_page(std::size_t page_bytes) {
  return static_cast<std::uint32_t>(page_bytes / 64 - 1);
}
static_assert(records_per_page(kMinLogPageBytes) == 63 && records_per_page(5120) == 79);
struct LogPageHeader {
  std::uint64_t next;
  std::uint64_t first_lsn;
  std::uint64_t tag;
  std::uint64_t reserved[5];
};
static_assert(sizeof(LogPageHeader) == 64 && offsetof(LogPageHeader, tag) == 16);

// Log record (64 B, one line; the simulator's unit of failure atomicity is 8 bytes):
//   [0,8) key word   [8,16) value   [16,24) op (kOpPut or kOpDelete)   [24,56) zero
//   [56,64) validity: bits 24-63 the sequence number (lsn < 2^40), bits 0-23 a checksum of
//           (key, value, op, lsn). Written after the other words (L2), so a record whose words
//           did not all persist, or one left from an earlier use of the page, fails the check.
struct LogRecord {
  std::uint64_t key;
  std::uint64_t value;
  std::uint64_t op;
  std::uint64_t zero[4];
  std::uint64_t validity;
};
static_assert(sizeof(LogRecord) == 64 && offsetof(LogRecord, validity) == 56);
inline constexpr std::uint64_t kOpPut = 0x5055;     // "UP"
inline constexpr std::uint64_t kOpDelete = 0x4C44;  // "DL"
inline constexpr std::uint64_t kMaxLsn = (std::uint64_t{1} << 40) - 1;
constexpr std::uint64_t record_check(std::uint64_t key, std::uint64_t value, std::uint64_t op,
                                     std::uint64_t lsn) {
  std::uint64_t h = key_hash(key ^ 0x9e3779b97f4a7c15ull);
  h = key_hash(h ^ value);
  h = key_hash(h ^ op ^ (lsn << 17));
  return h & 0xFFFFFF;
}
constexpr std::uint64_t validity_word(std::uint64_t key, std::uint64_t value, std::uint64_t op,
                                      std::uint64_t lsn) {
  return lsn << 24 | record_check(key, value, op, lsn);
}
// A record of sequence number `lsn` that was written whole (L1-L3): a known op and its
// validity word. Recovery's replay (R2) and its end check (R2e) read records through this.
constexpr bool record_checks(const LogRecord& r, std::uint64_t lsn) {
  return (r.op == kOpPut || r.op == kOpDelete) &&
         r.validity == validity_word(r.key, r.value, r.op, lsn);
}

}  // namespace pmindex::dptree

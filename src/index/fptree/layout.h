// FPTree's persistent layout: the root object (below), the PM leaf (Oukid et al., SIGMOD 2016,
// §4; survey 000 §3.2) and its micro-logs.
//
// Leaf<N>, N entries (8, 16, 32 or 64; 64 is the paper's and the survey's setting), one
// allocator block of max(256, sizeof) bytes (256 B aligned, so LeafVersions' 256 B granules
// give every leaf its own DRAM version):
//
//   [ 0, 8)   bitmap     bit s set iff slot s holds a valid entry (bits >= N are zero)
//   [ 8,16)   next       link to the next leaf in key order: its pool offset in bits 0-47 and
//                        its tag in bits 48-63; kChainEnd (offset 0, tag kEndTag) at the end
//   [16,24)   lock       1 while a writer holds the leaf; volatile meaning, cleared at recovery
//   [24,32)   tag        the leaf's own tag (1..kEndTag-1), written before the leaf is linked
//   [32,K)    fps        one-byte fingerprints, slot s at byte 32 + s, packed 8 per u64 word
//                        (stored as whole words so that optimistic readers read atomically)
//   [K, K + 16N) kv[s]   slot s: key word, value word (unsorted)
// K = 32 + N rounded up to 64: the KV slots start on a cache line.
//   N = 8: 192 B (kv at 64)    N = 16: 320 B    N = 32: 576 B    N = 64: 1152 B (kv at 128)
// For N = 64: line 0 holds bitmap, next, lock and fingerprints 0..31; line 1 fingerprints
// 32..63; then 4 slots per line.
//
// MicroLog: one 32-byte entry per thread slot (two per line), in an array the root points to.
//   [ 0, 8) split_leaf    leaf being split (0 = no split in progress)
//   [ 8,16) split_new     the new leaf, once allocated (its block is owned through the log)
//   [16,24) delete_leaf   leaf being unlinked, empty (D3-D6) or merged into delete_prev
//                         (J1-J7) (0 = none)
//   [24,32) delete_prev   its predecessor in the chain
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/chain_tag.h"
#include "index/common/root_stamp.h"

namespace pmindex::fptree {

// Root object (64 B, one line), written once at creation (C1).
//   [ 0, 8) magic "FPTREE01"   [ 8,16) head: first leaf (never changes)
//   [16,24) logs: offset of the MicroLog array   [24,28) leaf entries N   [28,32) key_mode
//   [32,36) max_key_size       [36,40) log entries
//   [40,44) max_value_size: 8 (or 0, pools made before values went out of line) = exactly
//           8-byte values inline in the slot; 9..kMaxValueBytes = values of 0..max_value_size
//           bytes out of line (the slot holds the offset of a PM record, pm_record.h)
//   [44,64) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t head;
  std::uint64_t logs;
  std::uint32_t entries;
  std::uint32_t key_mode;
  std::uint32_t max_key_size;
  std::uint32_t log_count;
  std::uint32_t max_value_size;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[4];
};
static_assert(sizeof(Root) == 64 && offsetof(Root, logs) == 16 && offsetof(Root, entries) == 24 &&
              offsetof(Root, log_count) == 36 && offsetof(Root, max_value_size) == 40);
static_assert(offsetof(Root, stamp) == 44, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x3130454552545046ull;  // "FPTREE01"

constexpr std::size_t fp_bytes_for(unsigned n) { return (32 + n + 63) / 64 * 64 - 32; }

template <unsigned N>
struct Leaf {
  static_assert(N >= 8 && N <= 64 && N % 8 == 0, "bitmap is one u64, fingerprints whole words");
  static constexpr unsigned kSlots = N;
  static constexpr std::uint64_t kFullMask = N == 64 ? ~std::uint64_t{0}
                                                     : (std::uint64_t{1} << N) - 1;
  static constexpr std::size_t kFpWords = fp_bytes_for(N) / 8;

  std::uint64_t bitmap;
  std::uint64_t next;
  std::uint64_t lock;
  std::uint64_t tag;
  std::uint64_t fps[kFpWords];
  std::uint64_t kv[N][2];
};

// Links carry the tag of the leaf they name (common/chain_tag.h): a link zeroed or redirected
// to another leaf by damage no longer matches, after any end, at no extra line.
using index_common::kChainEnd;
using index_common::kEndTag;
using index_common::link_off;
using index_common::link_tag;
using index_common::make_link;
using index_common::valid_tag;

// True if slot s's fingerprint word lies in line 0, the bitmap's line (leaves are 256 B
// aligned): slots 0..31, i.e. every slot for N <= 32.
constexpr bool fp_word_shares_bitmap_line(unsigned s) { return 32 + 8 * (s / 8) < 64; }
static_assert(fp_word_shares_bitmap_line(31) && !fp_word_shares_bitmap_line(32));

// Leaves occupy at least 256 B (one LeafVersions granule each).
template <unsigned N>
inline constexpr std::size_t kLeafBlock = sizeof(Leaf<N>) < 256 ? 256 : sizeof(Leaf<N>);

static_assert(offsetof(Leaf<64>, bitmap) == 0 && offsetof(Leaf<64>, next) == 8 &&
              offsetof(Leaf<64>, lock) == 16 && offsetof(Leaf<64>, tag) == 24 &&
              offsetof(Leaf<64>, fps) == 32);
static_assert(offsetof(Leaf<8>, kv) == 64 && sizeof(Leaf<8>) == 192);
static_assert(offsetof(Leaf<16>, kv) == 64 && sizeof(Leaf<16>) == 320);
static_assert(offsetof(Leaf<32>, kv) == 64 && sizeof(Leaf<32>) == 576);
static_assert(offsetof(Leaf<64>, kv) == 128 && sizeof(Leaf<64>) == 1152,
              "the paper's 64-entry leaf: two header lines, then 16 lines of slots");
static_assert(std::is_standard_layout_v<Leaf<64>> && std::is_trivially_copyable_v<Leaf<64>>);
static_assert(std::is_standard_layout_v<Leaf<8>> && std::is_trivially_copyable_v<Leaf<8>>);

struct MicroLog {
  std::uint64_t split_leaf;
  std::uint64_t split_new;
  std::uint64_t delete_leaf;
  std::uint64_t delete_prev;
};
static_assert(sizeof(MicroLog) == 32 && offsetof(MicroLog, delete_leaf) == 16);
static_assert(std::is_standard_layout_v<MicroLog> && std::is_trivially_copyable_v<MicroLog>);

// Fingerprint access on the packed words (byte s % 8 of word s / 8, little-endian).
constexpr std::uint8_t fp_of(std::uint64_t word, unsigned s) {
  return static_cast<std::uint8_t>(word >> (8 * (s % 8)));
}
constexpr std::uint64_t with_fp(std::uint64_t word, unsigned s, std::uint8_t fp) {
  const unsigned sh = 8 * (s % 8);
  return (word & ~(std::uint64_t{0xFF} << sh)) | (std::uint64_t{fp} << sh);
}
static_assert(fp_of(with_fp(0, 9, 0xAB), 9) == 0xAB && with_fp(0, 9, 0xAB) == 0xAB00);

// The fingerprint compare of a lookup, eight slots per instruction sequence (SWAR, so that
// the words are still read with one atomic load each): bit i of the result is set iff byte i
// of `word` equals `fp`. Exact (no false positives from borrows): a byte is zero iff adding
// 0x7F to its low 7 bits does not carry into bit 7 and its own bit 7 is clear.
constexpr unsigned fp_matches(std::uint64_t word, std::uint8_t fp) {
  constexpr std::uint64_t kLow7 = 0x7F7F7F7F7F7F7F7Full;
  const std::uint64_t x = word ^ (std::uint64_t{fp} * 0x0101010101010101ull);
  const std::uint64_t zero_hi = ~(((x & kLow7) + kLow7) | x | kLow7);  // 0x80 in zero bytes
  return static_cast<unsigned>(((zero_hi >> 7) * 0x0102040810204080ull) >> 56);
}
static_assert(fp_matches(0x00AB00000000AB00ull, 0xAB) == 0b01000010 &&
              fp_matches(0x0000000000000000ull, 0x00) == 0xFF &&
              fp_matches(0x8000000000000001ull, 0x00) == 0b01111110 &&
              fp_matches(0x0101010101010101ull, 0x00) == 0 &&
              fp_matches(0x7F80FF00017E8081ull, 0x80) == 0b01000010);

}  // namespace pmindex::fptree

// LB+-Tree's persistent layout: the root object (below), the PM leaf (paper 001 §3.1, §3.4)
// and the header arithmetic on a 16-byte `DWord` copy. The header is only ever changed by
// building a DWord and writing its words back (PROTOCOL.md P-steps), never bit by bit in PM.
//
// A leaf is M blocks of 256 B (M = 1, 2, 4), 256 B aligned. Block b, as 16 units of 16 B:
//
//   line 0  unit 0      [  0, 16)  front header (word0, word1)
//           units 1-3   [ 16, 64)  slots 0, 1, 2
//   line 1  units 4-7   [ 64,128)  slots 3 .. 6
//   line 2  units 8-11  [128,192)  slots 7 .. 10
//   line 3  units 12-14 [192,240)  slots 11, 12, 13
//           unit 15     [240,256)  block 0: sibling[0], sibling[1] (sibling words, below)
//                                  block b>0: back (alternative) header (word0, word1)
//
// Header word0 (little-endian u64):
//   bits 0-13   bitmap: slot s holds a valid entry iff bit s is set
//   bit  14     lock (block 0 only; volatile meaning, cleared by recovery)
//   bit  15     alt  (block 0 only): selects sibling[alt] and, for blocks b>0, the back
//               header (alt = 1) or the front header (alt = 0) as the active one
//   bits 16-63  fingerprints of slots 0..5 (byte 2 + s)
// Header word1: fingerprints of slots 6..13 (byte s - 6).
// So the 16 header bytes are: [bitmap+lock+alt : 2 B][fp 0..13 : 14 B], and one SSE compare of
// the 16 bytes against the search fingerprint yields the candidate slots in mask bits 2..15.
// Block b>0 headers keep bits 14-15 zero.
//
// Sibling word (tagged links, docs/pool-format.md "Unclean shutdown", common/chain_tag.h in an
// 8-bit form: block 0 has no spare word for a 16-bit own tag):
//   bits  0-47  the successor's pool offset (0 at the end of the chain)
//   bits 48-55  the successor's own tag (kEndTag8 at the end)
//   bits 56-63  this leaf's own tag (1..kEndTag8-1), the same in both words, written with the
//               new leaf before it is linked and copied into every word a switch writes.
// Recovery checks that each active word names its successor's own tag and that the last one
// carries the end mark: a sibling word zeroed or redirected by damage is refused after any
// end (but for 1 in 254 redirects). A word of 0 (own tag 0) is always damage.
//
// Slot entry: word 0 = key word (u64/f64: the key's big-endian bytes read as an integer;
// bytes: pool offset of a PM key record), word 1 = value (8 raw bytes, or the pool offset of
// a PM value record when the pool stores values out of line).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/root_stamp.h"

namespace pmindex::lbtree {

// Root object (64 B, one line), written once at creation (P0).
//   [ 0, 8) magic "LBTREE02" (02: tagged sibling words, below)
//   [ 8,16) head: offset of the first leaf (never changes)
//   [16,20) node_size (256 M)  [20,24) key_mode
//   [24,28) max_key_size       [28,32) max_value_size (8 = inline values)
//   [32,64) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t head;
  std::uint32_t node_size;
  std::uint32_t key_mode;
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[16];
};
static_assert(sizeof(Root) == 64);
static_assert(offsetof(Root, head) == 8 && offsetof(Root, node_size) == 16 &&
              offsetof(Root, max_value_size) == 28);
static_assert(offsetof(Root, stamp) == 32, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x323045455254424Cull;  // "LBTREE02"
inline constexpr std::uint64_t kRootMagicUntagged = 0x313045455254424Cull;  // "LBTREE01": refused

inline constexpr std::uint64_t kOffMask = (std::uint64_t{1} << 48) - 1;
inline constexpr std::uint64_t kEndTag8 = 0xff;
constexpr std::uint64_t sib_off(std::uint64_t w) { return w & kOffMask; }
constexpr std::uint64_t sib_succ_tag(std::uint64_t w) { return (w >> 48) & 0xff; }
constexpr std::uint64_t sib_own_tag(std::uint64_t w) { return w >> 56; }
constexpr std::uint64_t make_sibling(std::uint64_t succ_off, std::uint64_t succ_tag,
                                     std::uint64_t own_tag) {
  return succ_off | succ_tag << 48 | own_tag << 56;
}
constexpr bool valid_tag8(std::uint64_t tag) { return tag != 0 && tag < kEndTag8; }
// The word `own` would hold to name what `from` (another leaf's sibling word) names.
constexpr std::uint64_t reowned(std::uint64_t from, std::uint64_t own_tag) {
  return (from & ~(std::uint64_t{0xff} << 56)) | own_tag << 56;
}
static_assert(sib_off(make_sibling(0x123456789a00ull, 7, 9)) == 0x123456789a00ull &&
              sib_succ_tag(make_sibling(1, 7, 9)) == 7 && sib_own_tag(make_sibling(1, 7, 9)) == 9 &&
              sib_own_tag(reowned(make_sibling(1, 7, 9), 3)) == 3);

inline constexpr unsigned kSlotsPerBlock = 14;
inline constexpr std::uint64_t kBitmapMask = 0x3FFF;
inline constexpr std::uint64_t kLockBit = std::uint64_t{1} << 14;
inline constexpr std::uint64_t kAltBit = std::uint64_t{1} << 15;

struct Block {
  std::uint64_t front[2];                  // unit 0: front header
  std::uint64_t entry[kSlotsPerBlock][2];  // units 1..14: (key word, value word)
  std::uint64_t tail[2];                   // unit 15: siblings (block 0) / back header
};
static_assert(sizeof(Block) == 256);
static_assert(offsetof(Block, front) == 0);
static_assert(offsetof(Block, entry) == 16);
static_assert(offsetof(Block, entry) + 3 * 16 == 64, "slots 0-2 share line 0 with the header");
static_assert(offsetof(Block, tail) == 240, "unit 15 is the last unit of line 3");
static_assert(std::is_standard_layout_v<Block> && std::is_trivially_copyable_v<Block>);

template <unsigned M>
struct Leaf {
  static constexpr unsigned kBlocks = M;
  static constexpr unsigned kSlots = kSlotsPerBlock * M;
  static constexpr std::size_t kBytes = 256 * M;
  Block block[M];
};
static_assert(sizeof(Leaf<1>) == 256 && sizeof(Leaf<2>) == 512 && sizeof(Leaf<4>) == 1024);
static_assert(std::is_standard_layout_v<Leaf<4>> && std::is_trivially_copyable_v<Leaf<4>>);

// The cache line (0..3) of slot s within its block.
constexpr unsigned line_of_slot(unsigned s) { return (s + 1) / 4; }
// Slots of line l: [first_slot(l), first_slot(l+1)).
constexpr unsigned first_slot(unsigned l) { return l == 0 ? 0 : 4 * l - 1; }
constexpr std::uint64_t line_slots_mask(unsigned l) {
  return ((std::uint64_t{1} << first_slot(l + 1)) - 1) &
         ~((std::uint64_t{1} << first_slot(l)) - 1) & kBitmapMask;
}
static_assert(line_slots_mask(0) == 0x7 && line_slots_mask(1) == 0x78 &&
              line_slots_mask(2) == 0x780 && line_slots_mask(3) == 0x3800);
static_assert(line_of_slot(2) == 0 && line_of_slot(3) == 1 && line_of_slot(13) == 3);

// A header copy: all fingerprint/bitmap changes happen here (paper: `dword`).
struct DWord {
  std::uint64_t w[2];

  std::uint64_t bitmap() const { return w[0] & kBitmapMask; }
  bool valid(unsigned s) const { return (w[0] >> s) & 1; }
  void set_valid(unsigned s) { w[0] |= std::uint64_t{1} << s; }
  void clear_valid(unsigned s) { w[0] &= ~(std::uint64_t{1} << s); }
  bool full() const { return bitmap() == kBitmapMask; }
  bool alt() const { return (w[0] & kAltBit) != 0; }
  std::uint8_t fp(unsigned s) const {
    return s < 6 ? static_cast<std::uint8_t>(w[0] >> (16 + 8 * s))
                 : static_cast<std::uint8_t>(w[1] >> (8 * (s - 6)));
  }
  void set_fp(unsigned s, std::uint8_t f) {
    if (s < 6) {
      const unsigned sh = 16 + 8 * s;
      w[0] = (w[0] & ~(std::uint64_t{0xFF} << sh)) | (std::uint64_t{f} << sh);
    } else {
      const unsigned sh = 8 * (s - 6);
      w[1] = (w[1] & ~(std::uint64_t{0xFF} << sh)) | (std::uint64_t{f} << sh);
    }
  }
};
static_assert(std::is_trivially_copyable_v<DWord> && sizeof(DWord) == 16);

}  // namespace pmindex::lbtree

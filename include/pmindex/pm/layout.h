// The pool header's byte layout and the layout id that says which index made a pool.
// docs/pool-format.md describes the format; this file is its source of truth.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace pmindex::pm {

enum class KeyMode : std::uint32_t { u64 = 1, f64 = 2, bytes = 3 };
std::string_view to_string(KeyMode mode);

// Which index, node size and key mode a pool holds. Two layouts must match exactly for a
// pool to open: a pool made by another index, node size or key mode is refused.
struct Layout {
  std::string kind;            // index name, <= 15 bytes ("lbtree", "fptree", "reflist", ...)
  std::uint32_t node_size = 0; // bytes; 0 where the index has no fixed node size
  KeyMode key_mode = KeyMode::u64;
  std::uint32_t variant = 0;   // index-specific layout variant (e.g. leaf entries)

  bool operator==(const Layout&) const = default;
  std::string describe() const;  // "lbtree (node 256 B, key u64)"
};

inline constexpr std::array<char, 8> kPoolMagic = {'P', 'M', 'I', 'N', 'D', 'E', 'X', '\0'};
inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::uint32_t kArchX86_64 = 1;
inline constexpr std::uint32_t kEndianTag = 0x01020304u;  // reads 0x04030201 on big-endian
inline constexpr std::uint64_t kCleanMark = 0x434c45414e5f5348ull;  // "HS_NAELC"
inline constexpr std::size_t kHeaderSize = 4096;

// Pool header, at offset 0 of every pool. All integers little-endian (checked by endian_tag).
//
//   line 0  [  0, 8)  magic "PMINDEX\0"
//           [  8,12)  format_version            [12,16) header_size (4096)
//           [ 16,20)  arch (1 = x86-64)         [20,24) endian_tag 0x01020304
//           [ 24,28)  cache_line (64)           [28,32) reserved (0)
//           [ 32,40)  pool_size                 [40,56) uuid
//           [ 56,64)  creation_time (s since epoch)
//   line 1  [ 64,80)  layout.kind (NUL padded)  [80,84) layout.node_size
//           [ 84,88)  layout.key_mode           [88,92) layout.variant  [92,96) reserved
//           [ 96,104) heap_offset               [104,120) reserved (0)
//           [120,128) checksum: CRC-32 of bytes [0,120), zero-extended
//   -- everything above is written once at creation; everything below is mutable and each
//      field is one failure-atomic 8-byte word, so it is not covered by the checksum --
//   line 2  [128,136) root offset (0 = none)
//           [136,144) clean_shutdown (kCleanMark or 0)
//           [144,152) heap_high_water: no block at or above it was ever handed out
//           [152,160) generation: incremented at every open
//   [160, 4096) reserved, zero
struct PoolHeader {
  char magic[8];
  std::uint32_t format_version;
  std::uint32_t header_size;
  std::uint32_t arch;
  std::uint32_t endian_tag;
  std::uint32_t cache_line;
  std::uint32_t reserved0;
  std::uint64_t pool_size;
  std::uint8_t uuid[16];
  std::uint64_t creation_time;
  char kind[16];
  std::uint32_t node_size;
  std::uint32_t key_mode;
  std::uint32_t variant;
  std::uint32_t reserved1;
  std::uint64_t heap_offset;
  std::uint64_t reserved2[2];
  std::uint64_t checksum;
  // mutable words
  std::uint64_t root;
  std::uint64_t clean_shutdown;
  std::uint64_t heap_high_water;
  std::uint64_t generation;
  std::uint8_t reserved3[kHeaderSize - 160];
};
static_assert(sizeof(PoolHeader) == kHeaderSize);
static_assert(std::is_standard_layout_v<PoolHeader> && std::is_trivially_copyable_v<PoolHeader>);
static_assert(offsetof(PoolHeader, kind) == 64, "line 1 starts with the layout");
static_assert(offsetof(PoolHeader, checksum) == 120);
static_assert(offsetof(PoolHeader, root) == 128, "mutable words start on line 2");
static_assert(offsetof(PoolHeader, generation) == 152);
inline constexpr std::size_t kChecksummedBytes = offsetof(PoolHeader, checksum);

// The header decoded for display (pmpool info) and checks.
struct HeaderInfo {
  std::uint32_t format_version = 0;
  std::uint64_t pool_size = 0;
  std::string uuid;             // 8-4-4-4-12 hex
  std::uint64_t creation_time = 0;
  Layout layout;
  std::uint64_t heap_offset = 0;
  std::uint64_t root = 0;
  bool clean_shutdown = false;
  std::uint64_t heap_high_water = 0;
  std::uint64_t generation = 0;
};

std::uint64_t header_checksum(const PoolHeader& header);

}  // namespace pmindex::pm

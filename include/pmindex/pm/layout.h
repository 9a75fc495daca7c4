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
inline constexpr std::uint32_t kFormatVersion = 2;
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
//   -- everything above is written once at creation; below are the mutable words, kept as two
//      copies of one 128-byte HeaderState, each with its own checksum (format version 2) --
//   lines 2-3  state copy 0:
//           [128,136) sequence: +1 at every state change
//           [136,144) root offset (0 = none)
//           [144,152) clean_shutdown (kCleanMark or 0)
//           [152,160) heap_high_water: no block at or above it was ever handed out
//           [160,168) generation: incremented at every open
//           [168,172) last_mode: persistence mode + 1 of the session that last wrote the pool
//           [172,176) flags: bit 0 = being built (created, no root published yet),
//                     bit 1 = upgraded from version 1 (index roots carry no layout stamp)
//           [176,184) records_at_close: records counted at the last clean close (~0 = none)
//           [184,192) nodes_at_close: leaves/nodes counted then (~0 = none)
//           [192,248) reserved (0)
//           [248,256) state checksum: CRC-32 of the uuid and bytes [128,248), zero-extended
//   lines 4-5  state copy 1: [256,384), the same fields
//   [384, 4096) reserved, zero
//
// A state change writes copy 0, persists it, then writes copy 1 and persists it; open takes
// the newer valid copy (docs/pool-format.md states why a torn or damaged copy loses nothing).
struct HeaderState {
  std::uint64_t sequence;
  std::uint64_t root;
  std::uint64_t clean_shutdown;
  std::uint64_t heap_high_water;
  std::uint64_t generation;
  std::uint32_t last_mode;
  std::uint32_t flags;
  std::uint64_t records_at_close;
  std::uint64_t nodes_at_close;
  std::uint64_t reserved0[7];
  std::uint64_t checksum;
};
// records_at_close / nodes_at_close when the last session did not count (or did not close).
inline constexpr std::uint64_t kNoCount = ~std::uint64_t{0};
// A pool Pool::create made whose index has not published its root yet. Pool::set_root clears
// it in the same state change that sets the root, so "root 0" without it means the root word
// was lost, and open refuses the pool as corrupted rather than building an empty index on top
// of the old blocks.
inline constexpr std::uint32_t kStateBuilding = 1;
// A pool upgraded from format version 1, whose index roots predate the layout stamp
// (src/index/common/root_stamp.h): an all-zero stamp is accepted only then.
inline constexpr std::uint32_t kStateUnstamped = 2;
static_assert(sizeof(HeaderState) == 128, "one state copy is two cache lines");
static_assert(offsetof(HeaderState, records_at_close) == 48 && offsetof(HeaderState, checksum) == 120);
inline constexpr std::size_t kStateChecksummedBytes = offsetof(HeaderState, checksum);

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
  // mutable: two copies of the state
  HeaderState state[2];
  std::uint8_t reserved3[kHeaderSize - 384];
};
static_assert(sizeof(PoolHeader) == kHeaderSize);
static_assert(std::is_standard_layout_v<PoolHeader> && std::is_trivially_copyable_v<PoolHeader>);
static_assert(offsetof(PoolHeader, kind) == 64, "line 1 starts with the layout");
static_assert(offsetof(PoolHeader, checksum) == 120);
static_assert(offsetof(PoolHeader, state) == 128, "state copies start on line 2");
inline constexpr std::size_t kChecksummedBytes = offsetof(PoolHeader, checksum);
// Where the version-1 mutable words were (for the refusal message and `pmpool upgrade`).
inline constexpr std::size_t kV1RootOffset = 128;

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
  std::uint64_t state_sequence = 0;
  std::uint32_t last_mode = 0;  // persistence mode + 1 of the last writer, 0 = unknown
  std::uint32_t state_flags = 0;  // kStateBuilding, kStateUnstamped
  std::uint64_t records_at_close = kNoCount;  // what the last clean close counted
  std::uint64_t nodes_at_close = kNoCount;
  std::string state_note;       // non-empty when one state copy was torn or damaged
};

std::uint64_t header_checksum(const PoolHeader& header);
std::uint64_t state_checksum(const PoolHeader& header, const HeaderState& state);

// The header's current state: the newer of the two valid copies. Torn or damaged copies are
// named in *note (may be null); both invalid, or two valid copies that no crash could leave
// (sequence numbers more than one apart, or equal with different contents), is corruption:
// returns false with the reason in *note.
bool read_state(const PoolHeader& header, HeaderState* out, std::string* note);
// Builds a copy of `state` with its checksum set (the caller writes it to both slots).
HeaderState sealed_state(const PoolHeader& header, HeaderState state);

// For tools and tests working on a pool image (at least kHeaderSize bytes): the current state
// (false if neither copy is valid), its root (0 then), and a state written to both copies with
// valid checksums (what a damaged but self-consistent header looks like to open).
bool image_state(const void* image, HeaderState* out);
std::uint64_t image_root(const void* image);
void set_image_state(void* image, const HeaderState& state);

}  // namespace pmindex::pm

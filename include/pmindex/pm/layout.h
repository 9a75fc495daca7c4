/// \file
/// The pool header's byte layout and the layout id that says which index made a pool.
/// docs/pool-format.md describes the format; this file is its source of truth.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace pmindex::pm {

/// How an index interprets its keys: 8-byte unsigned integers, doubles, or byte strings
/// compared by memcmp. Stored in the header and in every index root's layout stamp.
enum class KeyMode : std::uint32_t {
  u64 = 1,    ///< 8-byte unsigned integers, ordered numerically
  f64 = 2,    ///< doubles, ordered numerically (NaN refused)
  bytes = 3,  ///< byte strings of any length up to the index's limit, ordered by memcmp
};
/// "u64", "f64" or "bytes".
std::string_view to_string(KeyMode mode);

/// Which index, node size and key mode a pool holds. Two layouts must match exactly for a
/// pool to open: a pool made by another index, node size or key mode is refused.
struct Layout {
  std::string kind;            ///< index name, <= 15 bytes ("lbtree", "fptree", "reflist", ...)
  std::uint32_t node_size = 0; ///< bytes; 0 where the index has no fixed node size
  KeyMode key_mode = KeyMode::u64;  ///< how keys are interpreted
  std::uint32_t variant = 0;   ///< index-specific layout variant (e.g. leaf entries)

  bool operator==(const Layout&) const = default;  ///< every field equal
  std::string describe() const;  ///< "lbtree (node 256 B, key u64)"
};

/// The first 8 bytes of every pool file.
inline constexpr std::array<char, 8> kPoolMagic = {'P', 'M', 'I', 'N', 'D', 'E', 'X', '\0'};
/// The header format this build writes and opens (version-1 pools are refused; `pmpool
/// upgrade` converts them).
inline constexpr std::uint32_t kFormatVersion = 2;
inline constexpr std::uint32_t kArchX86_64 = 1;  ///< the header's arch value for x86-64
inline constexpr std::uint32_t kEndianTag = 0x01020304u;  ///< reads 0x04030201 on big-endian
inline constexpr std::uint64_t kCleanMark = 0x434c45414e5f5348ull;  ///< "HS_NAELC"
inline constexpr std::size_t kHeaderSize = 4096;  ///< bytes before the heap starts

/// Pool header, at offset 0 of every pool. All integers little-endian (checked by endian_tag).
///
///   line 0  [  0, 8)  magic "PMINDEX\0"
///           [  8,12)  format_version            [12,16) header_size (4096)
///           [ 16,20)  arch (1 = x86-64)         [20,24) endian_tag 0x01020304
///           [ 24,28)  cache_line (64)           [28,32) reserved (0)
///           [ 32,40)  pool_size                 [40,56) uuid
///           [ 56,64)  creation_time (s since epoch)
///   line 1  [ 64,80)  layout.kind (NUL padded)  [80,84) layout.node_size
///           [ 84,88)  layout.key_mode           [88,92) layout.variant  [92,96) reserved
///           [ 96,104) heap_offset               [104,120) reserved (0)
///           [120,128) checksum: CRC-32 of bytes [0,120), zero-extended
///   -- everything above is written once at creation; below are the mutable words, kept as two
///      copies of one 128-byte HeaderState, each with its own checksum (format version 2) --
///   lines 2-3  state copy 0:
///           [128,136) sequence: +1 at every state change
///           [136,144) root offset (0 = none)
///           [144,152) clean_shutdown (kCleanMark or 0)
///           [152,160) heap_high_water: no block at or above it was ever handed out
///           [160,168) generation: incremented at every open
///           [168,172) last_mode: persistence mode + 1 of the session that last wrote the pool
///           [172,176) flags: bit 0 = being built (created, no root published yet),
///                     bit 1 = upgraded from version 1 (index roots carry no layout stamp)
///           [176,184) records_at_close: records counted at the last clean close (~0 = none)
///           [184,192) nodes_at_close: leaves/nodes counted then (~0 = none)
///           [192,248) reserved (0)
///           [248,256) state checksum: CRC-32 of the uuid and bytes [128,248), zero-extended
///   lines 4-5  state copy 1: [256,384), the same fields
///   [384, 4096) reserved, zero
///
/// A state change writes copy 0, persists it, then writes copy 1 and persists it; open takes
/// the newer valid copy (docs/pool-format.md states why a torn or damaged copy loses nothing).
struct HeaderState {
  std::uint64_t sequence;          ///< +1 at every state change; the newer valid copy wins
  std::uint64_t root;              ///< offset of the index's root object, 0 = none yet
  std::uint64_t clean_shutdown;    ///< kCleanMark after a clean close, else 0
  std::uint64_t heap_high_water;   ///< no block at or above it was ever handed out
  std::uint64_t generation;        ///< incremented at every open (tags run-local lock words)
  std::uint32_t last_mode;         ///< persistence mode + 1 of the last writer, 0 = unknown
  std::uint32_t flags;             ///< kStateBuilding, kStateUnstamped
  std::uint64_t records_at_close;  ///< records counted at the last clean close, or kNoCount
  std::uint64_t nodes_at_close;    ///< leaves/nodes counted then, or kNoCount
  std::uint64_t reserved0[7];      ///< zero
  std::uint64_t checksum;          ///< CRC-32 of the uuid and the bytes above, zero-extended
};
/// records_at_close / nodes_at_close when the last session did not count (or did not close).
inline constexpr std::uint64_t kNoCount = ~std::uint64_t{0};
/// A pool Pool::create made whose index has not published its root yet. Pool::set_root clears
/// it in the same state change that sets the root, so "root 0" without it means the root word
/// was lost, and open refuses the pool as corrupted rather than building an empty index on top
/// of the old blocks.
inline constexpr std::uint32_t kStateBuilding = 1;
/// A pool upgraded from format version 1, whose index roots predate the layout stamp
/// (src/index/common/root_stamp.h): an all-zero stamp is accepted only then.
inline constexpr std::uint32_t kStateUnstamped = 2;
static_assert(sizeof(HeaderState) == 128, "one state copy is two cache lines");
static_assert(offsetof(HeaderState, records_at_close) == 48 && offsetof(HeaderState, checksum) == 120);
/// How many leading bytes of a HeaderState its checksum covers.
inline constexpr std::size_t kStateChecksummedBytes = offsetof(HeaderState, checksum);

/// The 4 KiB pool header at offset 0 of every pool; the byte map is drawn above HeaderState.
/// Lines 0-1 are written once at creation and covered by `checksum`; the mutable words live
/// in the two HeaderState copies.
struct PoolHeader {
  char magic[8];                 ///< kPoolMagic
  std::uint32_t format_version;  ///< kFormatVersion
  std::uint32_t header_size;     ///< kHeaderSize
  std::uint32_t arch;            ///< kArchX86_64
  std::uint32_t endian_tag;      ///< kEndianTag
  std::uint32_t cache_line;      ///< 64
  std::uint32_t reserved0;       ///< zero
  std::uint64_t pool_size;       ///< the pool's maximum size in bytes (the file may be shorter)
  std::uint8_t uuid[16];         ///< random at creation; part of every state checksum
  std::uint64_t creation_time;   ///< seconds since the epoch
  char kind[16];                 ///< Layout::kind, NUL padded
  std::uint32_t node_size;       ///< Layout::node_size
  std::uint32_t key_mode;        ///< Layout::key_mode
  std::uint32_t variant;         ///< Layout::variant
  std::uint32_t reserved1;       ///< zero
  std::uint64_t heap_offset;     ///< where the allocator's heap starts (kHeaderSize)
  std::uint64_t reserved2[2];    ///< zero
  std::uint64_t checksum;        ///< CRC-32 of bytes [0,120), zero-extended
  HeaderState state[2];          ///< the mutable words, two checksummed copies
  std::uint8_t reserved3[kHeaderSize - 384];  ///< zero
};
static_assert(sizeof(PoolHeader) == kHeaderSize);
static_assert(std::is_standard_layout_v<PoolHeader> && std::is_trivially_copyable_v<PoolHeader>);
static_assert(offsetof(PoolHeader, kind) == 64, "line 1 starts with the layout");
static_assert(offsetof(PoolHeader, checksum) == 120);
static_assert(offsetof(PoolHeader, state) == 128, "state copies start on line 2");
/// How many leading bytes of the header its checksum covers.
inline constexpr std::size_t kChecksummedBytes = offsetof(PoolHeader, checksum);
/// Where the version-1 mutable words were (for the refusal message and `pmpool upgrade`).
inline constexpr std::size_t kV1RootOffset = 128;

/// The header decoded for display (pmpool info) and checks.
struct HeaderInfo {
  std::uint32_t format_version = 0;   ///< PoolHeader::format_version
  std::uint64_t pool_size = 0;        ///< the pool's maximum size in bytes
  std::string uuid;             ///< 8-4-4-4-12 hex
  std::uint64_t creation_time = 0;    ///< seconds since the epoch
  Layout layout;                      ///< which index, node size and key mode
  std::uint64_t heap_offset = 0;      ///< where the heap starts
  std::uint64_t root = 0;             ///< the index's root object, 0 = none
  bool clean_shutdown = false;        ///< the last session closed cleanly
  std::uint64_t heap_high_water = 0;  ///< no block at or above it was ever handed out
  std::uint64_t generation = 0;       ///< incremented at every open
  std::uint64_t state_sequence = 0;   ///< the current state copy's sequence number
  std::uint32_t last_mode = 0;  ///< persistence mode + 1 of the last writer, 0 = unknown
  std::uint32_t state_flags = 0;  ///< kStateBuilding, kStateUnstamped
  std::uint64_t records_at_close = kNoCount;  ///< what the last clean close counted
  std::uint64_t nodes_at_close = kNoCount;     ///< the leaves/nodes counted then
  std::string state_note;       ///< non-empty when one state copy was torn or damaged
};

/// CRC-32 of the header's immutable bytes [0,120), zero-extended.
std::uint64_t header_checksum(const PoolHeader& header);
/// CRC-32 of the header's uuid and the state copy's bytes before its checksum.
std::uint64_t state_checksum(const PoolHeader& header, const HeaderState& state);

/// The header's current state: the newer of the two valid copies. Torn or damaged copies are
/// named in *note (may be null); both invalid, or two valid copies that no crash could leave
/// (sequence numbers more than one apart, or equal with different contents), is corruption:
/// returns false with the reason in *note.
bool read_state(const PoolHeader& header, HeaderState* out, std::string* note);
/// Builds a copy of `state` with its checksum set (the caller writes it to both slots).
HeaderState sealed_state(const PoolHeader& header, HeaderState state);

/// For tools and tests working on a pool image (at least kHeaderSize bytes): the current state
/// (false if neither copy is valid), its root (0 then), and a state written to both copies with
/// valid checksums (what a damaged but self-consistent header looks like to open).
bool image_state(const void* image, HeaderState* out);
/// The current state's root offset, 0 when neither copy is valid.
std::uint64_t image_root(const void* image);
/// Writes `state` (sealed with a valid checksum) to both copies of the image's header.
void set_image_state(void* image, const HeaderState& state);

}  // namespace pmindex::pm

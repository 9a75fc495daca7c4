// The layout stamp every PM index keeps in its root object (issue 18 item 5): which kind, node
// size, key mode and variant the index was built with, so a pool header whose layout id was
// changed with a valid checksum (u64 keys then read as doubles) is refused at open instead of
// being believed. One 16-byte struct shared by every index, embedded in each root object.
//
// Written once at create, inside the root object before it is persisted and published (so it
// needs no ordering of its own); checked read-only at every open against the header's layout.
// Thread safety: plain data, written before the root is published.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::index_common {

struct RootStamp {
  std::uint32_t kind_hash;  // FNV-1a of the kind name
  std::uint32_t node_size;
  std::uint16_t key_mode;
  std::uint16_t variant;
  std::uint32_t seal;       // kStampSeal ^ hash of the 12 bytes above: a zeroed stamp fails
};
static_assert(sizeof(RootStamp) == 16 && alignof(RootStamp) == 4,
              "fits the 4-byte-aligned tail of every root object");
static_assert(std::is_standard_layout_v<RootStamp> && std::is_trivially_copyable_v<RootStamp>);

inline constexpr std::uint32_t kStampSeal = 0x53544d50u;  // "PMTS"

inline std::uint32_t fnv1a(const void* data, std::size_t n, std::uint32_t h = 2166136261u) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

inline std::uint32_t stamp_seal(const RootStamp& s) {
  return kStampSeal ^ fnv1a(&s, offsetof(RootStamp, seal));
}

inline RootStamp make_root_stamp(const pm::Layout& layout) {
  RootStamp s{};
  s.kind_hash = fnv1a(layout.kind.data(), layout.kind.size());
  s.node_size = layout.node_size;
  s.key_mode = static_cast<std::uint16_t>(layout.key_mode);
  s.variant = static_cast<std::uint16_t>(layout.variant);
  s.seal = stamp_seal(s);
  return s;
}

// The stamp against the pool header's layout id (already checked against what the caller
// asked for). A pool upgraded from format version 1 has no stamps (kStateUnstamped), so its
// all-zero stamp is accepted; any other damage or mismatch is corruption.
inline Status check_root_stamp(const RootStamp& stamp, const pm::Pool& pool) {
  const pm::Layout& want = pool.info().layout;
  const RootStamp zero{};
  const bool unstamped = (pool.info().state_flags & pm::kStateUnstamped) != 0;
  if (unstamped && std::memcmp(&stamp, &zero, sizeof zero) == 0) return Status::Ok();
  if (stamp.seal != stamp_seal(stamp))
    return pool.error(Code::corrupted, "the index root's layout stamp is damaged");
  const RootStamp expect = make_root_stamp(want);
  if (stamp.kind_hash == expect.kind_hash && stamp.node_size == expect.node_size &&
      stamp.key_mode == expect.key_mode && stamp.variant == expect.variant)
    return Status::Ok();
  std::string have = "node " + std::to_string(stamp.node_size) + " B, key " +
                     std::string(pm::to_string(static_cast<pm::KeyMode>(stamp.key_mode)));
  if (stamp.kind_hash != expect.kind_hash) have = "another index kind, " + have;
  return pool.error(Code::corrupted,
                    "the pool header says " + want.describe() + " but the index root was built as " +
                        have + " (variant " + std::to_string(stamp.variant) +
                        "): header or root damaged, refusing to read the data with the wrong layout");
}

}  // namespace pmindex::index_common

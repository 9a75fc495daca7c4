// part's persistent layout: the root object, byte offsets drawn and asserted. The trie's
// nodes and records are the shared core's (src/index/common/art/art_node.h); the index: part.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/root_stamp.h"

namespace pmindex::part {

// Root object, 64 B (one line):
//   [ 0, 8) magic "PARTREE1"   [ 8,16) top: the tree's root child word (0 = empty)
//   [16,24) lock: NodeLock word guarding `top` (volatile, art_node.h)
//   [24,28) max_key_size       [28,32) max_value_size
//   [32,48) layout stamp       [48,64) reserved (0)
struct Root {
  std::uint64_t magic;
  std::uint64_t top;
  std::uint64_t lock;
  std::uint32_t max_key_size;
  std::uint32_t max_value_size;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[16];
};
static_assert(sizeof(Root) == 64 && offsetof(Root, top) == 8 && offsetof(Root, lock) == 16 &&
              offsetof(Root, max_key_size) == 24);
static_assert(offsetof(Root, stamp) == 32, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);
inline constexpr std::uint64_t kRootMagic = 0x3145455254524150ull;  // "PARTREE1"

}  // namespace pmindex::part

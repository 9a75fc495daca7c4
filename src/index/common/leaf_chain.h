// Recovery helper: walks a PM leaf chain without trusting it. Every offset is bounds- and
// alignment-checked through Pool::checked, and a visited bitmap (one bit per possible leaf
// position) rules out cycles, so a corrupted pool yields Code::corrupted, never a hang or a
// fault. The index supplies how to read a leaf's next pointer.
//
// Thread safety: single-threaded (recovery, verify).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::index_common {

// Collects the chain from `head` into *leaves. next(leaf_offset) returns the successor offset
// (0 at the end); leaf_bytes/align describe a leaf.
template <class Next>
Status walk_leaf_chain(const pm::Pool& pool, std::uint64_t head, std::size_t leaf_bytes,
                       std::size_t align, Next next, std::vector<std::uint64_t>* leaves) {
  leaves->clear();
  std::vector<bool> visited(pool.size() / align + 1, false);
  std::uint64_t off = head;
  while (off != 0) {
    if (pool.checked<char>(off, leaf_bytes, align) == nullptr)
      return pool.error(Code::corrupted, "leaf offset " + std::to_string(off) +
                                             " is out of bounds or misaligned");
    if (visited[off / align])
      return pool.error(Code::corrupted,
                        "leaf chain has a cycle at offset " + std::to_string(off));
    visited[off / align] = true;
    leaves->push_back(off);
    off = next(off);
  }
  return Status::Ok();
}

}  // namespace pmindex::index_common

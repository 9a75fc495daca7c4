// Per-leaf DRAM versions for PM leaves: a side array indexed by leaf pool offset / 256 (the PM
// leaf header has no room for a version). Leaves are 256 B aligned, so each leaf owns the slot
// of its first 256 B block. Rebuilt (all zero) at every open.
//
// Thread safety: the array is fixed at construction; each slot is a VersionLock (see there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "index/common/version_lock.h"

namespace pmindex::index_common {

class LeafVersions {
 public:
  static constexpr std::size_t kGranule = 256;
  explicit LeafVersions(std::size_t pool_bytes)
      : n_(pool_bytes / kGranule + 1), slots_(new VersionLock[n_]) {}
  VersionLock& at(std::uint64_t leaf_offset) const { return slots_[leaf_offset / kGranule]; }
  std::uint64_t dram_bytes() const { return n_ * sizeof(VersionLock); }

 private:
  std::size_t n_;
  std::unique_ptr<VersionLock[]> slots_;
};

}  // namespace pmindex::index_common

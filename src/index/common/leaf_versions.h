// Per-leaf DRAM versions for PM leaves: a side array indexed by leaf pool offset / 256 (the PM
// leaf header has no room for a version). Leaves are 256 B aligned, so each leaf owns the slot
// of its first 256 B block. Rebuilt (all zero) at every open. The array is anonymous memory
// advised for transparent huge pages: every operation touches one random slot of it, and with
// 4 KiB pages that is a TLB miss on top of the cache miss.
//
// Thread safety: the array is fixed at construction; each slot is a sync::OptimisticLock used as
// olc.h describes (recycled leaves restart above every earlier word).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>

#include <sys/mman.h>

#include "index/common/olc.h"

namespace pmindex::index_common {

class LeafVersions {
 public:
  static constexpr std::size_t kGranule = 256;
  explicit LeafVersions(std::size_t pool_bytes)
      : n_(pool_bytes / kGranule + 1), bytes_(map_bytes(n_)), slots_(map(bytes_)) {}
  ~LeafVersions() { munmap(slots_, bytes_); }
  LeafVersions(const LeafVersions&) = delete;
  LeafVersions& operator=(const LeafVersions&) = delete;
  OptimisticLock& at(std::uint64_t leaf_offset) const { return slots_[leaf_offset / kGranule]; }
  // readLockOrRestart on the leaf's version: nullopt if the leaf is obsolete (restart).
  std::optional<std::uint64_t> read(std::uint64_t leaf_offset) const {
    bool restart = false;
    const std::uint64_t v = at(leaf_offset).readLockOrRestart(restart);
    if (restart) return std::nullopt;
    return v;
  }
  // checkOrRestart: true if no writer ran on the leaf since read() returned `version`.
  bool unchanged(std::uint64_t leaf_offset, std::uint64_t version) const {
    bool restart = false;
    at(leaf_offset).checkOrRestart(version, restart);
    return !restart;
  }
  // upgradeToWriteLockOrRestart from a version read() returned.
  bool upgrade(std::uint64_t leaf_offset, std::uint64_t version) const {
    bool restart = false;
    at(leaf_offset).upgradeToWriteLockOrRestart(version, restart);
    return !restart;
  }
  bool is_locked(std::uint64_t leaf_offset) const {
    return OptimisticLock::isLocked(at(leaf_offset).peek());
  }
  std::uint64_t dram_bytes() const { return n_ * sizeof(OptimisticLock); }

 private:
  static constexpr std::size_t kHuge = std::size_t{2} << 20;
  static std::size_t map_bytes(std::size_t n) {
    return (n * sizeof(OptimisticLock) + kHuge - 1) / kHuge * kHuge;
  }
  // Zero-filled anonymous memory is an array of unlocked version-0 words (OptimisticLock is an
  // implicit-lifetime, trivially copyable 8-byte word).
  static OptimisticLock* map(std::size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    (void)madvise(p, bytes, MADV_HUGEPAGE);  // a hint; 4 KiB pages work too
    return static_cast<OptimisticLock*>(p);
  }

  std::size_t n_;
  std::size_t bytes_;
  OptimisticLock* slots_;
};

}  // namespace pmindex::index_common

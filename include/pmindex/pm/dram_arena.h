/// \file
/// A DRAM arena for the DRAM-resident parts of hybrid indexes (inner nodes, metadata), backed
/// by transparent huge pages (madvise MADV_HUGEPAGE on 2 MiB-aligned regions) so that random
/// accesses to inner nodes pay huge-page TLB costs, as the PM pool does on a huge=always tmpfs.
///
/// Blocks are 64 B aligned (cache-line aligned), sizes rounded up to 64 B, recycled through
/// per-size free lists. Nothing here is persistent: the arena is rebuilt at recovery.
///
/// Thread safety: allocate/deallocate are thread-safe (one mutex; inner-node allocation is rare
/// next to operations). bytes_in_use()/bytes_reserved() are safe to call any time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace pmindex::pm {

/// See the file comment: 64 B-aligned DRAM blocks from huge-page regions, per-size free lists.
class DramArena {
 public:
  static constexpr std::size_t kRegionSize = std::size_t{2} << 20;  ///< one huge page per region
  static constexpr std::size_t kAlign = 64;                          ///< every block's alignment

  DramArena() = default;
  ~DramArena();
  DramArena(const DramArena&) = delete;
  DramArena& operator=(const DramArena&) = delete;

  /// Returns a 64 B aligned block of at least `bytes`, or nullptr if the system is out of memory.
  void* allocate(std::size_t bytes);
  /// Returns a block; `bytes` is the size that was asked for.
  void deallocate(void* p, std::size_t bytes);
  /// Releases every block at once (recovery rebuilds from scratch).
  void reset();

  /// Bytes in allocated blocks (rounded sizes); relaxed: a statistic.
  std::uint64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  /// Bytes of the regions mapped so far; relaxed: a statistic.
  std::uint64_t bytes_reserved() const { return reserved_.load(std::memory_order_relaxed); }
  /// Whether the kernel accepted MADV_HUGEPAGE for the regions (reported by benchmarks).
  bool huge_pages() const { return huge_pages_.load(std::memory_order_relaxed); }

 private:
  struct Region {
    char* base;
    std::size_t size;
  };
  std::mutex mu_;
  std::vector<Region> regions_;
  char* bump_ = nullptr;
  char* bump_end_ = nullptr;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::atomic<std::uint64_t> in_use_{0};
  std::atomic<std::uint64_t> reserved_{0};
  std::atomic<bool> huge_pages_{false};
};

}  // namespace pmindex::pm

/// \file
/// The pool allocator: size classes, thread caches, and crash safety by reachability.
///
/// Ownership contract (docs/allocator.md):
///   * A block becomes owned when the index publishes its offset with a failure-atomic 8-byte
///     store (pm::publish) that is persisted. Until then a crash simply forgets it.
///   * Nothing about allocation is persisted per call. The only persistent allocator state is
///     the heap high-water mark in the pool header, raised (and persisted) in large steps
///     before a block above it is handed out: no block at or above it was ever allocated.
///     The heap spans the pool's maximum size; before the mark rises past the file's end the
///     pool grows (Pool::grow), and a failure to grow is pool_full.
///   * After a restart the index enumerates the blocks reachable from its root
///     (mark_reachable) and calls finish_recovery(); every other byte below the high-water
///     mark is free again. Leaks are impossible by construction.
///   * Start-now mode (begin_start_now): allocation is served at and above the high-water mark
///     immediately; the space below it is reclaimed once the index's (background) reachability
///     walk calls finish_recovery(). Indexes with instant recovery (APEX) use this.
///
/// Blocks are NOT zeroed. An index that relies on empty slots zeroes and persists a block
/// (pm::zero + pm::persist) before publishing it, or stale contents come back after a crash.
///
/// Size classes: 16 and 32 B (sub-line classes), then multiples of 64 B from 64 B to 16 MiB: 64,
/// 128, 192, then multiples of 256 B (256 ... 1024 in 256 B steps, then four classes per power of
/// two). Blocks of 256 B or more are 256 B aligned; 64/128/192 B blocks are 64 B aligned and never
/// straddle a 256 B XPLine; a 16 (32) B block is 16 (32) B aligned inside a 64 B-aligned carrier
/// line taken from the 64 B class, so it never straddles a cache line. So a block touches no more
/// cache lines or XPLines than its size requires. Callers may rely on 16 B alignment only, and
/// on 64 B alignment only for requests above 32 B.
///
/// Free blocks go back to their class list. When an allocation finds no extent to carve from and
/// blocks were freed since the last time, a reclaim pass merges every free block in the central
/// lists (and the calling thread's cache) with its free neighbours: whole 256 B units become
/// extents again (so a heap filled with small blocks and emptied serves one request as big as
/// the heap), and a carrier whose sub-blocks are all free becomes a 64 B block (or part of an
/// extent). Carriers are kept in their class until then. Bound: pool_full is returned only when,
/// after that pass, no extent, line or free block of the class fits; free space it cannot use
/// is what sits in other threads' caches (at most 64 blocks per class per thread; none after
/// that thread's release_thread_cache()) and free pieces of lines/units that still hold a live
/// block (docs/allocator.md).
///
/// Thread safety: allocate/deallocate are thread-safe; each thread has a small per-class cache
/// so two threads allocate without contending. mark_reachable may be called from several
/// threads (parallel recovery); begin_recovery/finish_recovery from one. During a start-now
/// recovery an index frees a recovered block only after it has marked it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pmindex/status.h"

namespace pmindex::pm {

class Pool;

/// One size class's counts (Allocator::stats()).
struct SizeClassStats {
  std::size_t block_size = 0;       ///< the class's block size in bytes
  std::uint64_t blocks_in_use = 0;  ///< blocks allocated and not freed
  std::uint64_t blocks_free = 0;  ///< in the central free list (thread caches not counted)
};

/// The allocator's counts, for footprints and reports (Allocator::stats()).
struct AllocatorStats {
  std::uint64_t heap_bytes = 0;       ///< bytes the heap can ever hand out
  std::uint64_t bytes_reserved = 0;   ///< bytes carved from the heap and not merged back yet
  std::uint64_t bytes_in_use = 0;     ///< bytes in allocated blocks (class sizes)
  /// The same blocks counted at the sizes they were requested with (the survey's Table 3
  /// measure; blocks found at recovery count at the size the index marked them with).
  std::uint64_t bytes_requested = 0;
  std::uint64_t allocations = 0;      ///< allocate() calls that succeeded in this session
  std::uint64_t frees = 0;            ///< deallocate() calls in this session
  std::vector<SizeClassStats> classes;  ///< classes with any activity
};

/// The pool's allocator (the file comment states its crash-safety contract).
class Allocator {
 public:
  static constexpr std::size_t kMinBlock = 16;  ///< smallest class; every block is 16 B aligned
  static constexpr std::size_t kLine = 64;      ///< carrier of the 16 and 32 B classes
  static constexpr std::size_t kMaxBlock = std::size_t{16} << 20;  ///< largest class (16 MiB)
  static constexpr std::size_t kXPLineAlign = 256;  ///< alignment of blocks of 256 B or more

  /// Size class of a request (0-based); requests above kMaxBlock have none.
  static int class_of(std::size_t bytes);
  static std::size_t class_size(int cls);  ///< block size of class `cls`
  static int num_classes();                ///< how many classes there are

  /// An allocator for the pool's heap [heap_begin, heap_end) (the Pool makes it; follow with
  /// init_empty() or begin_recovery()).
  Allocator(Pool& pool, std::uint64_t heap_begin, std::uint64_t heap_end);
  ~Allocator();                                   ///< frees its DRAM state only
  Allocator(const Allocator&) = delete;             ///< one per pool
  Allocator& operator=(const Allocator&) = delete;  ///< one per pool

  /// Returns the offset of a block of at least `bytes`, or 0 with Code::pool_full /
  /// Code::invalid_argument in *code. Not zeroed.
  std::uint64_t allocate(std::size_t bytes, Code* code = nullptr);
  /// Returns a block. `bytes` is the size that was requested (sized deallocation).
  void deallocate(std::uint64_t offset, std::size_t bytes);
  /// Moves every block in the calling thread's cache to the central lists, where any thread's
  /// allocation (and its reclaim pass) can reach it. For a helper thread that allocates and
  /// frees in bursts (a background merge): otherwise up to 2 x batch blocks per class stay
  /// out of the other threads' reach until the helper runs again. Thread-safe.
  void release_thread_cache();

  // --- recovery -----------------------------------------------------------------------------
  /// A fresh pool: the whole heap is free.
  void init_empty();
  /// Start of recovery, at open before any thread allocates: nothing is free until
  /// finish_recovery(). With start_now, allocation is served at and above the persisted
  /// high-water mark meanwhile.
  void begin_recovery(bool start_now);
  /// Declares one reachable block. Returns Code::corrupted if it lies outside the heap or is
  /// misaligned for its class (a 16 B block not 16 B aligned, a 32 B one not 32 B aligned, ...).
  /// Overlap with another marked block (the same block twice, a 32 B block over a marked 16 B
  /// one, a 64 B block over a carrier line with a marked sub-block, ...) is found by
  /// finish_recovery, which sorts the marks.
  Code mark_reachable(std::uint64_t offset, std::size_t bytes);
  /// Everything below the high-water mark that was not marked becomes free. If any mark was
  /// invalid or two marks overlap, returns a corrupted Status naming the first bad block and
  /// changes nothing: no block is freed, recovering() stays true, a second call returns the
  /// same error, and begin_recovery() starts over.
  Status finish_recovery();
  /// True between begin_recovery() and a successful finish_recovery(). acquire: pairs with
  /// finish_recovery's release, so a thread that sees false sees the rebuilt free lists.
  bool recovering() const { return recovering_.load(std::memory_order_acquire); }

  /// Counts of the heap and its classes now.
  AllocatorStats stats() const;
  std::uint64_t heap_begin() const { return heap_begin_; }  ///< first heap offset
  std::uint64_t heap_end() const { return heap_end_; }      ///< end of the heap (pool maximum)

 private:
  struct ThreadCache;
  struct Central;
  ThreadCache& cache();
  std::uint64_t carve(std::size_t block, Code* code);  ///< from free extents / bump, under mu_
  bool refill(int cls, ThreadCache& tc, Code* code);
  bool fresh_blocks(int cls, ThreadCache& tc, Code* code);  ///< new blocks for tc, under mu_
  std::uint64_t take_line(Code* code);                      ///< a 64 B carrier, under mu_
  bool reclaim(ThreadCache& tc);                            ///< merge free blocks, under mu_
  bool raise_high_water(std::uint64_t end);  ///< false: the pool cannot grow to `end`

  Pool& pool_;
  const std::uint64_t heap_begin_;
  const std::uint64_t heap_end_;
  std::unique_ptr<Central> central_;
  std::atomic<bool> recovering_{false};
};

}  // namespace pmindex::pm

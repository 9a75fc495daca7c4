// The pool allocator: size classes, thread caches, and crash safety by reachability.
//
// Ownership contract (docs/allocator.md):
//   * A block becomes owned when the index publishes its offset with a failure-atomic 8-byte
//     store (pm::publish) that is persisted. Until then a crash simply forgets it.
//   * Nothing about allocation is persisted per call. The only persistent allocator state is
//     the heap high-water mark in the pool header, raised (and persisted) in large steps
//     before a block above it is handed out: no block at or above it was ever allocated.
//   * After a restart the index enumerates the blocks reachable from its root
//     (mark_reachable) and calls finish_recovery(); every other byte below the high-water
//     mark is free again. Leaks are impossible by construction.
//   * Start-now mode (begin_start_now): allocation is served at and above the high-water mark
//     immediately; the space below it is reclaimed once the index's (background) reachability
//     walk calls finish_recovery(). Indexes with instant recovery (APEX) use this.
//
// Blocks are NOT zeroed. An index that relies on empty slots zeroes and persists a block
// (pm::zero + pm::persist) before publishing it, or stale contents come back after a crash.
//
// Size classes are multiples of 64 B from 64 B to 16 MiB: 64, 128, 192, then multiples of
// 256 B (256 ... 1024 in 256 B steps, then four classes per power of two). Blocks of 256 B or
// more are 256 B aligned; 64/128/192 B blocks never straddle a 256 B XPLine. So a block
// touches no more cache lines or XPLines than its size requires.
//
// Thread safety: allocate/deallocate are thread-safe; each thread has a small per-class cache
// so two threads allocate without contending. mark_reachable may be called from several
// threads (parallel recovery); begin_recovery/finish_recovery from one. During a start-now
// recovery an index frees a recovered block only after it has marked it.
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

struct SizeClassStats {
  std::size_t block_size = 0;
  std::uint64_t blocks_in_use = 0;
  std::uint64_t blocks_free = 0;  // in the central free list (thread caches not counted)
};

struct AllocatorStats {
  std::uint64_t heap_bytes = 0;       // bytes the heap can ever hand out
  std::uint64_t bytes_reserved = 0;   // bytes carved from the heap so far (high-water usage)
  std::uint64_t bytes_in_use = 0;     // bytes in allocated blocks (class sizes)
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::vector<SizeClassStats> classes;  // classes with any activity
};

class Allocator {
 public:
  static constexpr std::size_t kMinBlock = 64;
  static constexpr std::size_t kMaxBlock = std::size_t{16} << 20;
  static constexpr std::size_t kXPLineAlign = 256;

  // Size class of a request (0-based); requests above kMaxBlock have none.
  static int class_of(std::size_t bytes);
  static std::size_t class_size(int cls);
  static int num_classes();

  Allocator(Pool& pool, std::uint64_t heap_begin, std::uint64_t heap_end);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns the offset of a block of at least `bytes`, or 0 with Code::pool_full /
  // Code::invalid_argument in *code. Not zeroed.
  std::uint64_t allocate(std::size_t bytes, Code* code = nullptr);
  // Returns a block. `bytes` is the size that was requested (sized deallocation).
  void deallocate(std::uint64_t offset, std::size_t bytes);

  // --- recovery -----------------------------------------------------------------------------
  // A fresh pool: the whole heap is free.
  void init_empty();
  // Start of recovery, at open before any thread allocates: nothing is free until
  // finish_recovery(). With start_now, allocation is served at and above the persisted
  // high-water mark meanwhile.
  void begin_recovery(bool start_now);
  // Declares one reachable block. Returns Code::corrupted if it lies outside the heap, is
  // misaligned for its class or overlaps a block already marked (checked in finish_recovery).
  Code mark_reachable(std::uint64_t offset, std::size_t bytes);
  // Everything below the high-water mark that was not marked becomes free. Returns a
  // corrupted Status naming the first bad block if any mark was invalid.
  Status finish_recovery();
  bool recovering() const { return recovering_.load(std::memory_order_acquire); }

  AllocatorStats stats() const;
  std::uint64_t heap_begin() const { return heap_begin_; }
  std::uint64_t heap_end() const { return heap_end_; }

 private:
  struct ThreadCache;
  struct Central;
  ThreadCache& cache();
  std::uint64_t carve(std::size_t block, Code* code);  // from free extents / bump, under mu_
  bool refill(int cls, ThreadCache& tc, Code* code);
  void raise_high_water(std::uint64_t end);

  Pool& pool_;
  const std::uint64_t heap_begin_;
  const std::uint64_t heap_end_;
  std::unique_ptr<Central> central_;
  std::atomic<bool> recovering_{false};
};

}  // namespace pmindex::pm

// Where the trie core's nodes and records live: the policy parameter of art::Tree.
//   PmPlacement    blocks from the pool's allocator; a reference is a pool offset; writes go
//                  through the one persistence API (pm::copy / publish / persist).
//   DramPlacement  blocks from a pm::DramArena (THP-backed); a reference is an address; no
//                  persistence work at all.
// A placement provides:
//   kPersistent                     whether the tree must order and persist its writes
//   at<T>(ref), ref_of(ptr)         reference <-> address
//   allocate(bytes, &code), deallocate(ref, bytes)
//   in_bounds(ref, bytes, align)    first-touch and recovery checks (DRAM: always true)
//   write(dst, src, n)              into a block not yet reachable (or under its lock)
//   publish(word*, v)               failure-atomic 8-byte store, release order
//   cas(word*, expected&, v)        8-byte compare-and-swap, acq_rel (lock words)
//   persist(p, n)                   write back and fence (no-op for DRAM)
// Volatile words kept in PM (lock words, accelerators, counts) are written through write /
// publish / cas too, never persisted: in the tracing flavour the crash simulator then sees
// every store to the pool (its bypass check), and after a crash their contents are ignored
// (art_node.h: run-tagged lock words; metadata rebuilt at first touch).
//
// Thread safety: as the underlying allocator (both thread-safe).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "pmindex/pm/dram_arena.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::art {

struct PmPlacement {
  static constexpr bool kPersistent = true;
  pm::Pool* pool = nullptr;

  template <class T>
  T* at(std::uint64_t ref) const { return pool->at<T>(ref); }
  std::uint64_t ref_of(const void* p) const { return pool->offset_of(p); }
  std::uint64_t allocate(std::size_t bytes, Code* code) const {
    return pool->allocator().allocate(bytes, code);
  }
  void deallocate(std::uint64_t ref, std::size_t bytes) const {
    pool->allocator().deallocate(ref, bytes);
  }
  bool in_bounds(std::uint64_t ref, std::size_t bytes, std::size_t align) const {
    return ref % align == 0 && pool->in_heap(ref, bytes);
  }
  static void write(void* dst, const void* src, std::size_t n) { pm::copy(dst, src, n); }
  static void publish(std::uint64_t* word, std::uint64_t v) { pm::publish(word, v); }
  static bool cas(std::uint64_t* word, std::uint64_t& expected, std::uint64_t v) {
    return pm::cas(word, expected, v);
  }
  static void persist(const void* p, std::size_t n) { pm::persist(p, n); }
};

struct DramPlacement {
  static constexpr bool kPersistent = false;
  pm::DramArena* arena = nullptr;

  template <class T>
  T* at(std::uint64_t ref) const { return reinterpret_cast<T*>(ref); }
  std::uint64_t ref_of(const void* p) const { return reinterpret_cast<std::uint64_t>(p); }
  std::uint64_t allocate(std::size_t bytes, Code* code) const {
    void* p = arena->allocate(bytes);
    *code = p == nullptr ? Code::pool_full : Code::ok;
    return reinterpret_cast<std::uint64_t>(p);
  }
  void deallocate(std::uint64_t ref, std::size_t bytes) const {
    arena->deallocate(reinterpret_cast<void*>(ref), bytes);
  }
  bool in_bounds(std::uint64_t ref, std::size_t, std::size_t align) const {
    return ref != 0 && ref % align == 0;
  }
  static void write(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
  // release: a reader that acquire-loads the word sees the block written before it.
  static void publish(std::uint64_t* word, std::uint64_t v) {
    std::atomic_ref<std::uint64_t>(*word).store(v, std::memory_order_release);
  }
  // acq_rel on success: a lock holder sees the previous holder's writes and its own later
  // writes stay after the lock (as pm::cas). acquire on failure: the caller re-reads.
  static bool cas(std::uint64_t* word, std::uint64_t& expected, std::uint64_t v) {
    return std::atomic_ref<std::uint64_t>(*word).compare_exchange_strong(
        expected, v, std::memory_order_acq_rel, std::memory_order_acquire);
  }
  static void persist(const void*, std::size_t) {}
};

}  // namespace pmindex::art

// Variable-length byte records in PM, for keys (KeyType::bytes) and out-of-line values of the
// hybrid indexes: an 8-byte leaf slot holds the pool offset of a record.
//
// Record (allocator block of 8 + length bytes, class-rounded: 16 B for keys of up to 8 bytes,
// 32 B up to 24, then 64 B and up; 16 B aligned only; never modified once published):
//   [0, 8)          length (u64, little-endian)
//   [8, 8 + length) the bytes (any bytes, NUL included; length 0 is the empty key)
//
// Protocol (each index cites these in its own PROTOCOL.md):
//   K1 allocate, write length and bytes, persist the whole record (unused space: unreachable)
//   K2 the index publishes the offset in a slot and commits it with its own NAW
//   K3 after the slot is gone (its NAW persisted) the index frees the record; a crash in
//      between leaves it unreachable and recovery's reachability walk frees it.
//
// Thread safety: records are immutable between K1 and K3, so any thread may read one it found
// through a validated slot. A reader that found it through a slot that later fails validation
// may read a recycled block: read() bounds-checks the length against the pool, so such a read
// yields garbage that validation then discards, never a fault.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::index_common {

inline constexpr std::size_t kRecordHeader = 8;

inline std::size_t record_bytes(std::size_t length) { return kRecordHeader + length; }

// K1 into a block of record_bytes(bytes.size()) the caller allocated (an index that
// serialises its allocator calls under its own lock allocates, then fills outside it).
inline void fill_record(pm::Pool& pool, std::uint64_t off, std::string_view bytes) {
  char* p = pool.at<char>(off);
  pm::store(reinterpret_cast<std::uint64_t*>(p), std::uint64_t{bytes.size()});
  if (!bytes.empty()) pm::copy(p + kRecordHeader, bytes.data(), bytes.size());
  pm::persist(p, record_bytes(bytes.size()));
}

// K1. Returns 0 with *code on failure.
inline std::uint64_t write_record(pm::Pool& pool, std::string_view bytes, Code* code) {
  const std::uint64_t off = pool.allocator().allocate(record_bytes(bytes.size()), code);
  if (off == 0) return 0;
  fill_record(pool, off, bytes);
  return off;
}

// The record's bytes, or nullopt-like empty+false if the offset/length is impossible.
inline bool read_record(const pm::Pool& pool, std::uint64_t off, std::size_t max_len,
                        std::string_view* out) {
  const std::uint64_t* len_word = pool.checked<std::uint64_t>(off, kRecordHeader, 8);
  if (len_word == nullptr) return false;
  const std::uint64_t len =
      std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(len_word))
          .load(std::memory_order_relaxed);
  if (len > max_len || !pool.in_heap(off, record_bytes(len))) return false;
  *out = std::string_view(pool.at<const char>(off + kRecordHeader), len);
  return true;
}

// K3 (the caller guarantees the record is unreachable and persisted so).
inline void free_record(pm::Pool& pool, std::uint64_t off) {
  const std::uint64_t len = *pool.at<const std::uint64_t>(off);
  pool.allocator().deallocate(off, record_bytes(len));
}

// Recovery: checks a record found in a slot and declares it reachable.
inline Code mark_record(pm::Pool& pool, std::uint64_t off, std::size_t max_len) {
  std::string_view bytes;
  if (!read_record(pool, off, max_len, &bytes)) return Code::corrupted;
  return pool.allocator().mark_reachable(off, record_bytes(bytes.size()));
}

// One-byte fingerprints (FPTree / LB+-Tree): a hash of the WHOLE key.
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
inline std::uint8_t fingerprint_word(std::uint64_t key_word) {
  return static_cast<std::uint8_t>(mix64(key_word) >> 56);
}
inline std::uint8_t fingerprint_bytes(std::string_view key) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a finaliser for the top byte
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
  return static_cast<std::uint8_t>(mix64(h ^ key.size()) >> 56);
}

}  // namespace pmindex::index_common

// Key modes of the hybrid indexes in one place: how a search key becomes an 8-byte leaf "key
// word" and a fingerprint, and how key words and inner-node separator words compare.
//   u64 / f64: the key word is the key's 8 big-endian bytes read as an integer (so integer
//              order is memcmp order); the separator word is the key word itself.
//   bytes:     the key word is the pool offset of a PM key record (pm_record.h); the separator
//              word points to an immutable DRAM copy (separator_store.h).
// Written for FPTree (issue 6); generic, so LB+-Tree's equivalent member functions can move
// here later.
//
// Thread safety: const after configure(); reading a key record found through an unvalidated
// slot is safe (read_record bounds-checks) and the caller discards the result on a failed
// validation.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "index/common/pm_record.h"
#include "index/common/separator_store.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::index_common {

class KeyCodec {
 public:
  // A search key prepared once per operation.
  struct Probe {
    std::uint64_t word = 0;  // integer modes: the key word
    std::string_view bytes;  // the key as given (every mode)
    std::uint8_t fp = 0;     // fingerprint of the whole key
  };

  void configure(const pm::Pool* pool, KeyType mode, std::uint32_t max_key) {
    pool_ = pool;
    mode_ = mode;
    max_key_ = mode == KeyType::bytes ? max_key : 8;
  }
  bool bytes_mode() const { return mode_ == KeyType::bytes; }
  std::uint32_t max_key() const { return max_key_; }

  Code check(std::string_view key) const {
    if (bytes_mode()) return key.size() > max_key_ ? Code::key_too_large : Code::ok;
    if (key.size() != 8) return Code::invalid_argument;
    if (mode_ == KeyType::f64 && std::isnan(decode_f64(key))) return Code::invalid_argument;
    return Code::ok;
  }

  // Callers pass checked keys, except scans resuming from an arbitrary start: a short start
  // key is padded with zero bytes (the smallest 8-byte key with that prefix).
  Probe probe(std::string_view key) const {
    Probe p;
    p.bytes = key;
    if (bytes_mode()) {
      p.fp = fingerprint_bytes(key);
      return p;
    }
    std::uint64_t be = 0;  // big-endian bytes; a short key is padded with zero bytes
    if (key.size() == 8) [[likely]] {
      std::memcpy(&be, key.data(), 8);  // one load (a variable-length copy is a call)
    } else if (!key.empty()) {  // an empty view may have a null data(): memcpy's is nonnull
      std::memcpy(&be, key.data(), key.size() < 8 ? key.size() : 8);
    }
    p.word = __builtin_bswap64(be);
    p.fp = fingerprint_word(p.word);
    return p;
  }

  // probe() of an integer-mode key of exactly 8 bytes (a checked key): inline, no mode test.
  static Probe probe_word(std::string_view key) {
    Probe p;
    p.bytes = key;
    std::uint64_t be;
    std::memcpy(&be, key.data(), 8);
    p.word = __builtin_bswap64(be);
    p.fp = fingerprint_word(p.word);
    return p;
  }

  // Leaf side -----------------------------------------------------------------------------
  bool matches(std::uint64_t key_word, const Probe& p) const {
    if (!bytes_mode()) return key_word == p.word;
    std::string_view stored;
    return read_record(*pool_, key_word, max_key_, &stored) && stored == p.bytes;
  }
  // The key bytes of a key word (memcmp order); empty if a bytes record is unreadable.
  std::string key_bytes(std::uint64_t key_word) const {
    if (!bytes_mode()) return encode_u64(key_word);
    std::string_view stored;
    return read_record(*pool_, key_word, max_key_, &stored) ? std::string(stored)
                                                           : std::string();
  }
  // Key order of two stored key words (recovery's leaf summaries, a split's side for the new
  // key); in bytes mode both records must be readable, an unreadable one compares as not less.
  bool key_word_less(std::uint64_t a, std::uint64_t b) const {
    if (!bytes_mode()) return a < b;
    std::string_view va, vb;
    return read_record(*pool_, a, max_key_, &va) && read_record(*pool_, b, max_key_, &vb) &&
           va < vb;
  }
  std::uint8_t fingerprint(std::uint64_t key_word) const {
    return bytes_mode() ? fingerprint_bytes(key_bytes(key_word)) : fingerprint_word(key_word);
  }
  // K1 in bytes mode (a PM record); the integer itself otherwise. 0 with *code on failure
  // (an integer key word may be 0 too: callers test *code, not the word).
  std::uint64_t make_key_word(pm::Pool& pool, const Probe& p, Code* code) const {
    *code = Code::ok;
    if (!bytes_mode()) return p.word;
    const std::uint64_t off = write_record(pool, p.bytes, code);
    return off;
  }

  // Inner-node side ----------------------------------------------------------------------
  bool below(const Probe& p, std::uint64_t sep) const {
    return bytes_mode() ? p.bytes < SeparatorStore::view(sep) : p.word < sep;
  }
  bool separator_less(std::uint64_t a, std::uint64_t b) const {
    return bytes_mode() ? SeparatorStore::view(a) < SeparatorStore::view(b) : a < b;
  }
  std::string separator_bytes(std::uint64_t sep) const {
    return bytes_mode() ? std::string(SeparatorStore::view(sep)) : encode_u64(sep);
  }
  std::uint64_t separator_for(std::string_view key_bytes, std::uint64_t key_word,
                              SeparatorStore& store) const {
    return bytes_mode() ? store.make(key_bytes) : key_word;
  }
  // separator_for of a stored key word (its bytes read from the record only in bytes mode).
  std::uint64_t separator_of_word(std::uint64_t key_word, SeparatorStore& store) const {
    return bytes_mode() ? store.make(key_bytes(key_word)) : key_word;
  }

 private:
  const pm::Pool* pool_ = nullptr;
  KeyType mode_ = KeyType::u64;
  std::uint32_t max_key_ = 8;
};

// A find_many group's well-formed integer keys as key words and fingerprints, for a batched
// descent (lbtree's and fptree's find_batch_word): a malformed key is answered in codes[i] at
// once; at[j] is the group position of the j-th of `live` probes.
template <std::size_t kMax>
struct WordBatch {
  std::uint64_t word[kMax];
  std::uint8_t fp[kMax];
  std::uint8_t at[kMax];
  std::size_t live = 0;

  WordBatch(const KeyCodec& codec, const std::string_view* keys, Code* codes, std::size_t n) {
    static_assert(kMax <= 256, "positions are bytes");
    for (std::size_t i = 0; i < n; ++i) {
      codes[i] = codec.check(keys[i]);
      if (codes[i] != Code::ok) continue;
      const KeyCodec::Probe p = KeyCodec::probe_word(keys[i]);
      word[live] = p.word;
      fp[live] = p.fp;
      at[live++] = static_cast<std::uint8_t>(i);
    }
  }
};

}  // namespace pmindex::index_common

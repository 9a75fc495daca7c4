// Key ids -> key bytes, and values derived from keys (so every value can be checked).
//
// Key id i maps to PiBench's multiplicative hash h = i * 11400714819323198393 mod 2^64 (a
// bijection: the multiplier is odd), stored BIG-endian so memcmp order equals numeric order of
// h (PiBench stores it little-endian, so its byte order and numeric order disagree). Id 0 is
// key 0. With key_size > 8 the key is <prefix><zero padding><8 hash bytes>, as PiBench. With
// --key_type double the key is the order-preserving encoding of the double (h mod 2^53), also
// a bijection for ids below 2^53. With --dataset the 8 ordering bytes are the dataset's key
// number id (an integer, or an IEEE double with --key_type double) instead of the hash.
// With a text dataset keys are variable-length: key id i is the dataset's i-th key as it is
// (length() varies; ids beyond the dataset, which only absent_id() produces, become "\n" + 8
// bytes, which no text key can be since text keys never hold a newline).
//
// With --key_order pibench the 8 ordering bytes are stored little-endian instead, as PiBench
// does, and keys order by that little-endian integer (after any prefix bytes): the order
// PiBench's wrappers keep, since they compare keys as uint64 words. less() is the key order
// of the format either way; checks compare keys with it, never with memcmp.
//
// The value of id i at version v (0 = loaded, >0 = the v-th update) is a mix of (h, v): by
// default below 2^48, like the record pointers indexes usually store; --value_bits 64 uses all
// 64 bits (conformance runs do, so an index that steals value bits is caught). Values longer
// than 8 bytes repeat the mixed word; shorter ones keep its low bytes.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <memory>

#include "dataset.h"
#include "rng.h"

namespace pmbench {

inline constexpr std::uint64_t kHashMultiplier = 11400714819323198393ull;
// The inverse of kHashMultiplier mod 2^64 (Newton iteration), to map keys back to ids.
constexpr std::uint64_t inverse_mod_2_64(std::uint64_t a) {
  std::uint64_t x = a;  // correct to 3 bits for odd a
  for (int i = 0; i < 6; ++i) x *= 2 - a * x;
  return x;
}
inline constexpr std::uint64_t kHashInverse = inverse_mod_2_64(kHashMultiplier);
static_assert(kHashMultiplier * kHashInverse == 1);

inline std::uint64_t key_hash(std::uint64_t id) { return id * kHashMultiplier; }
inline std::uint64_t id_of_hash(std::uint64_t h) { return h * kHashInverse; }

inline void store_be64(char* out, std::uint64_t v) {
  const std::uint64_t be = __builtin_bswap64(v);
  std::memcpy(out, &be, 8);
}
inline std::uint64_t load_be64(const char* in) {
  std::uint64_t be;
  std::memcpy(&be, in, 8);
  return __builtin_bswap64(be);
}
static_assert(std::endian::native == std::endian::little, "PiBench key words are host-order");
inline void store_le64(char* out, std::uint64_t v) { std::memcpy(out, &v, 8); }
inline std::uint64_t load_le64(const char* in) {
  std::uint64_t le;
  std::memcpy(&le, in, 8);
  return le;
}

enum class KeyKind : std::uint8_t { u64, f64, bytes };

std::uint64_t f64_ordered_bits(double v);

class KeyFormat {
 public:
  KeyFormat() = default;
  KeyFormat(std::size_t key_size, std::string prefix, KeyKind kind,
            std::shared_ptr<const Dataset> dataset = nullptr, bool pibench_order = false)
      : key_size_(key_size), prefix_(std::move(prefix)), kind_(kind), dataset_(std::move(dataset)),
        pibench_order_(pibench_order && !variable()) {}
  const Dataset* dataset() const { return dataset_.get(); }

  // The fixed key size; with variable-length keys, the longest key.
  std::size_t key_size() const { return variable() ? dataset_->max_length : key_size_; }
  bool variable() const { return dataset_ && dataset_->variable_length(); }
  std::size_t length(std::uint64_t id) const {
    if (!variable()) return key_size_;
    return id < dataset_->size() ? dataset_->text(id).size() : 9;
  }
  KeyKind kind() const { return kind_; }
  const std::string& prefix() const { return prefix_; }

  // The 8 bytes that order the key (the hash, or the encoded double).
  std::uint64_t order_word(std::uint64_t id) const {
    if (dataset_ && id < dataset_->keys.size()) {
      const std::uint64_t raw = dataset_->keys[id];
      return kind_ == KeyKind::f64 ? f64_ordered_bits(std::bit_cast<double>(raw)) : raw;
    }
    const std::uint64_t h = key_hash(id);
    if (kind_ == KeyKind::f64)
      return f64_ordered_bits(static_cast<double>(h & ((std::uint64_t{1} << 53) - 1)));
    return h;
  }
  // Writes length(id) bytes.
  void write(std::uint64_t id, char* out) const {
    if (variable()) {
      if (id < dataset_->size()) {
        const std::string_view t = dataset_->text(id);
        std::memcpy(out, t.data(), t.size());
      } else {
        out[0] = '\n';
        store_be64(out + 1, id);
      }
      return;
    }
    if (key_size_ > 8) {
      std::memset(out, 0, key_size_ - 8);
      std::memcpy(out, prefix_.data(), prefix_.size());
    }
    if (pibench_order_)
      store_le64(out + key_size_ - 8, order_word(id));
    else
      store_be64(out + key_size_ - 8, order_word(id));
  }
  // Fixed-size keys: rewrites only the 8 ordering bytes of a buffer that already holds
  // make(any id) (its prefix and padding are the same for every id).
  void write_word(std::uint64_t id, char* out) const {
    if (pibench_order_)
      store_le64(out + key_size_ - 8, order_word(id));
    else
      store_be64(out + key_size_ - 8, order_word(id));
  }
  // The key word of a fixed-size key as this format stores it.
  std::uint64_t load_word(const char* last8) const {
    return pibench_order_ ? load_le64(last8) : load_be64(last8);
  }
  bool pibench_order() const { return pibench_order_; }
  // Every key is store_be64(key_hash(id)): 8-byte u64 keys, no dataset, memcmp order.
  bool hashed_u64_be() const {
    return !dataset_ && kind_ == KeyKind::u64 && !pibench_order_ && key_size_ == 8;
  }
  // a < b in this format's key order: memcmp, or (pibench order) memcmp of the bytes before
  // the key word, then the little-endian key word as an integer.
  bool less(std::string_view a, std::string_view b) const {
    if (!pibench_order_ || a.size() != key_size_ || b.size() != key_size_) return a < b;
    const std::size_t head = key_size_ - 8;
    if (const int c = a.substr(0, head).compare(b.substr(0, head)); c != 0) return c < 0;
    return load_le64(a.data() + head) < load_le64(b.data() + head);
  }
  std::string make(std::uint64_t id) const {
    std::string k(length(id), '\0');
    write(id, k.data());
    return k;
  }
  // Inverse of write() (for doubles, only for dataset keys): the id, or false if the bytes are no key of ours.
  bool id_of(std::string_view key, std::uint64_t* id) const;

 private:
  std::size_t key_size_ = 8;
  std::string prefix_;
  KeyKind kind_ = KeyKind::u64;
  std::shared_ptr<const Dataset> dataset_;
  bool pibench_order_ = false;
};

// A key comparator for ordered containers, following a KeyFormat's order.
struct KeyLess {
  const KeyFormat* keys;
  bool operator()(const std::string& a, const std::string& b) const { return keys->less(a, b); }
};

class ValueFormat {
 public:
  ValueFormat() = default;
  ValueFormat(std::size_t value_size, unsigned value_bits)
      : value_size_(value_size), mask_(value_bits >= 64 ? ~std::uint64_t{0}
                                                        : (std::uint64_t{1} << value_bits) - 1) {}
  std::size_t value_size() const { return value_size_; }
  std::uint64_t word(std::uint64_t id, std::uint32_t version) const {
    return mix64(key_hash(id) ^ (std::uint64_t{version} * 0xd6e8feb86659fd93ull)) & mask_;
  }
  // Writes value_size() bytes (little-endian word, as an index storing a pointer would).
  void write(std::uint64_t id, std::uint32_t version, char* out) const {
    const std::uint64_t w = word(id, version);
    for (std::size_t off = 0; off < value_size_; off += 8)
      std::memcpy(out + off, &w, std::min<std::size_t>(8, value_size_ - off));
  }
  std::string make(std::uint64_t id, std::uint32_t version) const {
    std::string v(value_size_, '\0');
    write(id, version, v.data());
    return v;
  }

 private:
  std::size_t value_size_ = 8;
  std::uint64_t mask_ = (std::uint64_t{1} << 48) - 1;
};

}  // namespace pmbench

// Value modes of the hybrid indexes in one place (the value-side sibling of key_codec.h):
//   inline (max_value_size = 8): the slot's value word is the value's 8 bytes; a longer
//            value is Code::value_too_large, a shorter one Code::invalid_argument.
//   out of line (max_value_size 9..kMaxValueBytes): the value word is the pool offset of an
//            immutable PM record (pm_record.h) of 0..max_value_size bytes; longer values are
//            Code::value_too_large. An update writes a new record (K1) and frees the old one
//            after the slot switch is durable (K3), so a large value is always updated out
//            of place and records are crash-safe by reachability.
// Written for FPTree (issue 6); LB+-Tree's check_value/read_value/release do the same inline
// and can move here.
//
// Thread safety: const after configure(). read() of a word found through an unvalidated slot
// is safe (read_record bounds-checks); the caller discards the result on a failed validation.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "index/common/pm_record.h"
#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::index_common {

class ValueCodec {
 public:
  static constexpr std::uint32_t kMaxValueBytes = 65536;
  // The max_value_size settings an index accepts at creation.
  static bool valid_limit(std::uint32_t max_value) {
    return max_value >= 8 && max_value <= kMaxValueBytes;
  }

  void configure(pm::Pool* pool, std::uint32_t max_value) {
    pool_ = pool;
    max_ = max_value;
    inline_ = max_value == 8;
  }
  bool inline_values() const { return inline_; }
  std::uint32_t max_value() const { return max_; }

  Code check(std::string_view value) const {
    // Over the limit is value_too_large in every mode; a short value in the fixed 8-byte
    // mode is invalid_argument (include/pmindex/index.h).
    if (value.size() > max_) return Code::value_too_large;
    return inline_ && value.size() != 8 ? Code::invalid_argument : Code::ok;
  }
  // K1 out of line (a persisted PM record); the 8 bytes themselves inline. *code on failure.
  std::uint64_t make_word(std::string_view value, Code* code) const {
    *code = Code::ok;
    if (!inline_) return write_record(*pool_, value, code);
    std::uint64_t w = 0;
    std::memcpy(&w, value.data(), 8);
    return w;
  }
  // The value bytes of a value word; false if an out-of-line record is unreadable.
  bool read(std::uint64_t word, std::string* out) const {
    if (inline_) {  // no call once the caller's string holds 8 bytes (assign is one)
      if (out->size() != 8) out->resize(8);
      std::memcpy(out->data(), &word, 8);
      return true;
    }
    std::string_view stored;
    if (!read_record(*pool_, word, max_, &stored)) return false;
    out->assign(stored);
    return true;
  }
  // K3: the slot that named the word is gone and persisted so.
  void release(std::uint64_t word) const {
    if (!inline_) free_record(*pool_, word);
  }
  // Recovery: checks and marks an out-of-line record reachable.
  Code mark(std::uint64_t word) const {
    return inline_ ? Code::ok : mark_record(*pool_, word, max_);
  }
  // verify(): the allocator bytes an out-of-line record occupies (0 inline); false if bad.
  bool record_size(std::uint64_t word, std::size_t* bytes) const {
    *bytes = 0;
    if (inline_) return true;
    std::string_view stored;
    if (!read_record(*pool_, word, max_, &stored)) return false;
    *bytes = record_bytes(stored.size());
    return true;
  }

 private:
  pm::Pool* pool_ = nullptr;
  std::uint32_t max_ = 8;
  bool inline_ = true;
};

}  // namespace pmindex::index_common

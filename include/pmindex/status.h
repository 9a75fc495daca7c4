// Typed results and errors of the native API.
//
// Operations on an index return a bare `Code` (no allocation on the hot path). Opening,
// creating, recovering and verifying return a `Status`, which adds a message that names the
// file and the problem, or a `Result<T>` (a value or a Status).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace pmindex {

enum class Code : unsigned char {
  ok,
  not_found,         // key absent (find, update, remove)
  already_present,   // key present (insert)
  pool_full,         // the allocator has no block of the size needed
  key_too_large,     // key longer than the index's documented limit
  value_too_large,   // value longer than the index's documented limit
  invalid_argument,  // wrong key size for the key type, NaN double key, bad option
  corrupted,         // the pool's content breaks an invariant (bad offset, cycle, checksum)
  io_error,          // open/mmap/fallocate/... failed
  wrong_layout,      // the pool belongs to another index, node size or key mode
  busy,              // the pool is open (in another process, or already in this one)
  unsupported,       // the index or mode does not offer this
};

std::string_view to_string(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == Code::ok; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code>: <message>", for logs and test failures.
  std::string to_string() const;

 private:
  Code code_ = Code::ok;
  std::string message_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace pmindex

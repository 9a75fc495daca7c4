/// \file
/// Typed results and errors of the native API.
///
/// Operations on an index return a bare `Code` (no allocation on the hot path). Opening,
/// creating, recovering and verifying return a `Status`, which adds a message that names the
/// file and the problem, or a `Result<T>` (a value or a Status).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace pmindex {

/// What an operation answered. Every index uses the same codes with the same meaning.
enum class Code : unsigned char {
  ok,                ///< done
  not_found,         ///< key absent (find, update, remove)
  already_present,   ///< key present (insert)
  pool_full,         ///< the allocator has no block of the size needed
  key_too_large,     ///< key longer than the index's documented limit
  value_too_large,   ///< value longer than the index's documented limit
  invalid_argument,  ///< wrong key size for the key type, NaN double key, bad option
  corrupted,         ///< the pool's content breaks an invariant (bad offset, cycle, checksum)
  io_error,          ///< open/mmap/fallocate/... failed
  wrong_layout,      ///< the pool belongs to another index, node size or key mode
  busy,              ///< the pool is open (in another process, or already in this one)
  unsupported,       ///< the index or mode does not offer this
};

/// The code's name as written above ("not_found"). Never fails; thread-safe.
std::string_view to_string(Code code);

/// A Code with a message naming the file and the problem, returned by the calls that can afford
/// one (open, create, recovery, verify, bulk load, close). A value type; not synchronised.
class [[nodiscard]] Status {
 public:
  /// Success.
  Status() = default;
  /// An outcome with a human-readable message (empty for success).
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  /// Success, spelled out at return sites.
  static Status Ok() { return {}; }

  /// True when the code is Code::ok.
  bool ok() const { return code_ == Code::ok; }
  /// The outcome's code.
  Code code() const { return code_; }
  /// What went wrong and where (empty for success).
  const std::string& message() const { return message_; }
  /// "<code>: <message>", for logs and test failures.
  std::string to_string() const;

 private:
  Code code_ = Code::ok;
  std::string message_;
};

/// A value or the Status that says why there is none (for example
/// `Result<std::unique_ptr<Index>>` from Index::open). A value type; not synchronised.
template <class T>
class [[nodiscard]] Result {
 public:
  /// A success holding `value`.
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  /// A failure; `status` must not be ok.
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  /// True when a value is held.
  bool ok() const { return value_.has_value(); }
  /// The failure (ok when a value is held).
  const Status& status() const { return status_; }
  /// The value; requires ok().
  T& value() & { assert(ok()); return *value_; }
  /// The value, moved out; requires ok().
  T&& value() && { assert(ok()); return std::move(*value_); }
  /// Member access to the value; requires ok().
  T* operator->() { return &value(); }
  /// The value; requires ok().
  T& operator*() { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace pmindex

/// \file
/// A typed persistent pointer: an 8-byte pool offset, so a pool maps at any address and
/// publishing a pointer is one failure-atomic 8-byte store (pm::publish on raw()).
///
///   struct Leaf { pm::PPtr<Leaf> next; ... };
///   Leaf* n = leaf->next.get(pool);                 // trusted (normal operation)
///   Leaf* n = leaf->next.checked(pool);             // recovery: nullptr if out of bounds
///   leaf->next.publish(pool.offset_of(fresh));      // failure-atomic, release order
///
/// Offset 0 is the null pointer (offset 0 is the pool header, never a block).
#pragma once

#include <cstdint>
#include <type_traits>

#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pm {

/// A pointer to a T in a pool, held as the T's pool offset (see the file comment). Trivially
/// copyable, 8 bytes: it lives in PM objects. Not synchronised beyond publish/load_acquire.
template <class T>
struct PPtr {
  std::uint64_t offset = 0;  ///< pool offset of the target; 0 = null

  bool null() const { return offset == 0; }                 ///< true for the null pointer
  explicit operator bool() const { return offset != 0; }    ///< true unless null
  /// The target's address in `pool`, trusting the offset (normal operation), or nullptr.
  T* get(const Pool& pool) const { return offset == 0 ? nullptr : pool.at<T>(offset); }
  /// Recovery never trusts PM: nullptr unless the whole object lies in the heap, aligned.
  T* checked(const Pool& pool, std::size_t bytes = sizeof(T), std::size_t align = alignof(T)) const {
    return offset == 0 ? nullptr : pool.checked<T>(offset, bytes, align);
  }
  /// The offset word itself (to persist it, or to CAS it with pm::cas).
  std::uint64_t* raw() { return &offset; }
  /// Failure-atomic store of a new target (not persisted: follow with pm::persist(raw(), 8)).
  void publish(std::uint64_t target) { pm::publish(&offset, target); }
  /// The offset, read with acquire order (pairs with publish on another thread).
  std::uint64_t load_acquire() const { return pm::load_acquire(&offset); }

  /// Same target.
  friend bool operator==(PPtr a, PPtr b) { return a.offset == b.offset; }
};
static_assert(sizeof(PPtr<int>) == 8 && std::is_trivially_copyable_v<PPtr<int>> &&
              std::is_standard_layout_v<PPtr<int>>);

}  // namespace pmindex::pm

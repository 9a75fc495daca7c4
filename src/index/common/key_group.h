// The common prologue of the indexes' find_many groups (Index::find_batch): a malformed key is
// answered in codes[i] at once, and the well-formed ones are compacted for the batched
// descent. Integer-key paths with inline values use WordBatch (key_codec.h) instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "pmindex/status.h"

namespace pmindex::index_common {

// For each of the n keys: codes[i] = check(keys[i]); a key checked ok gets the next place j,
// with item[j] = make(keys[i]) and at[j] = i (its position in the group, n <= 256). Returns
// how many keys were well formed.
template <class T, class Check, class Make>
std::size_t compact_checked(const std::string_view* keys, Code* codes, std::size_t n,
                            Check check, Make make, T* item, std::uint8_t* at) {
  std::size_t live = 0;
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = check(keys[i]);
    if (codes[i] != Code::ok) continue;
    item[live] = make(keys[i]);
    at[live++] = static_cast<std::uint8_t>(i);
  }
  return live;
}

}  // namespace pmindex::index_common

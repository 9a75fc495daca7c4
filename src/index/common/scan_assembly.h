// Scan assembly for unsorted leaves: gather a leaf's live entries (validated by the caller
// against the leaf version), keep those in range, sort by key (memcmp order) and append to the
// ScanBuffer, leaf after leaf.
//
// Thread safety: one LeafScan per scan call (not shared).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pmindex/index.h"

namespace pmindex::index_common {

class LeafScan {
 public:
  LeafScan(std::string_view start, std::size_t max) : start_(start), max_(max) {}

  // Gathering one leaf (may be abandoned by begin_leaf() again after a failed validation).
  void begin_leaf() { items_.clear(); }
  // Keeps the entry only if it is in range: >= start and > the last key emitted.
  void gather(std::string_view key, std::string_view value) {
    if (key < start_) return;
    if (have_last_ && key <= last_) return;
    items_.emplace_back(std::string(key), std::string(value));
  }
  // Sorts the gathered entries and appends up to the limit.
  void emit(ScanBuffer& out) {
    std::sort(items_.begin(), items_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [k, v] : items_) {
      if (out.size() >= max_) break;
      out.append(k, v);
      last_ = k;
      have_last_ = true;
    }
    items_.clear();
  }
  bool full(const ScanBuffer& out) const { return out.size() >= max_; }
  // Where a restarted scan resumes: the last emitted key (exclusive) or start (inclusive).
  bool have_last() const { return have_last_; }
  const std::string& last() const { return last_; }
  std::string_view start() const { return start_; }

 private:
  std::string start_;
  std::size_t max_;
  std::vector<std::pair<std::string, std::string>> items_;
  std::string last_;
  bool have_last_ = false;
};

}  // namespace pmindex::index_common

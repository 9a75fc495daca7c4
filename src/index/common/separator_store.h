// DRAM copies of variable-length separator keys for the inner-node layer: a separator word is
// a pointer to an immutable {u32 length; bytes} block. Separators are created at leaf splits,
// bulk loads and rebuilds. When an SMO removes a separator from the inner tree (a leaf was
// unlinked), the index retires it through its epoch manager (sync/epoch.h): an optimistic
// reader that read the word before the removal may still compare against the block, so it is
// freed only once every thread pinned at the removal has unpinned. What is left is freed when
// the store dies (with the index) or by reset() (single-threaded rebuild).
//
// Thread safety / Invariants:
//   (1) make(), retire() and the epoch deleter are thread-safe (one mutex over the set of
//       live blocks); view() reads an immutable block and takes no lock.
//   (2) A word is passed to retire() once, after it is unreachable from the inner tree
//       (EpochManager invariant (1)); readers that can hold separator words are pinned on the
//       same manager.
//   (3) The store outlives the epoch manager it retires into (declare it first), so deleters
//       that run in the manager's destructor find it alive.
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_set>

#include "pmindex/sync/epoch.h"

namespace pmindex::index_common {

class SeparatorStore {
 public:
  SeparatorStore() = default;
  SeparatorStore(const SeparatorStore&) = delete;
  SeparatorStore& operator=(const SeparatorStore&) = delete;
  ~SeparatorStore() { reset(); }

  std::uint64_t make(std::string_view key) {
    const auto len = static_cast<std::uint32_t>(key.size());
    char* block = new char[sizeof len + key.size()];
    std::memcpy(block, &len, sizeof len);
    if (!key.empty()) std::memcpy(block + sizeof len, key.data(), key.size());
    const auto word = reinterpret_cast<std::uint64_t>(block);
    std::lock_guard<std::mutex> g(mu_);
    bytes_ += sizeof len + key.size();
    live_.insert(word);
    return word;
  }
  static std::string_view view(std::uint64_t word) {
    const char* p = reinterpret_cast<const char*>(word);
    std::uint32_t len = 0;
    std::memcpy(&len, p, sizeof len);
    return {p + sizeof len, len};
  }
  // The separator `word` left the inner tree: free it once no pinned reader can hold it.
  void retire(std::uint64_t word, sync::EpochManager& epochs) {
    epochs.retire(this, &SeparatorStore::free_block, word);
  }
  void reset() {
    std::lock_guard<std::mutex> g(mu_);
    for (std::uint64_t w : live_) delete[] reinterpret_cast<char*>(w);
    live_.clear();
    bytes_ = 0;
  }
  std::uint64_t dram_bytes() const {
    std::lock_guard<std::mutex> g(mu_);
    return bytes_ + live_.size() * 16;
  }
  std::uint64_t live_count() const {
    std::lock_guard<std::mutex> g(mu_);
    return live_.size();
  }

 private:
  static void free_block(void* store, std::uint64_t word) {
    auto* self = static_cast<SeparatorStore*>(store);
    std::lock_guard<std::mutex> g(self->mu_);
    if (self->live_.erase(word) == 0) return;  // already freed by reset()
    self->bytes_ -= sizeof(std::uint32_t) + view(word).size();
    delete[] reinterpret_cast<char*>(word);
  }

  mutable std::mutex mu_;
  std::unordered_set<std::uint64_t> live_;
  std::uint64_t bytes_ = 0;
};

}  // namespace pmindex::index_common

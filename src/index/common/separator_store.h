// DRAM copies of variable-length separator keys for the inner-node layer: a separator word is
// a pointer to an immutable {u32 length; bytes} block. Separators are created at leaf splits
// and rebuilds; a removed separator may still be read by an optimistic reader, so blocks are
// freed only when the store dies (with the index) or is reset by a single-threaded rebuild.
// The waste is bounded by the number of splits since the last open.
//
// Thread safety: make() is thread-safe (a mutex); view() reads immutable memory.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace pmindex::index_common {

class SeparatorStore {
 public:
  std::uint64_t make(std::string_view key) {
    auto block = std::make_unique<char[]>(sizeof(std::uint32_t) + key.size());
    const auto len = static_cast<std::uint32_t>(key.size());
    std::memcpy(block.get(), &len, sizeof len);
    if (!key.empty()) std::memcpy(block.get() + sizeof len, key.data(), key.size());
    const auto word = reinterpret_cast<std::uint64_t>(block.get());
    std::lock_guard<std::mutex> g(mu_);
    bytes_ += sizeof len + key.size();
    blocks_.push_back(std::move(block));
    return word;
  }
  static std::string_view view(std::uint64_t word) {
    const char* p = reinterpret_cast<const char*>(word);
    std::uint32_t len = 0;
    std::memcpy(&len, p, sizeof len);
    return {p + sizeof len, len};
  }
  void reset() {
    std::lock_guard<std::mutex> g(mu_);
    blocks_.clear();
    bytes_ = 0;
  }
  std::uint64_t dram_bytes() const {
    std::lock_guard<std::mutex> g(mu_);
    return bytes_ + blocks_.size() * 16;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<char[]>> blocks_;
  std::uint64_t bytes_ = 0;
};

}  // namespace pmindex::index_common

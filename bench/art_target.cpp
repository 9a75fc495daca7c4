// The DRAM comparator `art`: the trie core of the `part` index (src/index/common/art/) with
// the DRAM placement (nodes and records in a THP arena, no persistence work), lock-free
// readers and node locks as in `part`. Values of exactly 8 bytes are the record's value word;
// other sizes (decided by the first insert) live in arena blocks named by the word and are
// freed through the tree's epoch manager.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "index/common/art/art_tree.h"
#include "target.h"

namespace pmbench {
namespace {

using DramTree = pmindex::art::Tree<pmindex::art::DramPlacement>;

class ArtTarget;

class ArtSession final : public Session {
 public:
  explicit ArtSession(ArtTarget& t) : t_(t) {}
  bool find(std::string_view key, std::string_view* value) override;
  bool insert(std::string_view key, std::string_view value) override;
  bool update(std::string_view key, std::string_view value) override;
  bool remove(std::string_view key) override;
  std::size_t scan(std::string_view start, int count, ScanResult* out) override;

 private:
  ArtTarget& t_;
  std::string value_;
  std::vector<std::pair<std::string, std::string>> scanned_;
};

class ArtTarget final : public Target {
 public:
  ArtTarget() : tree_(pmindex::art::DramPlacement{&arena_}, &words_[0], &words_[1], 1,
                      pmindex::art::kMaxKeyBytes) {
    info_.name = "art";
    info_.kind = "dram";
  }
  std::unique_ptr<Session> session() override { return std::make_unique<ArtSession>(*this); }
  const TargetInfo& info() const override { return info_; }
  std::string verify() const override {
    pmindex::art::TreeStats st;
    return tree_.verify(&st, false, nullptr, nullptr);
  }

  // 0 undecided, 1 inline 8-byte values, 2 out of line. relaxed: only the first insert sets
  // it; later operations read it after their own inserts or finds that synchronised through
  // the tree.
  int value_mode(std::size_t size) {
    int m = mode_.load(std::memory_order_relaxed);
    if (m == 0) {
      int want = size == 8 ? 1 : 2;
      mode_.compare_exchange_strong(m, want, std::memory_order_relaxed);
      m = mode_.load(std::memory_order_relaxed);
    }
    return m;
  }
  // The value word for `value`, 0 with ok=false if the size does not fit the mode.
  std::uint64_t make_word(std::string_view value, bool* ok) {
    *ok = true;
    if (value_mode(value.size()) == 1) {
      if (value.size() != 8) {
        *ok = false;
        return 0;
      }
      std::uint64_t w;
      std::memcpy(&w, value.data(), 8);
      return w;
    }
    auto* block = static_cast<char*>(arena_.allocate(8 + value.size()));
    const std::uint64_t len = value.size();
    std::memcpy(block, &len, 8);
    std::memcpy(block + 8, value.data(), value.size());
    return reinterpret_cast<std::uint64_t>(block);
  }
  void read(std::uint64_t w, std::string* out) const {
    if (mode_.load(std::memory_order_relaxed) == 1) {
      out->assign(reinterpret_cast<const char*>(&w), 8);
      return;
    }
    const char* block = reinterpret_cast<const char*>(w);
    std::uint64_t len;
    std::memcpy(&len, block, 8);
    out->assign(block + 8, len);
  }
  void release_now(std::uint64_t w) {
    if (mode_.load(std::memory_order_relaxed) != 2) return;
    std::uint64_t len;
    std::memcpy(&len, reinterpret_cast<const char*>(w), 8);
    arena_.deallocate(reinterpret_cast<void*>(w), 8 + len);
  }
  void retire(std::uint64_t w) {
    if (mode_.load(std::memory_order_relaxed) != 2) return;
    tree_.epochs().retire(this, [](void* ctx, std::uint64_t word) {
      static_cast<ArtTarget*>(ctx)->release_now(word);
    }, w);
  }

  pmindex::pm::DramArena arena_;
  std::uint64_t words_[2] = {0, 0};
  DramTree tree_;
  std::atomic<int> mode_{0};
  TargetInfo info_;
};

bool ArtSession::find(std::string_view key, std::string_view* value) {
  auto guard = t_.tree_.epochs().pin();
  std::uint64_t w = 0;
  if (t_.tree_.find(key, &w) != pmindex::Code::ok) return false;
  t_.read(w, &value_);
  if (value != nullptr) *value = value_;
  return true;
}
bool ArtSession::insert(std::string_view key, std::string_view value) {
  bool ok = false;
  const std::uint64_t w = t_.make_word(value, &ok);
  if (!ok) return false;
  if (t_.tree_.insert(key, w) == pmindex::Code::ok) return true;
  t_.release_now(w);
  return false;
}
bool ArtSession::update(std::string_view key, std::string_view value) {
  bool ok = false;
  const std::uint64_t w = t_.make_word(value, &ok);
  if (!ok) return false;
  std::uint64_t old = 0;
  if (t_.tree_.update(key, w, &old) != pmindex::Code::ok) {
    t_.release_now(w);
    return false;
  }
  t_.retire(old);
  return true;
}
bool ArtSession::remove(std::string_view key) {
  std::uint64_t old = 0;
  if (t_.tree_.remove(key, &old) != pmindex::Code::ok) return false;
  t_.retire(old);
  return true;
}
std::size_t ArtSession::scan(std::string_view start, int count, ScanResult* out) {
  scanned_.clear();
  {
    auto guard = t_.tree_.epochs().pin();
    t_.tree_.scan(start, static_cast<std::size_t>(std::max(count, 0)),
                  [&](std::string_view k, std::uint64_t w) {
                    scanned_.emplace_back(std::string(k), std::string());
                    t_.read(w, &scanned_.back().second);
                  });
  }
  if (out != nullptr) {
    out->records.clear();
    for (const auto& [k, v] : scanned_) out->records.emplace_back(k, v);
  }
  return scanned_.size();
}

}  // namespace

std::unique_ptr<Target> make_art_target() { return std::make_unique<ArtTarget>(); }

}  // namespace pmbench

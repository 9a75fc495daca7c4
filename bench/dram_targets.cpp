// The DRAM comparators: stand-ins for the survey's PM-index-vs-DRAM-index comparison (§8.2).
//   stdmap    std::map<std::string, std::string> behind a std::shared_mutex
//   btreemap  absl::btree_map<std::string, std::string> behind a std::shared_mutex
//   tbbmap    tbb::concurrent_map<std::string, Slot>: finds/inserts/updates/scans run
//             concurrently; values sit in a Slot guarded by a per-record spin lock (an update
//             rewrites a value in place); remove needs tbb's unsafe_erase, so removes take a
//             map-wide exclusive lock that every other operation holds shared.
//   art       the trie core of the `part` index in DRAM (art_target.cpp)
// Finds, inserts and scans copy keys and values into std::string, as an application would.
#include <absl/container/btree_map.h>
#include <oneapi/tbb/concurrent_map.h>

#include <atomic>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "target.h"

namespace pmbench {
namespace {

template <class Map>
class LockedMapTarget;

template <class Map>
class LockedMapSession final : public Session {
 public:
  explicit LockedMapSession(LockedMapTarget<Map>& t) : t_(t) {}
  bool find(std::string_view key, std::string_view* value) override;
  bool insert(std::string_view key, std::string_view value) override;
  bool update(std::string_view key, std::string_view value) override;
  bool remove(std::string_view key) override;
  std::size_t scan(std::string_view start, int count, ScanResult* out) override;

 private:
  LockedMapTarget<Map>& t_;
  std::string value_;
  std::vector<std::pair<std::string, std::string>> scanned_;
};

template <class Map>
class LockedMapTarget final : public Target {
 public:
  explicit LockedMapTarget(std::string name) {
    info_.name = std::move(name);
    info_.kind = "dram";
  }
  std::unique_ptr<Session> session() override {
    return std::make_unique<LockedMapSession<Map>>(*this);
  }
  const TargetInfo& info() const override { return info_; }
  std::string verify() const override {
    std::shared_lock lock(mutex_);
    const std::string* prev = nullptr;
    for (const auto& [k, v] : map_) {
      if (prev != nullptr && !(*prev < k)) return "keys out of order";
      prev = &k;
    }
    return "";
  }
  mutable std::shared_mutex mutex_;
  Map map_;
  TargetInfo info_;
};

template <class Map>
bool LockedMapSession<Map>::find(std::string_view key, std::string_view* value) {
  std::shared_lock lock(t_.mutex_);
  auto it = t_.map_.find(std::string(key));
  if (it == t_.map_.end()) return false;
  value_ = it->second;
  if (value != nullptr) *value = value_;
  return true;
}
template <class Map>
bool LockedMapSession<Map>::insert(std::string_view key, std::string_view value) {
  std::unique_lock lock(t_.mutex_);
  return t_.map_.emplace(std::string(key), std::string(value)).second;
}
template <class Map>
bool LockedMapSession<Map>::update(std::string_view key, std::string_view value) {
  std::unique_lock lock(t_.mutex_);
  auto it = t_.map_.find(std::string(key));
  if (it == t_.map_.end()) return false;
  it->second.assign(value);
  return true;
}
template <class Map>
bool LockedMapSession<Map>::remove(std::string_view key) {
  std::unique_lock lock(t_.mutex_);
  return t_.map_.erase(std::string(key)) != 0;
}
template <class Map>
std::size_t LockedMapSession<Map>::scan(std::string_view start, int count, ScanResult* out) {
  scanned_.clear();
  {
    std::shared_lock lock(t_.mutex_);
    for (auto it = t_.map_.lower_bound(std::string(start));
         it != t_.map_.end() && static_cast<int>(scanned_.size()) < count; ++it)
      scanned_.emplace_back(it->first, it->second);
  }
  if (out != nullptr) {
    out->records.clear();
    for (const auto& [k, v] : scanned_) out->records.emplace_back(k, v);
  }
  return scanned_.size();
}

// --- tbbmap -------------------------------------------------------------------------------

struct Slot {
  mutable std::atomic<bool> locked{false};
  std::string value;
  explicit Slot(std::string_view v) : value(v) {}
  Slot(const Slot& o) : value(o.value) {}
  // acquire/release: the value bytes written under the lock are seen by the next holder.
  void lock() const {
    while (locked.exchange(true, std::memory_order_acquire)) {
    }
  }
  void unlock() const { locked.store(false, std::memory_order_release); }
};

class TbbMapTarget;

class TbbMapSession final : public Session {
 public:
  explicit TbbMapSession(TbbMapTarget& t) : t_(t) {}
  bool find(std::string_view key, std::string_view* value) override;
  bool insert(std::string_view key, std::string_view value) override;
  bool update(std::string_view key, std::string_view value) override;
  bool remove(std::string_view key) override;
  std::size_t scan(std::string_view start, int count, ScanResult* out) override;

 private:
  TbbMapTarget& t_;
  std::string value_;
  std::vector<std::pair<std::string, std::string>> scanned_;
};

class TbbMapTarget final : public Target {
 public:
  TbbMapTarget() {
    info_.name = "tbbmap";
    info_.kind = "dram";
  }
  std::unique_ptr<Session> session() override { return std::make_unique<TbbMapSession>(*this); }
  const TargetInfo& info() const override { return info_; }
  std::shared_mutex erase_mutex_;
  tbb::concurrent_map<std::string, Slot> map_;
  TargetInfo info_;
};

bool TbbMapSession::find(std::string_view key, std::string_view* value) {
  std::shared_lock lock(t_.erase_mutex_);
  auto it = t_.map_.find(std::string(key));
  if (it == t_.map_.end()) return false;
  it->second.lock();
  value_ = it->second.value;
  it->second.unlock();
  if (value != nullptr) *value = value_;
  return true;
}
bool TbbMapSession::insert(std::string_view key, std::string_view value) {
  std::shared_lock lock(t_.erase_mutex_);
  return t_.map_.emplace(std::string(key), Slot(value)).second;
}
bool TbbMapSession::update(std::string_view key, std::string_view value) {
  std::shared_lock lock(t_.erase_mutex_);
  auto it = t_.map_.find(std::string(key));
  if (it == t_.map_.end()) return false;
  it->second.lock();
  it->second.value.assign(value);
  it->second.unlock();
  return true;
}
bool TbbMapSession::remove(std::string_view key) {
  std::unique_lock lock(t_.erase_mutex_);
  return t_.map_.unsafe_erase(std::string(key)) != 0;
}
std::size_t TbbMapSession::scan(std::string_view start, int count, ScanResult* out) {
  scanned_.clear();
  {
    std::shared_lock lock(t_.erase_mutex_);
    for (auto it = t_.map_.lower_bound(std::string(start));
         it != t_.map_.end() && static_cast<int>(scanned_.size()) < count; ++it) {
      it->second.lock();
      scanned_.emplace_back(it->first, it->second.value);
      it->second.unlock();
    }
  }
  if (out != nullptr) {
    out->records.clear();
    for (const auto& [k, v] : scanned_) out->records.emplace_back(k, v);
  }
  return scanned_.size();
}

}  // namespace

std::vector<std::string> dram_comparator_names() {
  return {"stdmap", "btreemap", "tbbmap", "art"};
}

std::unique_ptr<Target> make_art_target();  // art_target.cpp

std::unique_ptr<Target> make_dram_target(const std::string& name) {
  if (name == "stdmap") return std::make_unique<LockedMapTarget<std::map<std::string, std::string>>>(name);
  if (name == "btreemap")
    return std::make_unique<LockedMapTarget<absl::btree_map<std::string, std::string>>>(name);
  if (name == "tbbmap") return std::make_unique<TbbMapTarget>();
  if (name == "art") return make_art_target();
  return nullptr;
}

}  // namespace pmbench

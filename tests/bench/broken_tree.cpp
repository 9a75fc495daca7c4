// A deliberately broken tree_api wrapper: a std::map behind a mutex with one injected bug,
// chosen by $PMBENCH_BROKEN (default "update"). pmbench --verify must fail on it.
//   update  every 7th update reports success but keeps the old value (a lost update)
//   scan    scans skip their second record
//   insert  every 11th insert reports success but stores nothing
//   value   every 13th insert stores a value with its first byte flipped
//   none    no bug (the checker must pass; guards against a checker that always fails)
// $PMBENCH_BROKEN_AFTER=N arms the bug only after N calls of the broken operation, so it slips
// past pmbench's post-load validation and must be caught by --verify in the run phase.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tree_api.h"

namespace {

class BrokenTree final : public tree_api {
 public:
  BrokenTree(std::size_t key_size, std::size_t value_size, std::string bug, unsigned long after)
      : key_size_(key_size), value_size_(value_size), bug_(std::move(bug)), after_(after) {}
  bool find(const char* key, size_t sz, char* value_out) override {
    std::lock_guard lock(mutex_);
    auto it = map_.find(std::string(key, sz));
    if (it == map_.end()) return false;
    std::memcpy(value_out, it->second.data(), value_size_);
    return true;
  }
  bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    std::lock_guard lock(mutex_);
    if (bug_ == "insert" && ++inserts_ > after_ && inserts_ % 11 == 0) return true;
    std::string v(value, value_sz);
    if (bug_ == "value" && ++inserts_ > after_ && inserts_ % 13 == 0 && !v.empty()) v[0] ^= 1;
    return map_.emplace(std::string(key, key_sz), std::move(v)).second;
  }
  bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    std::lock_guard lock(mutex_);
    auto it = map_.find(std::string(key, key_sz));
    if (it == map_.end()) return false;
    if (bug_ == "update" && ++updates_ > after_ && updates_ % 7 == 0) return true;
    it->second.assign(value, value_sz);
    return true;
  }
  bool remove(const char* key, size_t key_sz) override {
    std::lock_guard lock(mutex_);
    return map_.erase(std::string(key, key_sz)) != 0;
  }
  int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) override {
    thread_local std::vector<char> out;
    out.clear();
    std::lock_guard lock(mutex_);
    const bool armed = ++scans_ > after_;
    int n = 0, index = 0;
    for (auto it = map_.lower_bound(std::string(key, key_sz)); it != map_.end() && n < scan_sz;
         ++it, ++index) {
      if (bug_ == "scan" && armed && index == 1) continue;
      out.insert(out.end(), it->first.begin(), it->first.end());
      out.insert(out.end(), it->second.begin(), it->second.end());
      ++n;
    }
    values_out = out.data();
    return n;
  }

 private:
  std::size_t key_size_, value_size_;
  std::string bug_;
  std::mutex mutex_;
  std::map<std::string, std::string> map_;
  unsigned long after_;
  unsigned long inserts_ = 0, updates_ = 0, scans_ = 0;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) tree_api* create_tree(const tree_options_t& opt) {
  const char* bug = std::getenv("PMBENCH_BROKEN");
  const char* after = std::getenv("PMBENCH_BROKEN_AFTER");
  return new BrokenTree(opt.key_size, opt.value_size, bug != nullptr ? bug : "update",
                        after != nullptr ? std::strtoul(after, nullptr, 10) : 0);
}

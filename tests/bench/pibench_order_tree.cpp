// A tree_api wrapper shaped like PiBench's own (sfu-dis/fptree's, for one): 8-byte keys read
// as host-order (little-endian) uint64 words and kept in integer order, and a scan that may
// not hand back its records. $PMBENCH_PIBENCH_TREE picks the shape (default "novalues"):
//   novalues   scan returns the count and leaves values_out untouched (as that FPTree does)
//   noscan     scan returns 0 (not implemented)
//   records    scan returns <key><value> records in integer key order (a complete wrapper)
//   badlookup  as novalues, but every 13th find answers a wrong value: validation by lookups
//              must still fail on it
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tree_api.h"

namespace {

std::uint64_t word(const char* bytes) {
  std::uint64_t w;
  std::memcpy(&w, bytes, 8);
  return w;
}

class PibenchOrderTree final : public tree_api {
 public:
  explicit PibenchOrderTree(std::string shape) : shape_(std::move(shape)) {}
  bool find(const char* key, size_t, char* value_out) override {
    std::lock_guard lock(mutex_);
    auto it = map_.find(word(key));
    if (it == map_.end()) return false;
    std::uint64_t v = it->second;
    if (shape_ == "badlookup" && ++finds_ % 13 == 0) v ^= 1;
    std::memcpy(value_out, &v, 8);
    return true;
  }
  bool insert(const char* key, size_t, const char* value, size_t) override {
    std::lock_guard lock(mutex_);
    return map_.emplace(word(key), word(value)).second;
  }
  bool update(const char* key, size_t, const char* value, size_t) override {
    std::lock_guard lock(mutex_);
    auto it = map_.find(word(key));
    if (it == map_.end()) return false;
    it->second = word(value);
    return true;
  }
  bool remove(const char* key, size_t) override {
    std::lock_guard lock(mutex_);
    return map_.erase(word(key)) != 0;
  }
  int scan(const char* key, size_t, int scan_sz, char*& values_out) override {
    if (shape_ == "noscan") return 0;
    thread_local std::vector<char> out;
    out.clear();
    std::lock_guard lock(mutex_);
    int n = 0;
    for (auto it = map_.lower_bound(word(key)); it != map_.end() && n < scan_sz; ++it, ++n) {
      char rec[16];
      std::memcpy(rec, &it->first, 8);
      std::memcpy(rec + 8, &it->second, 8);
      out.insert(out.end(), rec, rec + 16);
    }
    if (shape_ == "records") values_out = out.data();
    return n;
  }

 private:
  std::string shape_;
  std::mutex mutex_;
  std::map<std::uint64_t, std::uint64_t> map_;
  unsigned long finds_ = 0;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) tree_api* create_tree(const tree_options_t& opt) {
  if (opt.key_size != 8 || opt.value_size != 8) return nullptr;  // PiBench-style: 8 and 8 only
  const char* shape = std::getenv("PMBENCH_PIBENCH_TREE");
  return new PibenchOrderTree(shape != nullptr ? shape : "novalues");
}

#include "pmindex/pm/thread_slot.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace pmindex::pm {

namespace {

class SlotTable {
 public:
  std::size_t take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      std::size_t s = free_.back();
      free_.pop_back();
      return s;
    }
    if (next_ == kMaxThreadSlots) {
      std::fprintf(stderr, "pmindex: more than %zu threads alive at once\n", kMaxThreadSlots);
      std::abort();
    }
    return next_++;
  }
  void give_back(std::size_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
  }

 private:
  std::mutex mu_;
  std::vector<std::size_t> free_;
  std::size_t next_ = 0;
};

SlotTable& table() {
  static SlotTable* t = new SlotTable();  // never destroyed: threads may exit after main
  return *t;
}

struct SlotHolder {
  std::size_t slot = table().take();
  ~SlotHolder() { table().give_back(slot); }
};

}  // namespace

std::size_t this_thread_slot() {
  thread_local SlotHolder holder;
  return holder.slot;
}

}  // namespace pmindex::pm

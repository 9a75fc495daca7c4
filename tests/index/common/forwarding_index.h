// ForwardingIndex: an Index that passes every call to an inner index. The base of the test
// kit's known-bad wrappers (test_map_checker, test_stress_checker, test_upsert_race): a
// wrapper overrides only the operation it breaks, so the checker under test must catch that
// one defect.
//
// Thread safety: that of the inner index (the wrapper adds no state of its own).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "pmindex/index.h"

namespace pmindex::testing {

class ForwardingIndex : public Index {
 public:
  explicit ForwardingIndex(std::unique_ptr<Index> inner) : in_(std::move(inner)) {}
  std::string_view kind() const override { return in_->kind(); }
  Code insert(std::string_view k, std::string_view v) override { return in_->insert(k, v); }
  Code update(std::string_view k, std::string_view v) override { return in_->update(k, v); }
  Code upsert(std::string_view k, std::string_view v) override { return in_->upsert(k, v); }
  Code find(std::string_view k, std::string* v) const override { return in_->find(k, v); }
  Code remove(std::string_view k) override { return in_->remove(k); }
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override {
    return in_->scan(start, max, out);
  }
  Status verify() const override { return in_->verify(); }
  RecoveryStats recovery_stats() const override { return in_->recovery_stats(); }
  Footprint footprint() const override { return in_->footprint(); }
  Status close() override { return in_->close(); }
  const pm::Pool& pool() const override { return in_->pool(); }
  ThreadScope attach_thread() override { return in_->attach_thread(); }

 protected:
  Index& inner() const { return *in_; }

 private:
  std::unique_ptr<Index> in_;
};

}  // namespace pmindex::testing

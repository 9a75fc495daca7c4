// Known-bad batched lookups for the find_many tests' own checks (test-only; never in the
// library): DropsLast forwards everything to a real index but answers not_found for the last
// key of every find_many group.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "pmindex/index.h"

namespace pmindex::index_test {

class DropsLast final : public Index {
 public:
  explicit DropsLast(std::unique_ptr<Index> in) : in_(std::move(in)) {}
  std::string_view kind() const override { return in_->kind(); }
  Code insert(std::string_view k, std::string_view v) override { return in_->insert(k, v); }
  Code update(std::string_view k, std::string_view v) override { return in_->update(k, v); }
  Code find(std::string_view k, std::string* v) const override { return in_->find(k, v); }
  Code remove(std::string_view k) override { return in_->remove(k); }
  std::size_t scan(std::string_view s, std::size_t max, ScanBuffer& out) const override {
    return in_->scan(s, max, out);
  }
  Status verify() const override { return in_->verify(); }
  RecoveryStats recovery_stats() const override { return in_->recovery_stats(); }
  Footprint footprint() const override { return in_->footprint(); }
  Status close() override { return in_->close(); }
  const pm::Pool& pool() const override { return in_->pool(); }

 protected:
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override {
    (void)in_->find_many({keys, n}, values != nullptr ? std::span<std::string>(values, n)
                                                      : std::span<std::string>(),
                         {codes, n});
    if (n > 0) codes[n - 1] = Code::not_found;
  }

 private:
  std::unique_ptr<Index> in_;
};

}  // namespace pmindex::index_test

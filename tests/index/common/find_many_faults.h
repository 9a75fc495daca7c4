// Known-bad batched lookups for the find_many tests' own checks (test-only; never in the
// library): DropsLast forwards everything to a real index but answers not_found for the last
// key of every find_many group.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "index/common/forwarding_index.h"
#include "pmindex/index.h"

namespace pmindex::index_test {

class DropsLast final : public testing::ForwardingIndex {
 public:
  using ForwardingIndex::ForwardingIndex;

 protected:
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override {
    (void)inner().find_many({keys, n}, values != nullptr ? std::span<std::string>(values, n)
                                                         : std::span<std::string>(),
                            {codes, n});
    if (n > 0) codes[n - 1] = Code::not_found;
  }
};

}  // namespace pmindex::index_test

// Damage-detection checks shared by the leaf-chain indexes' tests (issue 18): a pool whose
// chain was damaged after an unclean end (no close counts to compare) must be refused at open
// with Code::corrupted and a message naming what recovery saw.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::testing {

// `o.path` holds a pool closed without close() and then damaged; `what` names the damage in
// failure output, `needle` is a substring the refusal's message must contain.
inline void expect_refused_after_unclean_end(const Options& o, const std::string& what,
                                             const std::string& needle) {
  auto info = pm::Pool::inspect(o.path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_FALSE(info->clean_shutdown) << "the test needs an unclean end (no close counts)";
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok()) << what << " not seen";
  EXPECT_EQ(r.status().code(), Code::corrupted);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
}

}  // namespace pmindex::testing

// Issue 17: a tree deleted while the OpenMP pool threads that ran its operations are still
// alive (the original PiBench's shape, tests/sync/omp_delete_host.cpp) exits cleanly, 20
// consecutive runs per configuration: the native API with and without per-thread scopes, and
// our PiBench libraries loaded as PiBench loads them.
#include <gtest/gtest.h>

#include <string>

#include "support/run_command.h"

#ifndef PMINDEX_OMP_HOST
#error "PMINDEX_OMP_HOST must name the omp_delete_host binary (set by CMake)"
#endif

namespace {

constexpr int kRuns = 20;

void run_twenty(const std::string& args) {
  for (int i = 0; i < kRuns; ++i) {
    const auto r = pmindex::testing::run_command(std::string(PMINDEX_OMP_HOST) + " " + args);
    ASSERT_EQ(r.rc, 0) << "run " << i << " of `omp_delete_host " << args << "`:\n" << r.out;
  }
}

// Native API (nbtree and fptree: through their libraries below). lbtree with 16-byte values:
// values out of line, so updates and removes retire records.
TEST(OmpDelete, LbtreeWithThreadScopes) { run_twenty("lbtree 16"); }
TEST(OmpDelete, LbtreeWithoutThreadScopes) { run_twenty("lbtree 16 --no-scope"); }
TEST(OmpDelete, ApexWithThreadScopes) { run_twenty("apex 8"); }

#ifdef PMINDEX_TREE_LIB_DIR
// The PiBench libraries themselves (libpmindex_<kind>_tree.so), loaded by dlopen.
std::string library(const char* kind) {
  return std::string("--tree-api ") + PMINDEX_TREE_LIB_DIR + "/libpmindex_" + kind + "_tree.so";
}
TEST(OmpDelete, LbtreeTreeApiLibrary) { run_twenty(library("lbtree") + " 16"); }
TEST(OmpDelete, ApexTreeApiLibrary) { run_twenty(library("apex") + " 8"); }
TEST(OmpDelete, NbtreeTreeApiLibrary) { run_twenty(library("nbtree") + " 8"); }
TEST(OmpDelete, FptreeTreeApiLibrary) { run_twenty(library("fptree") + " 8"); }
TEST(OmpDelete, UtreeTreeApiLibrary) { run_twenty(library("utree") + " 8"); }
TEST(OmpDelete, PartTreeApiLibrary) { run_twenty(library("part") + " 8"); }
TEST(OmpDelete, PactreeTreeApiLibrary) { run_twenty(library("pactree") + " 8"); }
TEST(OmpDelete, DptreeTreeApiLibrary) { run_twenty(library("dptree") + " 8"); }
#endif

}  // namespace

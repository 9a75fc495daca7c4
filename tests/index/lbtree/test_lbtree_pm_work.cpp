// Theorem 3.5 reproduction (paper 001 §3.5): PM line writes per insert into a stable tree of
// random keys, LB+-Tree (entry moving, splits fill the new leaf's last lines) against the
// paper's "traditional" design of Fig. 8b (first empty slot, no entry moving, a split packs
// the new leaf from slot 0). Counting flavour: lines are the distinct 64 B lines stored through
// pm:: per operation (Runtime::end_operation). The theorem bounds our worst case by 1.31 lines
// per insert and the traditional best case from below by 1.77, so the measured ratio should be
// at least 1.35. Deterministic counts, not timings.
//   ./build/<preset>/tests/test_lbtree_pm_work   (prints the table; PMINDEX_LINES_INSERTS=n)
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <random>

#include "index/lbtree/lbtree.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

struct LineStats {
  double lines_per_insert = 0;
  double flushes_per_insert = 0;
  double lines_per_plain_insert = 0;  // inserts that did not split a leaf
  double lines_per_split_insert = 0;  // inserts that split a leaf (PM in use grew by a leaf)
  double split_fraction = 0;
};

template <unsigned M>
LineStats measure(bool traditional, std::size_t warm, std::size_t measured) {
  Options o;
  o.kind = "lbtree";
  o.node_size = 256 * M;
  o.pool_size = std::size_t{256} << 20;
  auto r = Index::open(o);
  // A function returning a value cannot ASSERT: stop here rather than use what failed.
  if (!r.ok()) {
    ADD_FAILURE() << r.status().to_string();
    return {};
  }
  std::unique_ptr<Index> idx = std::move(r).value();
  auto* tree = dynamic_cast<lbtree::LBTree<M>*>(idx.get());
  if (tree == nullptr) {
    ADD_FAILURE() << "an lbtree pool did not open as LBTree<" << M << ">";
    return {};
  }
  tree->set_traditional_inserts(traditional);
  std::mt19937_64 rng(99);
  for (std::size_t i = 0; i < warm; ++i) {
    (void)idx->insert(encode_u64(rng()), encode_u64(i));
    pm::Runtime::end_operation();
  }
  const pm::Counters c0 = pm::Runtime::counters();
  std::size_t done = 0, splits = 0;
  std::uint64_t split_lines = 0;
  for (std::size_t i = 0; i < measured; ++i) {
    const std::uint64_t pm_before = idx->footprint().pm_bytes;
    const std::uint64_t lines_before = pm::Runtime::counters().lines_written;
    if (idx->insert(encode_u64(rng()), encode_u64(i)) == Code::ok) ++done;
    pm::Runtime::end_operation();
    if (idx->footprint().pm_bytes > pm_before) {
      ++splits;
      split_lines += pm::Runtime::counters().lines_written - lines_before;
    }
  }
  const pm::Counters d = pm::Runtime::counters() - c0;
  EXPECT_TRUE(idx->verify().ok());
  LineStats st;
  st.lines_per_insert = static_cast<double>(d.lines_written) / done;
  st.flushes_per_insert = static_cast<double>(d.flushes) / done;
  st.lines_per_plain_insert =
      static_cast<double>(d.lines_written - split_lines) / static_cast<double>(done - splits);
  st.lines_per_split_insert = splits ? static_cast<double>(split_lines) / splits : 0;
  st.split_fraction = static_cast<double>(splits) / done;
  return st;
}

std::size_t env_or(const char* name, std::size_t def) {
  const char* s = std::getenv(name);
  return s != nullptr ? std::strtoull(s, nullptr, 10) : def;
}

TEST(LBTreeLines, Theorem35EntryMovingVsTraditional) {
  const std::size_t n = env_or("PMINDEX_LINES_INSERTS", 50000);
  // A stable tree: the measured inserts land in leaves that are all results of splits.
  const LineStats lb = measure<1>(false, n, n);
  const LineStats tr = measure<1>(true, n, n);
  const double ratio = tr.lines_per_insert / lb.lines_per_insert;
  auto row = [](const char* name, const LineStats& x) {
    std::cout << "  " << name << x.lines_per_insert << " lines/insert (" << x.lines_per_plain_insert
              << " without a split, " << x.lines_per_split_insert << " with one; "
              << 100 * x.split_fraction << "% split), " << x.flushes_per_insert
              << " flushes/insert\n";
  };
  std::cout << "256 B leaves, " << n << " random inserts after " << n << ":\n";
  row("LB+-Tree     ", lb);
  row("traditional  ", tr);
  std::cout << "  ratio        " << ratio << "x (without splits: "
            << tr.lines_per_plain_insert / lb.lines_per_plain_insert << "x)\n";
  // Theorem 3.5: our worst case <= 1.31 line writes per insert (the analysis counts the
  // inserts into split leaves, not the split itself), the traditional best case >= 1.77.
  EXPECT_LE(lb.lines_per_plain_insert, 1.31);
  EXPECT_GE(ratio, 1.35);
  for (bool t : {false, true}) {
    const LineStats m2 = measure<2>(t, n / 2, n / 2);
    const LineStats m4 = measure<4>(t, n / 2, n / 2);
    std::cout << (t ? "  traditional " : "  LB+-Tree    ") << " 512 B: " << m2.lines_per_insert
              << "  1 KiB: " << m4.lines_per_insert << " lines/insert\n";
  }
}

}  // namespace
}  // namespace pmindex

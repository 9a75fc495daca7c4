// The randomized test kit every index uses (issue 27): a checker that wraps an Index, mirrors
// every operation into a std::map (the model) and compares every answer, in the shape of
// Abseil's base_checker. One copy of the "random ops against std::map" loop for all indexes.
//
// How to use it (a new index needs only its options and, if it likes, its own key generator):
//
//   Options o = ...;                    // small nodes, so every SMO happens within a few ops
//   o.path = dir.file("t.pool");        // a path makes reopen() possible; "" keeps it in DRAM
//   MapChecker c(o);                    // opens (creates) the index; ASSERT_TRUE(c.ok())
//   ASSERT_TRUE(c.insert(k, v));        // each op: run on the index and the model, compare
//   ASSERT_TRUE(c.scan(k, 7));          //   codes, values, scan order; an AssertionResult
//   ASSERT_TRUE(c.verify());
//   ASSERT_TRUE(c.reopen(/*clean=*/false));  // destroy without close, recover, compare all
//
//   RandomPlan plan;                    // or the random driver: phases of weighted op mixes
//   plan.phases = {grow_phase(2000), shrink_phase(2000)};
//   const RandomStats st = c.run(plan, keys, values);   // keys/values: std::function(rng)
//   EXPECT_GT(st.grew, 0u);             // the PM footprint grew (an SMO allocated): splits
//   EXPECT_GT(st.shrank, 0u);           // ... and shrank (leaves freed): the test proves both
//
// run() calls verify() after every op by default (plan.verify_every), and always after an op
// that changed the PM footprint (an SMO: a split allocates, a merge or leaf removal frees), then
// compares the whole content (every key found, one full scan) at the end of each phase.
// Operation failures name the op number, the op and the key (PrintToString), so a failing
// seed can be replayed by hand. The model is the truth: a test may read it (model()) and
// seed it with bulk_load().
//
// Scans start at `lowest_key` to list everything: "" for indexes that accept it as a scan
// start (all do for scan; set it for an index that refuses a key shorter than 8 bytes).
//
// Thread safety: test code, single-threaded.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <iterator>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pmindex/index.h"

namespace pmindex::testing {

using Model = std::map<std::string, std::string>;
using Gen = std::function<std::string(std::mt19937_64&)>;

enum class Op : int { insert, upsert, update, remove, find, scan, count };

// One phase of the random driver: `ops` operations drawn with these relative weights.
struct Phase {
  int ops = 0;
  int weight[static_cast<int>(Op::count)] = {2, 0, 1, 1, 1, 1};
  std::size_t max_scan = 40;  // scan lengths 0..max_scan (cut-offs inside and across nodes)
  // Chance that an update / remove / find takes a key the model holds instead of a fresh draw:
  // over a key domain much larger than the live set, removes of drawn keys mostly miss, and a
  // "shrink" phase would never drain a leaf.
  double existing = 0;
};

// Inserts dominate: the structure grows (splits, expansions).
inline Phase grow_phase(int ops) { return Phase{ops, {4, 1, 1, 1, 1, 1}, 40, 0}; }
// The usual mix: inserts, upserts, updates, removes, finds and scans equally likely-ish.
inline Phase mixed_phase(int ops) { return Phase{ops, {2, 1, 1, 1, 1, 1}, 40, 0}; }
// Removes of live keys among updates, finds and scans, no inserts: the structure drains (with
// inserts mixed in, a large key domain settles at a live set that never empties a leaf), so
// merges and leaf removals happen.
inline Phase shrink_phase(int ops) { return Phase{ops, {0, 0, 1, 4, 1, 1}, 40, 0.95}; }

struct RandomPlan {
  std::vector<Phase> phases;
  std::uint64_t seed = 1;
  int verify_every = 1;          // verify() every n ops (1: after each); 0: only after SMOs
  // verify() after every op that changed the PM footprint, and count those ops (RandomStats
  // grew / shrank). Off: footprint() is not called (it walks every node in some indexes).
  bool verify_after_smo = true;
};

struct RandomStats {
  std::size_t ops = 0;
  std::size_t grew = 0;    // ops after which the PM footprint grew (an SMO allocated)
  std::size_t shrank = 0;  // ops after which it shrank (a node or record was freed)
  std::size_t verifies = 0;
};

class MapChecker {
 public:
  // Opens (or creates) the index named by `options`; check ok() before use.
  explicit MapChecker(Options options) : options_(std::move(options)) { open(); }
  // Wraps an index the test built (e.g. a deliberately broken wrapper, test_map_checker.cpp);
  // reopen() opens `options` through Index::open.
  MapChecker(std::unique_ptr<Index> idx, Options options)
      : options_(std::move(options)), idx_(std::move(idx)) {}

  bool ok() const { return idx_ != nullptr; }
  const Status& open_status() const { return open_status_; }
  Index& index() { return *idx_; }
  const Model& model() const { return model_; }
  const Options& options() const { return options_; }
  void set_lowest_key(std::string k) { lowest_key_ = std::move(k); }

  ::testing::AssertionResult insert(const std::string& k, const std::string& v) {
    const bool fresh = !model_.count(k);
    const Code got = idx_->insert(k, v);
    if (got == Code::ok && fresh) model_[k] = v;
    return expect_code("insert", k, got, fresh ? Code::ok : Code::already_present);
  }
  ::testing::AssertionResult upsert(const std::string& k, const std::string& v) {
    const Code got = idx_->upsert(k, v);
    if (got == Code::ok) model_[k] = v;
    return expect_code("upsert", k, got, Code::ok);
  }
  ::testing::AssertionResult update(const std::string& k, const std::string& v) {
    auto it = model_.find(k);
    const Code got = idx_->update(k, v);
    if (got == Code::ok && it != model_.end()) it->second = v;
    return expect_code("update", k, got, it == model_.end() ? Code::not_found : Code::ok);
  }
  ::testing::AssertionResult remove(const std::string& k) {
    const bool present = model_.erase(k) != 0;
    return expect_code("remove", k, idx_->remove(k), present ? Code::ok : Code::not_found);
  }
  ::testing::AssertionResult find(const std::string& k) {
    auto it = model_.find(k);
    std::string got;
    const Code c = idx_->find(k, &got);
    if (auto r = expect_code("find", k, c, it == model_.end() ? Code::not_found : Code::ok); !r)
      return r;
    if (it != model_.end() && got != it->second)
      return fail("find", k) << ": value " << ::testing::PrintToString(got) << ", model has "
                             << ::testing::PrintToString(it->second);
    return ::testing::AssertionSuccess();
  }
  // scan(k, n) returns the first n model records at or after k, in order, keys and values.
  ::testing::AssertionResult scan(const std::string& k, std::size_t n) {
    const std::size_t got = idx_->scan(k, n, buf_);
    if (got != buf_.size()) return fail("scan", k) << ": returned " << got << ", buffer holds "
                                                   << buf_.size();
    auto it = model_.lower_bound(k);
    std::size_t j = 0;
    for (; j < got; ++j, ++it) {
      if (it == model_.end()) return fail("scan", k) << ": record " << j << " beyond the model";
      if (buf_.key(j) != it->first || buf_.value(j) != it->second)
        return fail("scan", k) << ": record " << j << " is "
                               << ::testing::PrintToString(std::make_pair(
                                      std::string(buf_.key(j)), std::string(buf_.value(j))))
                               << ", model has " << ::testing::PrintToString(*it);
    }
    if (got < n && it != model_.end())
      return fail("scan", k) << ": stopped at " << got << " of " << n << " with "
                             << ::testing::PrintToString(it->first) << " still to come";
    return ::testing::AssertionSuccess();
  }
  // Bulk-loads `sorted` (ascending, unique) into the index and the model.
  ::testing::AssertionResult bulk_load(const Model& sorted, double fill) {
    std::vector<KeyValue> kvs;
    kvs.reserve(sorted.size());
    for (const auto& [k, v] : sorted) kvs.push_back({k, v});
    if (Status s = idx_->bulk_load(kvs, fill); !s.ok())
      return ::testing::AssertionFailure() << "bulk_load: " << s.to_string();
    for (const auto& [k, v] : sorted) model_[k] = v;
    return check_all();
  }
  ::testing::AssertionResult verify() {
    if (Status s = idx_->verify(); !s.ok())
      return ::testing::AssertionFailure() << "verify after op " << op_no_ << ": "
                                           << s.to_string();
    return ::testing::AssertionSuccess();
  }
  // Every model key found with its value, and one scan from the lowest key lists exactly the
  // model (no extra record, none missing, in order).
  ::testing::AssertionResult check_all() {
    for (const auto& [k, v] : model_)
      if (auto r = find(k); !r) return r;
    if (auto r = scan(lowest_key_, model_.size() + 5); !r) return r;
    if (buf_.size() != model_.size())
      return ::testing::AssertionFailure() << "full scan lists " << buf_.size()
                                           << " records, the model holds " << model_.size();
    return ::testing::AssertionSuccess();
  }
  // Closes the index (clean) or destroys it without close (as a crash leaves it), opens the
  // pool again (recovery), and checks the recorded shutdown state, the records recovery counted
  // (where it counts them), the content and verify().
  ::testing::AssertionResult reopen(bool clean) {
    if (options_.path.empty())
      return ::testing::AssertionFailure() << "reopen needs a pool file (options.path)";
    if (clean) {
      if (Status s = idx_->close(); !s.ok())
        return ::testing::AssertionFailure() << "close: " << s.to_string();
    }
    idx_.reset();
    open();
    if (!ok()) return ::testing::AssertionFailure() << "reopen: " << open_status_.to_string();
    if (idx_->recovery_stats().clean_shutdown != clean)
      return ::testing::AssertionFailure() << "recovery_stats().clean_shutdown is "
                                           << !clean << " after a " << (clean ? "clean" : "crash")
                                           << " reopen";
    const RecoveryStats rs = idx_->recovery_stats();
    if (rs.records_counted && rs.records != model_.size())
      return ::testing::AssertionFailure() << "recovery counted " << rs.records
                                           << " records, the model holds " << model_.size();
    // Content first: an index with lazy recovery (APEX) must answer before its walk ends.
    if (auto r = check_all(); !r) return r;
    return verify();
  }

  // One random operation of kind `op` on key `k`.
  ::testing::AssertionResult apply(Op op, const std::string& k, const std::string& v,
                                   std::size_t scan_len) {
    ++op_no_;
    switch (op) {
      case Op::insert: return insert(k, v);
      case Op::upsert: return upsert(k, v);
      case Op::update: return update(k, v);
      case Op::remove: return remove(k);
      case Op::find: return find(k);
      default: return scan(k, scan_len);
    }
  }

  // The random driver: the phases of `plan` in order, verify() as the plan says, the whole
  // content compared at the end of each phase. Stops at the first mismatch, reported as one
  // gtest failure (ADD_FAILURE) naming the op.
  RandomStats run(const RandomPlan& plan, const Gen& keys, const Gen& values) {
    RandomStats st;
    std::mt19937_64 rng(plan.seed);
    std::uint64_t bytes = idx_->footprint().pm_bytes;
    for (const Phase& ph : plan.phases) {
      std::discrete_distribution<int> pick(std::begin(ph.weight), std::end(ph.weight));
      for (int i = 0; i < ph.ops; ++i, ++st.ops) {
        const Op op = static_cast<Op>(pick(rng));
        const std::string k = pick_key(op, ph, rng, keys);
        const std::string v = values(rng);
        const std::size_t len = std::uniform_int_distribution<std::size_t>(0, ph.max_scan)(rng);
        if (auto r = apply(op, k, v, len); !r) {
          ADD_FAILURE() << r.message();
          return st;
        }
        const std::uint64_t now = plan.verify_after_smo ? idx_->footprint().pm_bytes : bytes;
        const bool smo = now != bytes;
        st.grew += now > bytes;
        st.shrank += now < bytes;
        bytes = now;
        if ((plan.verify_every > 0 && st.ops % plan.verify_every == 0) ||
            (plan.verify_after_smo && smo)) {
          ++st.verifies;
          if (auto r = verify(); !r) {
            ADD_FAILURE() << r.message();
            return st;
          }
        }
      }
      for (auto r : {verify(), check_all()}) {
        if (!r) {
          ADD_FAILURE() << r.message();
          return st;
        }
      }
    }
    std::cout << options_.kind << ": " << st.ops << " random ops, footprint grew after "
              << st.grew << ", shrank after " << st.shrank << ", " << st.verifies
              << " verify() calls, " << model_.size() << " records at the end\n";
    return st;
  }

 private:
  void open() {
    auto r = Index::open(options_);
    open_status_ = r.ok() ? Status() : r.status();
    if (r.ok()) idx_ = std::move(r).value();
  }
  std::string pick_key(Op op, const Phase& ph, std::mt19937_64& rng, const Gen& keys) const {
    const bool reads_live = op == Op::update || op == Op::remove || op == Op::find;
    if (!reads_live || model_.empty() ||
        std::uniform_real_distribution<double>(0, 1)(rng) >= ph.existing)
      return keys(rng);
    const auto at = std::uniform_int_distribution<std::size_t>(0, model_.size() - 1)(rng);
    return std::next(model_.begin(), static_cast<std::ptrdiff_t>(at))->first;
  }
  ::testing::AssertionResult fail(const char* op, const std::string& k) const {
    return ::testing::AssertionFailure() << "op " << op_no_ << " " << op << "("
                                         << ::testing::PrintToString(k) << ")";
  }
  ::testing::AssertionResult expect_code(const char* op, const std::string& k, Code got,
                                         Code want) const {
    if (got == want) return ::testing::AssertionSuccess();
    return fail(op, k) << ": " << to_string(got) << ", model says " << to_string(want);
  }

  Options options_;
  std::unique_ptr<Index> idx_;
  Status open_status_;
  Model model_;
  ScanBuffer buf_;
  std::string lowest_key_;
  std::size_t op_no_ = 0;
};

// Opens (creates) an index for a test that drives it by hand; a gtest failure and nullptr if
// the open fails.
inline std::unique_ptr<Index> open_or_die(const Options& o) {
  auto r = Index::open(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Generators shared by the ports: 8-byte values with the top bit set (reserved-bit corner),
// and keys of a bounded domain so inserts, updates and removes hit existing keys.
inline std::string top_bit_value(std::mt19937_64& rng) {
  return encode_u64(rng() | (std::uint64_t{1} << 63));
}

}  // namespace pmindex::testing

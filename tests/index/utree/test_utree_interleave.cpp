// The original uTree's lost-key race, reproduced deterministically with the crash simulator's
// scheduler (include/pmindex/crash/scheduler.h) against a known-bad instantiation that
// publishes before it links (Protocol::kPublishBeforeLink: the original's order), and shown
// absent from ours over the same schedules.
//
// Keys 10 and 40 are in the list; thread 0 inserts 20, thread 1 inserts 30. In the original's
// order thread 0 enters 20 in the DRAM leaf and unlocks before linking; thread 1 then takes
// 20's node as its predecessor (a DRAM snapshot) and links 30 behind it; thread 0 finally
// writes 20.next from its own read of 10.next and links 20 - 30 is gone from the list (still
// in the DRAM leaf, so lookups find it until the next restart). The scheduler hands the baton
// over at the operations' scheduling points ("utree.*" and lock spins); each seed is one
// interleaving.
#include <gtest/gtest.h>

#include <iostream>

#include "index/utree/utree_recovery.h"
#include "pmindex/crash/scheduler.h"

namespace pmindex::utree {

struct PublishBeforeLink : Protocol {
  static constexpr bool kPublishBeforeLink = true;
};
template class UTree<PublishBeforeLink>;

namespace {

// Turns the operations' own scheduling points into baton hand-overs; PM stores are not
// scheduling points here, so a seed picks among few, meaningful interleavings.
class YieldSink final : public pm::TraceSink {
 public:
  explicit YieldSink(crash::Scheduler& s) : sched_(s) {}
  void on_store(const void*, std::size_t) override {}
  void on_flush(const void*, std::size_t) override {}
  void on_fence() override {}
  void on_yield_point(std::string_view tag) override {
    if (tag.starts_with("utree.") || tag == "optlock.spin" || tag == "olc.restart") sched_.yield();
  }

 private:
  crash::Scheduler& sched_;
};

struct Outcome {
  std::vector<std::string> list;
  bool verified = false;
  bool found_30 = false;
};

template <class Policy>
Outcome run(std::uint64_t seed) {
  Options o;
  o.kind = "utree";
  o.node_size = 512;
  pm::PoolOptions po;
  po.size = 1 << 20;
  po.mode = pm::Mode::adr;
  po.layout = layout_for(o);
  auto pool = pm::Pool::create(po);
  EXPECT_TRUE(pool.ok());
  auto created = UTree<Policy>::create(std::move(pool).value(), o);
  EXPECT_TRUE(created.ok());
  std::unique_ptr<Index> idx = std::move(created).value();
  EXPECT_EQ(idx->insert(encode_u64(10), encode_u64(10)), Code::ok);
  EXPECT_EQ(idx->insert(encode_u64(40), encode_u64(40)), Code::ok);
  crash::Scheduler sched(seed);
  YieldSink sink(sched);
  pm::Runtime::set_trace_sink(&sink);
  Code c0 = Code::corrupted, c1 = Code::corrupted;
  sched.run({[&] { c0 = idx->insert(encode_u64(20), encode_u64(20)); },
             [&] { c1 = idx->insert(encode_u64(30), encode_u64(30)); }});
  pm::Runtime::set_trace_sink(nullptr);
  EXPECT_EQ(c0, Code::ok);
  EXPECT_EQ(c1, Code::ok);
  Outcome out;
  out.list = dynamic_cast<UTree<Policy>&>(*idx).list_keys_for_testing();
  out.verified = idx->verify().ok();
  out.found_30 = idx->find(encode_u64(30), nullptr) == Code::ok;
  return out;
}

constexpr std::uint64_t kSeeds = 256;

TEST(UTreeLostKey, PublishBeforeLinkLosesAKey) {
  std::size_t lost = 0;
  std::uint64_t first = 0;
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    const Outcome r = run<PublishBeforeLink>(seed);
    if (r.list.size() < 4) {
      if (lost++ == 0) first = seed;
      EXPECT_FALSE(r.verified) << "verify() missed a key absent from the list";
    }
  }
  std::cout << "publish-before-link lost a key in " << lost << " of " << kSeeds
            << " schedules (first: seed " << first << ")\n";
  EXPECT_GT(lost, 0u);
  if (first != 0) {  // the same seed loses it again: the reproduction is deterministic
    const Outcome again = run<PublishBeforeLink>(first);
    EXPECT_EQ(again.list.size(), 3u);
    EXPECT_TRUE(again.found_30) << "the lost key is still in the DRAM leaf";
  }
}

TEST(UTreeLostKey, LinkBeforePublishNeverLosesOne) {
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    const Outcome r = run<Protocol>(seed);
    ASSERT_EQ(r.list.size(), 4u) << "seed " << seed;
    ASSERT_TRUE(r.verified) << "seed " << seed;
  }
}

}  // namespace
}  // namespace pmindex::utree

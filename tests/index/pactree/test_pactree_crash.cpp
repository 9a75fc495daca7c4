// PACTree under the crash simulator through its IndexRegistry entry (generic driver), ADR and
// eADR. Data nodes of 4 slots split every few inserts, so every split step (S1-S7, the log
// entry's two writes, the search-layer apply) and every insert/remove/update step is a crash
// point; recovery (R1: log repair) runs on each image and is itself crashed. Bytes keys add PM
// key records and anchor records (K1-K3). Sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode
// in CI; `long` runs 10,000). Replay a failure with the printed token:
//   PMINDEX_CRASH_REPLAY='pactree4.adr/<seed>/<op>/<point>/<choice>' ./test_pactree_crash
#include <gtest/gtest.h>

#include <cstring>

#include "index/common/hybrid_test_support.h"
#include "index/pactree/pactree.h"

namespace pmindex::crash {
namespace {

// SMOs counted by the data-node count: "nodes+" is a split, "nodes-" a merge.
crash_kit::SmoTally::Levels split_levels(const Index& idx) {
  return {{"nodes", dynamic_cast<const pactree::PacTree&>(idx).node_count_for_testing()}};
}

void run(unsigned slots, KeyType kt, pm::Mode mode, std::size_t ops) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "pactree";
  r.options.node_size = pactree::kHeaderBytes + slots * pactree::kSlotBytes;
  r.options.key_type = kt;
  r.options.max_key_size = 8;
  r.key_space = 40;
  r.mode = mode;
  r.min_ops = ops;
  r.recovery_crash_images = 40;  // crashes during recovery's repairs (R1, R3)
  r.probe = split_levels;
  r.smos = {"nodes+", "nodes-"};
  r.label = "pactree" + std::to_string(slots) + (kt == KeyType::bytes ? ".bytes." : ".") +
            std::string(pm::to_string(mode));
  hybrid_test::run_registry_crash(r);
}

TEST(CrashPacTree, Slots4Adr) { run(4, KeyType::u64, pm::Mode::adr, 200); }
TEST(CrashPacTree, Slots4Eadr) { run(4, KeyType::u64, pm::Mode::eadr, 200); }
TEST(CrashPacTree, Slots4BytesAdr) { run(4, KeyType::bytes, pm::Mode::adr, 200); }
TEST(CrashPacTree, Slots4BytesEadr) { run(4, KeyType::bytes, pm::Mode::eadr, 200); }

// The driver must catch a pactree-specific loss: cutting the list after the head in every
// image drops records that completed operations wrote.
TEST(CrashPacTree, DriverCatchesLostRecords) {
  Options o;
  o.kind = "pactree";
  o.node_size = pactree::kHeaderBytes + 4 * pactree::kSlotBytes;
  hybrid_test::expect_driver_catches(
      o, 40,
      [](std::span<char> image) {
        const std::uint64_t root = pm::image_root(image.data());
        std::uint64_t head = 0;
        if (root == 0 || root + 16 > image.size()) return;
        std::memcpy(&head, image.data() + root + offsetof(pactree::Root, head), 8);
        if (head == 0 || head + 16 > image.size()) return;
        std::memset(image.data() + head + offsetof(pactree::NodeHeader, next), 0, 8);
      },
      "pactree.tampered");
}

}  // namespace
}  // namespace pmindex::crash

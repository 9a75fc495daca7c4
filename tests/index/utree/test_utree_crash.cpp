// uTree under the crash simulator through its IndexRegistry entry (generic driver), ADR and
// eADR. DRAM leaves of 64 B (2 entries) make every insert's predecessor search cross leaves and
// every other insert split (DRAM only: the list layer sees no SMO); 512 B leaves keep most
// predecessors in the same leaf. Bytes keys add PM key records (K1-K3). Sized by
// PMINDEX_CRASH_IMAGES (about 1,000 per mode in CI; `long` runs 10,000), seeded by
// PMINDEX_CRASH_SEED. Replay a failure with the printed token:
//   PMINDEX_CRASH_REPLAY='utree64.adr/<seed>/<op>/<point>/<choice>' ./test_utree_crash
#include <gtest/gtest.h>

#include <cstring>

#include "index/common/hybrid_test_support.h"
#include "index/utree/layout.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, KeyType kt, pm::Mode mode, std::size_t ops) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "utree";
  r.options.node_size = node_size;
  r.options.key_type = kt;
  r.options.max_key_size = 8;
  r.key_space = 40;
  r.mode = mode;
  r.min_ops = ops;
  r.recovery_crash_images = 40;  // crashes during recovery's repairs (R2)
  r.label = "utree" + std::to_string(node_size) + (kt == KeyType::bytes ? ".bytes." : ".") +
            std::string(pm::to_string(mode));
  hybrid_test::run_registry_crash(r);
}

TEST(CrashUTree, Leaf64Adr) { run(64, KeyType::u64, pm::Mode::adr, 200); }
TEST(CrashUTree, Leaf64Eadr) { run(64, KeyType::u64, pm::Mode::eadr, 200); }
TEST(CrashUTree, Leaf512Adr) { run(512, KeyType::u64, pm::Mode::adr, 200); }
TEST(CrashUTree, Leaf512Eadr) { run(512, KeyType::u64, pm::Mode::eadr, 200); }
TEST(CrashUTree, Leaf64BytesAdr) { run(64, KeyType::bytes, pm::Mode::adr, 200); }
TEST(CrashUTree, Leaf64BytesEadr) { run(64, KeyType::bytes, pm::Mode::eadr, 200); }

// The crash driver and the kill harness must both catch a utree-specific loss: cutting the
// list after its first node in every image or killed pool (its next zeroed) would drop records
// that completed operations wrote; recovery refuses the zeroed link (R1t), and each checker
// must report either outcome as a failure.
TEST(CrashUTree, DriverAndKillHarnessCatchLostRecords) {
  Options o;
  o.kind = "utree";
  o.node_size = 64;
  hybrid_test::expect_checkers_catch(
      o,
      [](std::span<char> image) {
        std::uint64_t root = 0, first = 0;
        root = pm::image_root(image.data());
        if (root == 0 || root + 16 > image.size()) return;
        std::memcpy(&first, image.data() + root + 8, 8);
        first = utree::link_target(first);
        if (first == 0 || first + 8 > image.size()) return;
        std::memset(image.data() + first, 0, 8);  // next = 0
      },
      "utree");
}

}  // namespace
}  // namespace pmindex::crash

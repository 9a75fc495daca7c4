// The cost of an epoch guard (include/pmindex/sync/epoch.h): pin + unpin pairs on one manager,
// nothing retired, one thread.
//
//   build/release/bench/epoch_pin [participant|scoped|pin|two|none] [pairs]     (default: pin 10000000)
//
//   participant  through an explicit Participant (EpochManager::attach), held by the thread
//   scoped       EpochManager::pin(), as an index operation does, while the thread holds a
//                Participant (what Index::attach_thread's ThreadScope did)
//   pin          EpochManager::pin() with no Participant held
//   two          EpochManager::pin() alternating between two managers (the thread cache
//                holds both)
//   none         the same loop and call without a pin: the harness cost to subtract
//
// Prints ns per pair. Instructions per pair: run under `valgrind --tool=callgrind` with two
// pair counts and divide the difference of the totals by the difference of the counts.
//
// Issue 16, release flags (-O3 -DNDEBUG), callgrind, instructions per pair including the
// loop and the call (`none` is that harness alone):
//                 none  participant  scoped  pin   two
//   before          8       43         89    311   313   (pin: attach + detach per pair)
//   after           7       39         45     45    47
// So pin + unpin went from ~81 (through a ThreadScope) or ~303 plus a membarrier (without
// one) to ~38 instructions, with or without a Participant.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pmindex/sync/epoch.h"

namespace {

using pmindex::sync::EpochManager;

// noinline: one call per pair, the shape of an index operation that pins once.
[[gnu::noinline]] void pin_once(EpochManager& epochs) { const auto guard = epochs.pin(); }
[[gnu::noinline]] void pin_once(EpochManager::Participant& me) { const auto guard = me.pin(); }
[[gnu::noinline]] void no_pin(EpochManager& epochs) { asm volatile("" : : "r"(&epochs) : "memory"); }

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "pin";
  const std::uint64_t pairs = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 10'000'000;
  EpochManager a;
  EpochManager b;
  EpochManager::Participant me;
  if (std::strcmp(mode, "participant") == 0 || std::strcmp(mode, "scoped") == 0) me = a.attach();
  pin_once(a);  // the first pin registers the thread: keep it out of the timed loop
  pin_once(b);
  const auto start = std::chrono::steady_clock::now();
  if (std::strcmp(mode, "participant") == 0) {
    for (std::uint64_t i = 0; i < pairs; ++i) pin_once(me);
  } else if (std::strcmp(mode, "pin") == 0 || std::strcmp(mode, "scoped") == 0) {
    for (std::uint64_t i = 0; i < pairs; ++i) pin_once(a);
  } else if (std::strcmp(mode, "two") == 0) {
    for (std::uint64_t i = 0; i < pairs; ++i) pin_once((i & 1) != 0 ? a : b);
  } else if (std::strcmp(mode, "none") == 0) {
    for (std::uint64_t i = 0; i < pairs; ++i) no_pin((i & 1) != 0 ? a : b);
  } else {
    std::fprintf(stderr, "usage: epoch_pin [participant|scoped|pin|two|none] [pairs]\n");
    return 2;
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %llu pairs, %.2f ns per pair\n", mode, static_cast<unsigned long long>(pairs),
              ns / static_cast<double>(pairs));
  return 0;
}

// pair_log.h as a pmbench plugin: a shared library that registers its kinds when pmbench loads it.
//
//   pmbench --plugin ./libpair_log_plugin.so pair_log -n 100000 -p 100000
//
// Build it as a MODULE library compiled with pmindex's headers and compile definitions but NOT
// linked with pmindex: it then uses the pmindex code inside pmbench (which exports its symbols),
// so the registry, the persistence counters and the epoch state are pmbench's own (see
// examples/CMakeLists.txt).
#include "pair_log.h"
#include "pmindex/index.h"

extern "C" pmindex::Status pmindex_register_plugin() {
  return pmindex::IndexRegistry::add(pair_log::PairLog<>::entry("pair_log"));
}

// DPTree: the production instantiation and the registry entry points. Operations and merge:
// dptree_impl.h; recovery, bulk load and verify(): dptree_recovery.h.
#include <cstdlib>
#include <string_view>

#include "index/dptree/dptree_recovery.h"

namespace pmindex::dptree {

template class DPTree<Protocol>;

pm::Layout layout_for(const Options& o) {
  return pm::Layout{"dptree", o.node_size == 0 ? static_cast<std::uint32_t>(leaf_bytes(kDefaultSlots))
                                               : o.node_size,
                    o.key_type, 0};
}

std::size_t default_pool_size(const Options& o) {
  // Slots of 17 B (16 B + fingerprint) at ~70 % fill, leaf metadata, the log of a 7 % buffer
  // (64 B per record), twice that for allocator slack and the merge's fresh leaves.
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * 64);
}

Status validate(const Options& o) {
  if (o.node_size != 0 && slots_for(o.node_size) == 0)
    return Status(Code::invalid_argument,
                  "dptree node_size (base leaf bytes) must be one of 320, 448, 704, 1216, 2304, "
                  "4480 (8..256 slots)");
  if (o.key_type == KeyType::bytes)
    return Status(Code::invalid_argument,
                  "dptree keys are 8 bytes (u64 or f64) in this version; variable-length keys "
                  "are not implemented yet");
  if (o.max_value_size != 8)
    return Status(Code::invalid_argument, "dptree values are exactly 8 bytes (max_value_size 8)");
  return Status::Ok();
}

namespace {
// The registry's Config: the paper's defaults; the merge mode from Options::dptree.merge, or
// when that is automatic from PMINDEX_DPTREE_MERGE (background | sync; unset: Config's
// default, background, synchronous in the tracing flavour). Not stored in the pool: each open
// picks its own.
Config registry_config(const Options& o) {
  Config c;
  switch (o.dptree.merge) {
    case DPTreeOptions::Merge::background: c.background = true; break;
    case DPTreeOptions::Merge::synchronous: c.background = false; break;
    case DPTreeOptions::Merge::automatic:
      if (const char* m = std::getenv("PMINDEX_DPTREE_MERGE"); m != nullptr) {
        if (std::string_view(m) == "background") c.background = true;
        if (std::string_view(m) == "sync") c.background = false;
      }
      break;
  }
  c.print_stats = o.dptree.stats;
  return c;
}
}  // namespace

Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  return DPTree<Protocol>::create(std::move(pool), o, registry_config(o));
}

Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  return DPTree<Protocol>::recover(std::move(pool), o, registry_config(o));
}

}  // namespace pmindex::dptree

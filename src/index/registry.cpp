// The built-in index kinds. An index adds one line here (explicit registration: static
// self-registration would be dropped by the linker from a static library).
#include "index/apex/apex.h"
#include "index/fptree/fptree.h"
#include "index/lbtree/lbtree.h"
#include "index/nbtree/nbtree.h"
#include "index/reflist/reflist.h"
#include "pmindex/index.h"

namespace pmindex {

const std::vector<IndexRegistry::Entry>& IndexRegistry::entries() {
  static const std::vector<Entry> kEntries = {
      {"reflist", "reference index: persistent sorted list with a DRAM map over it",
       &reflist::RefList::layout_for, &reflist::RefList::validate,
       &reflist::RefList::default_pool_size,
       &reflist::RefList::create, &reflist::RefList::recover},
      {"apex", "APEX: persistent learned index (probe-and-stash, DRAM accelerators, logged SMOs)",
       &apex::Apex::layout_for, &apex::Apex::validate, &apex::Apex::default_pool_size,
       &apex::Apex::create,
       &apex::Apex::recover},
      {"lbtree", "LB+-Tree: PM leaves (256 B x m) with entry moving and logless splits, DRAM inner nodes",
       &lbtree::layout_for, &lbtree::validate, &lbtree::default_pool_size, &lbtree::create,
       &lbtree::recover},
      {"nbtree", "NBTree: lock-free two-layer-leaf B+-tree (DRAM metadata, PM key-value layer)",
       &nbtree::NBTree::layout_for, &nbtree::NBTree::validate, &nbtree::NBTree::default_pool_size,
       &nbtree::NBTree::create, &nbtree::NBTree::recover},
      fptree::registry_entry(),
  };
  return kEntries;
}

const IndexRegistry::Entry* IndexRegistry::find(std::string_view name) {
  for (const Entry& e : entries())
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<std::string> IndexRegistry::names() {
  std::vector<std::string> out;
  for (const Entry& e : entries()) out.push_back(e.name);
  return out;
}

}  // namespace pmindex

// The index kinds: the built-in ones (an index adds one line here: explicit registration, since
// static self-registration would be dropped by the linker from a static library), and the kinds
// added at run time by code outside the library (IndexRegistry::add).
#include "index/apex/apex.h"
#include "index/common/traits.h"
#include "index/dptree/dptree.h"
#include "index/fptree/fptree.h"
#include "index/lbtree/lbtree.h"
#include "index/nbtree/nbtree.h"
#include "index/pactree/pactree.h"
#include "index/part/part.h"
#include "index/reflist/reflist.h"
#include "index/roart/roart.h"
#include "index/utree/utree.h"

#include <deque>
#include <mutex>
#include "pmindex/index.h"

namespace pmindex {
namespace {

const std::vector<IndexRegistry::Entry>& builtin_entries() {
  using Entry = IndexRegistry::Entry;
  static const std::vector<Entry> kEntries = {
      {"reflist", "reference index: persistent sorted list with a DRAM map over it",
       &reflist::RefList::layout_for, &reflist::RefList::validate,
       &reflist::RefList::default_pool_size,
       &reflist::RefList::create, &reflist::RefList::recover,
       {.architecture = "sorted list; PM (records) + DRAM (std::map over them)",
        .node_structure = "one record per list node, key and value inline",
        .concurrency = "one mutex (reference index, not concurrent)",
        .variable_keys = "inlined",
        .allocator = traits::kPmindexAllocator,
        .numa = "no",
        .recovery = "walk of the list; DRAM map rebuilt"}},
      {"apex", "APEX: persistent learned index (probe-and-stash, DRAM accelerators, logged SMOs)",
       &apex::Apex::layout_for, &apex::Apex::validate, &apex::Apex::default_pool_size,
       &apex::Apex::create,
       &apex::Apex::recover,
       {.architecture = "learned index (ALEX); PM (inner and data nodes) + DRAM (accelerators)",
        .node_structure = "gapped arrays placed by linear models; probe-and-stash; fingerprints "
                          "and overflow buckets in DRAM",
        .concurrency = "optimistic node versions + node locks (paper section 5); HTM not used",
        .variable_keys = "no: 8-byte integer or double keys (models need numbers)",
        .allocator = traits::kPmindexAllocatorStartNow,
        .numa = "no",
        .recovery = "instant: DRAM state rebuilt lazily on first touch"}},
      {"lbtree", "LB+-Tree: PM leaves (256 B x m) with entry moving and logless splits, DRAM inner nodes",
       &lbtree::layout_for, &lbtree::validate, &lbtree::default_pool_size, &lbtree::create,
       &lbtree::recover,
       {.architecture = "B+-tree; DRAM (inner) + PM (leaf)",
        .node_structure = "unsorted 256 B x m leaves; 1-byte fingerprints in the header line; "
                          "alternate headers (logless split)",
        .concurrency = "optimistic locks (inner) + leaf versions and locks (HTM in the paper)",
        .variable_keys = "pointer (PM key records)",
        .allocator = traits::kPmindexAllocator,
        .numa = "no",
        .recovery = "leaf-chain walk and inner-node rebuild, in parallel"}},
      {"nbtree", "NBTree: lock-free two-layer-leaf B+-tree (DRAM metadata, PM key-value layer)",
       &nbtree::NBTree::layout_for, &nbtree::NBTree::validate,
       &nbtree::NBTree::default_pool_size,
       &nbtree::NBTree::create, &nbtree::NBTree::recover,
       {.architecture = "B+-tree; DRAM (inner, leaf metadata) + PM (leaf key-value layer)",
        .node_structure = "two-layer leaf: unsorted PM slots + DRAM metadata with fingerprints",
        .concurrency = "CAS on leaves (an SMO drains in-flight writers); versioned inner "
                       "nodes; cooperative SMOs",
        .variable_keys = "pointer (PM key records)",
        .allocator = traits::kPmindexAllocator,
        .numa = "no",
        .recovery = "leaf-chain walk; DRAM layer rebuilt"}},
      fptree::registry_entry(),
      {"utree", "uTree: DRAM B+-tree (array layer) over a persistent sorted linked list, one PM node per record",
       &utree::layout_for, &utree::validate, &utree::default_pool_size, &utree::create,
       &utree::recover,
       {.architecture = "B+-tree over a linked list; DRAM (inner and leaf array layer) + PM "
                        "(list layer, one node per record)",
        .node_structure = "sorted DRAM leaves of (key or 8-byte prefix, 32-bit node index); PM "
                          "list nodes of 24 B (integer keys) or 32 B (prefix + key record)",
        .concurrency = "optimistic locks (inner nodes and DRAM leaves); lock-free list links "
                       "(CAS, mark bit, dirty bit persisted by whoever acts on it)",
        .variable_keys = "pointer (PM key records, 8-byte prefix in the node)",
        .allocator = traits::kPmindexAllocator,
        .numa = "no",
        .recovery = "walk of the list; DRAM array layer rebuilt"}},
      part::Part::registry_entry(),
      pactree::PacTree::registry_entry(),
      roart::Roart::registry_entry(),
      {"dptree", "DPTree: DRAM buffer B+-tree + PM write-ahead log over a versioned PM base tree (synchronous merge)",
       &dptree::layout_for, &dptree::validate, &dptree::default_pool_size, &dptree::create,
       &dptree::recover,
       {.architecture = "differential: DRAM buffer B+-tree (+ Bloom filter, PM redo log) over a "
                        "base tree of PM leaves with a DRAM inner layer",
        .node_structure = "hashed 256-slot PM leaves with 1-byte fingerprints and two metadata "
                          "versions switched by one global version bit",
        .concurrency = "reader-writer lock; merges synchronous in the writer (first landing)",
        .variable_keys = "no: 8-byte keys in this version (planned: DRAM copies in the buffer, "
                         "PM key records in the base)",
        .allocator = traits::kPmindexAllocator,
        .numa = "no",
        .recovery = "leaf-chain walk of the current version, inner layer rebuilt, log replayed "
                    "into a new buffer"}},
  };
  return kEntries;
}

// Kinds added at run time. A deque, so find()'s pointers stay valid while more are added.
struct AddedKinds {
  std::mutex mu;
  std::deque<IndexRegistry::Entry> entries;
};

AddedKinds& added_kinds() {
  static AddedKinds* kinds = new AddedKinds;  // never destroyed: find() may run at exit
  return *kinds;
}

// A kind name is stored in the pool header's 16-byte kind field (NUL-padded) and used in file
// names by tools, so it is short and plain.
bool valid_kind_name(std::string_view name) {
  if (name.empty() || name.size() > 15) return false;
  for (char ch : name)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
  return true;
}

}  // namespace

std::vector<IndexRegistry::Entry> IndexRegistry::entries() {
  std::vector<Entry> out = builtin_entries();
  AddedKinds& added = added_kinds();
  std::lock_guard lock(added.mu);
  out.insert(out.end(), added.entries.begin(), added.entries.end());
  return out;
}

const IndexRegistry::Entry* IndexRegistry::find(std::string_view name) {
  for (const Entry& e : builtin_entries())
    if (e.name == name) return &e;
  AddedKinds& added = added_kinds();
  std::lock_guard lock(added.mu);
  for (const Entry& e : added.entries)
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<std::string> IndexRegistry::names() {
  std::vector<std::string> out;
  for (const Entry& e : entries()) out.push_back(e.name);
  return out;
}

bool IndexRegistry::built_in(std::string_view name) {
  for (const Entry& e : builtin_entries())
    if (e.name == name) return true;
  return false;
}

Status IndexRegistry::add(Entry entry) {
  if (!valid_kind_name(entry.name))
    return Status(Code::invalid_argument,
                  "index kind name '" + entry.name + "' must be 1-15 characters of [a-z0-9_]");
  if (entry.layout == nullptr || entry.validate == nullptr || entry.default_pool_size == nullptr ||
      entry.create == nullptr || entry.recover == nullptr)
    return Status(Code::invalid_argument,
                  "index kind '" + entry.name + "': layout, validate, default_pool_size, create "
                  "and recover are all required");
  for (const Entry& e : builtin_entries())
    if (e.name == entry.name)
      return Status(Code::invalid_argument, "index kind '" + entry.name + "' is built in");
  AddedKinds& added = added_kinds();
  std::lock_guard lock(added.mu);
  for (const Entry& e : added.entries)
    if (e.name == entry.name)
      return Status(Code::invalid_argument, "index kind '" + entry.name + "' is already registered");
  added.entries.push_back(std::move(entry));
  return Status::Ok();
}

}  // namespace pmindex

// art::Tree::build: a tree for sorted input, bottom-up (the `part` index's bulk_load; steps B1
// and B2 of src/index/part/PROTOCOL.md). Included by art_tree.h.
#pragma once

#include <vector>

namespace pmindex::art {

// B1: every record and node of the new tree is written and persisted while unreachable (the
// same P1 as an insert's); B2: one persisted store of the root word publishes all of it.
// A crash before B2 leaves the tree empty, and the recovery walk, which marks only what the
// root reaches, lets the allocator reclaim the unreachable blocks; after B2 everything it
// names was persisted first. On failure (pool_full, or a tree that is no longer empty at B2)
// the blocks B1 made are freed here and the tree is unchanged.
template <class P>
template <class KeyAt>
Code Tree<P>::build(std::size_t n, KeyAt key_at, const std::uint64_t* values) {
  if (n == 0) return Code::ok;
  std::vector<Entry> pending;  // the entries of the nodes under construction, root to leaf
  Code code = Code::ok;
  const std::uint64_t top = build_range(0, n, 0, key_at, values, pending, &code);
  if (top == 0) {
    for (const Entry& e : pending) discard(e.word);
    return code;
  }
  Olc o;
  if (!write_lock(*root_lock_, nullptr, o)) {  // the root lock meets no damage: it is volatile
    discard(top);
    return Code::corrupted;
  }
  if (load_word(*root_word_) != 0) {  // a writer got in first: build is for an empty tree
    unlock(*root_lock_);
    discard(top);
    return Code::invalid_argument;
  }
  publish_persist(root_word_, top);  // B2
  unlock(*root_lock_);
  return Code::ok;
}

// The child word for keys [lo, hi) (hi - lo >= 1), all sharing key bytes [0, depth): a record
// for one key, else a node reached at `depth` whose prefix is the keys' common bytes from
// `depth` and whose children are the groups of the next byte (the first key, if it ends
// there, in the end slot). The smallest node type that holds the children. Nodes are
// finished children first, so at most one path of entries is pending (`pending`, for the
// caller to free on failure). Returns 0 on failure with *code set.
template <class P>
template <class KeyAt>
std::uint64_t Tree<P>::build_range(std::size_t lo, std::size_t hi, std::uint32_t depth,
                                   KeyAt& key_at, const std::uint64_t* values,
                                   std::vector<Entry>& pending, Code* code) {
  if (hi - lo == 1) {
    const std::uint64_t ref = build_record(key_at(lo), values[lo], code);
    return ref == 0 ? 0 : record_word(0, ref);
  }
  const std::string_view first = key_at(lo), last = key_at(hi - 1);
  std::uint32_t m = 0;  // sorted input: the first and last keys' common bytes are everyone's
  const std::size_t lim = std::min(first.size(), last.size());
  while (depth + m < lim && first[depth + m] == last[depth + m]) ++m;
  const std::uint32_t branch = depth + m;
  const std::size_t base = pending.size();
  std::size_t i = lo;
  std::uint64_t end = 0;
  if (first.size() == branch) {  // only the smallest key can end here (keys are distinct)
    const std::uint64_t ref = build_record(first, values[lo], code);
    if (ref == 0) return 0;
    end = record_word(0, ref);
    pending.push_back(Entry{0, end, 0});
    ++i;
  }
  const std::size_t first_child = pending.size();
  while (i < hi) {
    const auto b = static_cast<std::uint8_t>(key_at(i)[branch]);
    std::size_t j = i + 1;
    while (j < hi && static_cast<std::uint8_t>(key_at(j)[branch]) == b) ++j;
    const std::uint64_t w = build_range(i, j, branch + 1, key_at, values, pending, code);
    if (w == 0) return 0;
    pending.push_back(Entry{b, w, 0});
    i = j;
  }
  const auto k = static_cast<unsigned>(pending.size() - first_child);
  const NodeType t = k <= capacity_of(NodeType::n4)    ? NodeType::n4
                     : k <= capacity_of(NodeType::n16) ? NodeType::n16
                     : k <= capacity_of(NodeType::n48) ? NodeType::n48
                                                       : NodeType::n256;
  const std::uint64_t nw = new_node(t, make_shape(depth, m), bytes_word(first, depth, m), end,
                                    pending.data() + first_child, k, code, !test_unpersisted_build_);
  if (nw == 0) return 0;
  pending.resize(base);
  return nw;
}

template <class P>
std::uint64_t Tree<P>::build_record(std::string_view key, std::uint64_t value, Code* code) const {
  return new_record(key, value, code, !test_unpersisted_build_);
}

// Frees a subtree that build made and never published (no reader can hold it).
template <class P>
void Tree<P>::discard(std::uint64_t w) const {
  if (is_record(w)) {
    p_.deallocate(target_of(w), record_bytes(record(w)->key_len));
    return;
  }
  const NodeHeader* n = node(w);
  const std::uint64_t end = load_word(n->end);
  if (end != 0) discard(end);
  const std::uint64_t* ch = children_of(n);
  for (unsigned j = 0; j < capacity_of(static_cast<NodeType>(n->type)); ++j)
    if (const std::uint64_t c = load_word(ch[j]); c != 0) discard(c);
  p_.deallocate(target_of(w), node_bytes(static_cast<NodeType>(n->type)));
}

}  // namespace pmindex::art

// The shared DRAM inner-node layer: allocation, SMOs, bulk rebuild and verification.
// Invariants and thread-safety contract: inner_tree.h.
#include "index/common/inner_tree.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>

namespace pmindex::index_common {

namespace {
// Write-locks a node reached under the SMO mutex: such a node is live (only SMOs make nodes
// obsolete, and they are serialised), so the lock cannot ask for a restart.
void lock_live(InnerTree::Node* n) {
  bool restart = false;
  n->lock.writeLockOrRestart(restart);
  if (restart) {
    std::fputs("pmindex: inner tree: an SMO reached an obsolete node\n", stderr);
    std::abort();
  }
}

}  // namespace

InnerTree::InnerTree(unsigned max_keys, pm::DramArena& arena)
    : max_keys_(std::max(2u, max_keys)), node_bytes_(node_bytes_for(std::max(2u, max_keys))),
      arena_(arena) {}

InnerTree::~InnerTree() = default;  // nodes live in the index's arena, released with it

InnerTree::Node* InnerTree::new_node(std::uint32_t lvl) {
  Node* n = nullptr;
  if (!free_nodes_.empty()) {
    n = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    void* p = arena_.allocate(node_bytes_);
    if (p == nullptr) {
      std::fputs("pmindex: out of DRAM for inner nodes\n", stderr);
      std::abort();
    }
    n = new (p) Node{};
  }
  recycle_locked(n->lock);
  set_level(n, lvl);
  set_count(n, 0);
  return n;
}

void InnerTree::retire_node(Node* n) {
  n->lock.writeUnlockObsolete();
  free_nodes_.push_back(n);
}

void InnerTree::init_single(std::uint64_t leaf) {
  auto guard = smo_lock();
  if (Node* old = root_.load(std::memory_order_relaxed)) {
    // Recycle the whole old tree (single-threaded by contract).
    std::vector<Node*> stack{old};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (level(n) > 1)
        for (unsigned i = 0; i <= count(n); ++i)
          stack.push_back(reinterpret_cast<Node*>(children(n)[i]));
      lock_live(n);
      retire_node(n);
    }
  }
  Node* r = new_node(1);
  locked_write(children(r)[0], leaf);
  r->lock.writeUnlock();
  root_.store(r, std::memory_order_release);
}

void InnerTree::bulk_build(std::span<const std::pair<std::uint64_t, std::uint64_t>> items,
                           double fill, unsigned threads) {
  if (items.empty()) return;
  init_single(items[0].second);  // recycles any old tree
  auto guard = smo_lock();
  Node* single = root_.load(std::memory_order_relaxed);
  lock_live(single);
  retire_node(single);

  const unsigned cap = max_keys_ + 1;
  const unsigned per = std::clamp<unsigned>(
      static_cast<unsigned>(std::lround(cap * std::clamp(fill, 0.0, 1.0))), 2, cap);
  // (separator, child) of the level being built; level 1 first.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> level_items(items.begin(), items.end());
  std::uint32_t lvl = 1;
  for (;;) {
    const std::size_t n_nodes = (level_items.size() + per - 1) / per;
    std::vector<Node*> nodes(n_nodes);
    for (auto& n : nodes) n = new_node(lvl);
    auto fill_range = [&](std::size_t from, std::size_t to) {
      for (std::size_t i = from; i < to; ++i) {
        Node* n = nodes[i];
        const std::size_t first = i * per;
        const std::size_t last = std::min(level_items.size(), first + per);
        for (std::size_t j = first; j < last; ++j) {
          locked_write(children(n)[j - first], level_items[j].second);
          if (j > first) locked_write(keys(n)[j - first - 1], level_items[j].first ^ kSignBias);
        }
        set_count(n, static_cast<std::uint32_t>(last - first - 1));
        n->lock.writeUnlock();
      }
    };
    const unsigned t = (lvl == 1 && n_nodes >= 64) ? std::max(1u, threads) : 1u;
    if (t == 1) {
      fill_range(0, n_nodes);
    } else {
      std::vector<std::thread> workers;
      const std::size_t chunk = (n_nodes + t - 1) / t;
      for (unsigned w = 0; w < t; ++w) {
        const std::size_t from = w * chunk, to = std::min(n_nodes, from + chunk);
        if (from < to) workers.emplace_back(fill_range, from, to);
      }
      for (auto& w : workers) w.join();
    }
    if (n_nodes == 1) {
      root_.store(nodes[0], std::memory_order_release);
      return;
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> up(n_nodes);
    for (std::size_t i = 0; i < n_nodes; ++i)
      up[i] = {level_items[i * per].first, reinterpret_cast<std::uint64_t>(nodes[i])};
    level_items.swap(up);
    ++lvl;
  }
}

bool InnerTree::insert_separator(Path& path, std::uint64_t left, std::uint64_t sep,
                                 std::uint64_t right) {
  if (path.empty()) return false;
  const Step& last = path.back();
  if (optimistic_read(children(last.node)[last.index]) != left) return false;
  return insert_at(path, path.size() - 1, sep ^ kSignBias, right);
}

bool InnerTree::insert_separator_hinted(const ParentHint& hint, std::uint64_t left,
                                        std::uint64_t sep, std::uint64_t right) {
  if (hint.node == nullptr) return false;
  // smo_lock serialises every writer of inner nodes, so the version read here stays until we
  // write; the acquire load (checkOrRestart) sees the last SMO's writes, which the lock's
  // acquire already ordered before us. A recycled node restarts above every old version
  // (invariant 3), so an equal version is the same node with the same children.
  bool changed = false;
  hint.node->lock.checkOrRestart(hint.version, changed);
  if (changed) return false;
  Node* n = const_cast<Node*>(hint.node);  // ours to write: smo_lock held, version unchanged
  const unsigned cnt = count(n);
  if (cnt >= max_keys_ || hint.index > cnt) return false;
  if (optimistic_read(children(n)[hint.index]) != left) return false;
  insert_into(n, hint.index, cnt, sep ^ kSignBias, right);
  return true;
}

void InnerTree::insert_into(Node* n, unsigned idx, unsigned cnt, std::uint64_t stored_sep,
                            std::uint64_t right) {
  std::uint64_t* k = keys(n);
  std::uint64_t* c = children(n);
  lock_live(n);
  for (unsigned i = cnt; i > idx; --i) locked_write(k[i], k[i - 1]);
  for (unsigned i = cnt + 1; i > idx + 1; --i) locked_write(c[i], c[i - 1]);
  locked_write(k[idx], stored_sep);
  locked_write(c[idx + 1], right);
  set_count(n, cnt + 1);
  n->lock.writeUnlock();
}

bool InnerTree::insert_at(Path& path, std::size_t depth, std::uint64_t stored_sep,
                          std::uint64_t right) {
  Node* n = path[depth].node;
  const unsigned idx = path[depth].index;
  const unsigned cnt = count(n);
  std::uint64_t* k = keys(n);
  std::uint64_t* c = children(n);
  if (cnt < max_keys_) {
    insert_into(n, idx, cnt, stored_sep, right);
    return true;
  }
  // Split: the node plus the new separator hold cnt + 1 keys; the middle one moves up. The
  // merged copy sits on the stack for nodes of up to kStackKeys keys (every 256 B node): two
  // vectors grown by insert cost LB+-Tree ~250 instructions per insert where nearly every
  // insert splits a leaf (issue 16, callgrind). Larger nodes use the heap.
  constexpr unsigned kStackKeys = 64;
  std::uint64_t stack_k[kStackKeys + 1], stack_c[kStackKeys + 2];
  std::vector<std::uint64_t> heap_k, heap_c;
  std::uint64_t* tk = stack_k;
  std::uint64_t* tc = stack_c;
  if (cnt > kStackKeys) {
    heap_k.resize(cnt + 1);
    heap_c.resize(cnt + 2);
    tk = heap_k.data();
    tc = heap_c.data();
  }
  for (unsigned i = 0; i <= cnt; ++i) tk[i] = i < idx ? k[i] : i == idx ? stored_sep : k[i - 1];
  for (unsigned i = 0; i <= cnt + 1; ++i) tc[i] = i <= idx ? c[i] : i == idx + 1 ? right : c[i - 1];
  const unsigned total = cnt + 1;
  const unsigned mid = total / 2;
  Node* s = new_node(level(n));  // locked until the parent holds its separator (invariant 2)
  for (unsigned i = mid + 1; i < total; ++i) locked_write(keys(s)[i - mid - 1], tk[i]);
  for (unsigned i = mid + 1; i <= total; ++i) locked_write(children(s)[i - mid - 1], tc[i]);
  set_count(s, total - mid - 1);
  lock_live(n);
  for (unsigned i = 0; i < mid; ++i) locked_write(k[i], tk[i]);
  for (unsigned i = 0; i <= mid; ++i) locked_write(c[i], tc[i]);
  set_count(n, mid);
  const std::uint64_t up = tk[mid];
  bool ok = true;
  if (depth == 0) {
    Node* r = new_node(level(n) + 1);
    locked_write(keys(r)[0], up);
    locked_write(children(r)[0], reinterpret_cast<std::uint64_t>(n));
    locked_write(children(r)[1], reinterpret_cast<std::uint64_t>(s));
    set_count(r, 1);
    r->lock.writeUnlock();
    root_.store(r, std::memory_order_release);  // readers of the old root fail validation
  } else {
    ok = insert_at(path, depth - 1, up, reinterpret_cast<std::uint64_t>(s));
  }
  s->lock.writeUnlock();
  n->lock.writeUnlock();
  return ok;
}

bool InnerTree::remove_leaf(Path& path, std::uint64_t leaf, std::uint64_t* dropped,
                            bool join_left) {
  if (path.empty()) return false;
  const Step& last = path.back();
  if (optimistic_read(children(last.node)[last.index]) != leaf) return false;
  std::uint64_t sep = 0;
  if (!remove_at(path, path.size() - 1, &sep, join_left)) return false;
  if (dropped != nullptr) *dropped = sep;
  return true;
}

bool InnerTree::remove_at(Path& path, std::size_t depth, std::uint64_t* dropped,
                          bool join_left) {
  Node* n = path[depth].node;
  const unsigned idx = path[depth].index;
  const unsigned cnt = count(n);
  std::uint64_t* k = keys(n);
  std::uint64_t* c = children(n);
  if (cnt >= 1 && idx == 0 && join_left) {
    // The child's range [lo, keys[0]) joins the left neighbour, which lies under another
    // subtree: the nearest ancestor step with index > 0 holds lo as keys[index - 1]. keys[0]
    // replaces it there (the fence moves up) and leaves n with child 0; lo leaves the tree.
    // Every node from that ancestor down to n is locked before anything changes, the
    // unchanged ones between them included: a reader couples only parent and child, so one
    // that validated the ancestor before the change and read n after it would take n's new
    // child 0 (the right neighbour) for a key now in the left one, unless a node between
    // them fails its validation (the FPTree stress found this with fanout-4 nodes).
    std::size_t d = depth;
    while (d > 0 && path[d - 1].index == 0) --d;
    if (d == 0) return false;  // the first leaf: no left neighbour
    Node* a = path[d - 1].node;
    std::uint64_t* fence = &keys(a)[path[d - 1].index - 1];
    for (std::size_t j = d - 1; j <= depth; ++j) lock_live(path[j].node);
    *dropped = optimistic_read(*fence) ^ kSignBias;
    locked_write(*fence, optimistic_read(k[0]));
    for (unsigned i = 0; i + 1 < cnt; ++i) locked_write(k[i], k[i + 1]);
    for (unsigned i = 0; i < cnt; ++i) locked_write(c[i], c[i + 1]);
    set_count(n, cnt - 1);
    for (std::size_t j = depth + 1; j-- > d - 1;) path[j].node->lock.writeUnlock();
    return true;
  }
  if (cnt >= 1) {
    // Drop the child and one adjacent separator: with idx > 0 the child's range joins its
    // left neighbour (keys[idx-1] goes), with idx == 0 its right neighbour (keys[0] goes).
    const unsigned kdrop = idx > 0 ? idx - 1 : 0;
    *dropped = k[kdrop] ^ kSignBias;
    lock_live(n);
    for (unsigned i = kdrop; i + 1 < cnt; ++i) locked_write(k[i], k[i + 1]);
    for (unsigned i = idx; i < cnt; ++i) locked_write(c[i], c[i + 1]);
    set_count(n, cnt - 1);
    n->lock.writeUnlock();
    return true;
  }
  if (depth == 0) return false;  // the only leaf of the tree
  lock_live(n);
  if (!remove_at(path, depth - 1, dropped, join_left)) {
    n->lock.writeUnlock();
    return false;
  }
  retire_node(n);
  return true;
}

std::uint64_t InnerTree::left_neighbour(const Path& path) const {
  for (std::size_t d = path.size(); d-- > 0;) {
    if (path[d].index == 0) continue;
    std::uint64_t child = optimistic_read(children(path[d].node)[path[d].index - 1]);
    for (std::size_t lvl = level(path[d].node); lvl > 1; --lvl) {
      const Node* n = reinterpret_cast<const Node*>(child);
      child = optimistic_read(children(n)[count(n)]);
    }
    return child;
  }
  return 0;
}

Status InnerTree::verify(
    const std::function<bool(std::uint64_t, std::uint64_t)>& word_less,
    const std::function<Status(std::uint64_t, const std::uint64_t*, const std::uint64_t*)>&
        on_leaf) const {
  const Node* r = root_.load(std::memory_order_acquire);
  if (r == nullptr) return Status(Code::corrupted, "inner tree has no root");
  return verify_node(r, nullptr, nullptr, level(r), word_less, on_leaf);
}

Status InnerTree::verify_node(
    const Node* n, const std::uint64_t* lo, const std::uint64_t* hi, std::uint32_t want_level,
    const std::function<bool(std::uint64_t, std::uint64_t)>& word_less,
    const std::function<Status(std::uint64_t, const std::uint64_t*, const std::uint64_t*)>&
        on_leaf) const {
  const unsigned cnt = count(n);
  if (level(n) != want_level || want_level == 0)
    return Status(Code::corrupted, "inner node at the wrong level");
  if (cnt > max_keys_) return Status(Code::corrupted, "inner node count exceeds the fanout");
  if (OptimisticLock::isLocked(n->lock.peek())) return Status(Code::corrupted, "inner node left locked");
  std::vector<std::uint64_t> k(cnt);  // unbiased copies; the children's fences point into it
  for (unsigned i = 0; i < cnt; ++i) k[i] = keys(n)[i] ^ kSignBias;
  for (unsigned i = 0; i < cnt; ++i) {
    if (i > 0 && !word_less(k[i - 1], k[i]))
      return Status(Code::corrupted, "inner node keys are not strictly increasing");
    if (lo != nullptr && word_less(k[i], *lo))
      return Status(Code::corrupted, "inner node key below its lower fence");
    if (hi != nullptr && !word_less(k[i], *hi))
      return Status(Code::corrupted, "inner node key not below its upper fence");
  }
  for (unsigned i = 0; i <= cnt; ++i) {
    const std::uint64_t* clo = i == 0 ? lo : &k[i - 1];
    const std::uint64_t* chi = i == cnt ? hi : &k[i];
    const std::uint64_t child = children(n)[i];
    Status s = want_level == 1
                   ? on_leaf(child, clo, chi)
                   : verify_node(reinterpret_cast<const Node*>(child), clo, chi, want_level - 1,
                                 word_less, on_leaf);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

void InnerTree::for_each_separator(const std::function<void(std::uint64_t)>& fn) const {
  std::vector<const Node*> stack{root_.load(std::memory_order_acquire)};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (unsigned i = 0; i < count(n); ++i) fn(keys(n)[i] ^ kSignBias);
    if (level(n) > 1)
      for (unsigned i = 0; i <= count(n); ++i)
        stack.push_back(reinterpret_cast<const Node*>(children(n)[i]));
  }
}

std::uint64_t InnerTree::height() const {
  const Node* r = root_.load(std::memory_order_acquire);
  return r == nullptr ? 0 : level(r);
}

}  // namespace pmindex::index_common

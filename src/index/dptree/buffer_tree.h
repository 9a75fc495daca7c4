// DPTree's front buffer: a DRAM B+-tree of (key word, value, tombstone) entries, the shared
// InnerTree (src/index/common/inner_tree.h) over sorted DRAM leaves of 31 entries (the
// original's 512 B pages), plus a Bloom filter sized to the buffer's capacity. Nothing here
// is persistent: the write-ahead log (layout.h) is what makes buffered writes durable.
//
// Thread safety: the owning DPTree serialises writers against readers (its shared_mutex), so
// the tree is read under a shared lock and changed under an exclusive one; the InnerTree's
// optimistic protocol is still followed and costs nothing uncontended. A middle buffer (the
// background merge's input) is never changed: the merge thread reads it without the lock.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "index/common/hybrid_checks.h"
#include "index/common/inner_tree.h"
#include "index/dptree/layout.h"
#include "pmindex/pm/dram_arena.h"

namespace pmindex::dptree {

// Separators per DRAM inner node (256 B nodes), of the base tree's inner layer and of the
// buffer trees. A compile-time count: the descents then count a node with unrolled vector
// compares (InnerTree::descend<kInnerKeys>), not the generic loop.
inline constexpr unsigned kInnerKeys = 14;

// What a buffer entry holds. A blind put (DPTree::upsert, PROTOCOL.md U2) was acknowledged
// without looking below the buffer for the key, so whether it added a record is settled later:
// by the merge that places it, or on demand by DPTree::size().
enum class Kind : std::uint8_t {
  put = 0,
  tombstone = 1,
  blind = 2,
  absent = 3,  // BufferTree::put's answer only: the key had no entry
};

struct BufEntry {
  std::uint64_t key;
  std::uint64_t value;
  bool tombstone;
  bool blind;  // a blind put (never a tombstone)
  Kind kind() const { return tombstone ? Kind::tombstone : blind ? Kind::blind : Kind::put; }
};

class BufferTree {
 public:
  static constexpr unsigned kLeafCap = 31;
  struct Leaf {
    std::uint32_t count;
    std::uint32_t reserved;
    Leaf* next;
    std::uint64_t keys[kLeafCap];
    std::uint64_t values[kLeafCap];
    Kind kind[kLeafCap];
  };

  // An empty tree. A merge replaces the whole tree (DPTree::buffer_) rather than emptying it.
  BufferTree() : inner_(kInnerKeys, arena_) {
    first_ = new_leaf();
    inner_.init_single(reinterpret_cast<std::uint64_t>(first_));
  }
  BufferTree(const BufferTree&) = delete;
  BufferTree& operator=(const BufferTree&) = delete;
  std::size_t size() const { return size_; }
  std::size_t blind() const { return blind_; }  // blind puts held
  void miscount_blind_for_testing() { ++blind_; }  // damage verify() must notice
  std::uint64_t dram_bytes() const { return arena_.bytes_in_use(); }

  // The entry for k, or nullptr.
  const BufEntry* find(std::uint64_t k, BufEntry* out) const {
    const Leaf* l = leaf_for(k);
    const unsigned i = lower(l, k);
    if (i == l->count || l->keys[i] != k) return nullptr;
    *out = entry(l, i);
    return out;
  }

  // Inserts or replaces the entry for k; returns the kind it had (absent: none). A put over a
  // blind put stays blind (the older layers' answer for the key is still unknown), a blind put
  // over a put or a tombstone is a put (the buffer knew the answer).
  Kind put(std::uint64_t k, std::uint64_t v, Kind kind) {
    Leaf* l = const_cast<Leaf*>(leaf_for(k));
    unsigned i = lower(l, k);
    if (i < l->count && l->keys[i] == k) {
      const Kind prior = l->kind[i];
      l->values[i] = v;
      l->kind[i] = kind == Kind::tombstone ? Kind::tombstone
                   : prior == Kind::blind  ? Kind::blind
                                           : Kind::put;
      if (prior == Kind::blind && l->kind[i] != Kind::blind) --blind_;
      return prior;
    }
    if (l->count == kLeafCap) {
      Leaf* r = split(l);
      if (k >= r->keys[0]) l = r;
      i = lower(l, k);
    }
    for (unsigned j = l->count; j > i; --j) {
      l->keys[j] = l->keys[j - 1];
      l->values[j] = l->values[j - 1];
      l->kind[j] = l->kind[j - 1];
    }
    l->keys[i] = k;
    l->values[i] = v;
    l->kind[i] = kind;
    ++l->count;
    ++size_;
    if (kind == Kind::blind) ++blind_;
    return Kind::absent;
  }

  // Calls fn(entry) for entries with key >= k in order until fn returns false.
  template <class Fn>
  void for_each_from(std::uint64_t k, Fn fn) const {
    const Leaf* l = leaf_for(k);
    for (unsigned i = lower(l, k); l != nullptr; l = l->next, i = 0)
      for (; i < l->count; ++i)
        if (!fn(entry(l, i))) return;
  }
  // A position in key order (scan's three-way merge): the entry at (l, i), or none (l null).
  struct Cursor {
    const Leaf* l = nullptr;
    unsigned i = 0;
    bool valid() const { return l != nullptr; }
    std::uint64_t key() const { return l->keys[i]; }
    BufEntry get() const { return entry(l, i); }
    void next() {
      ++i;
      settle();
    }
    void settle() {
      while (l != nullptr && i == l->count) {
        l = l->next;
        i = 0;
      }
    }
  };
  // The first entry with key >= k.
  Cursor cursor(std::uint64_t k) const {
    Cursor c{leaf_for(k), 0};
    c.i = lower(c.l, k);
    c.settle();
    return c;
  }
  std::vector<BufEntry> sorted() const {
    std::vector<BufEntry> out;
    out.reserve(size_);
    for_each_from(0, [&](const BufEntry& e) {
      out.push_back(e);
      return true;
    });
    return out;
  }

  // Leaves sorted and chained, inner fences respected (verify()).
  Status verify(const pm::Pool& pool) const {
    std::size_t n = 0, blind = 0;
    bool have = false;
    std::uint64_t prev = 0;
    for (const Leaf* l = first_; l != nullptr; l = l->next) {
      if (l->count > kLeafCap) return pool.error(Code::corrupted, "verify: buffer leaf overfull");
      for (unsigned i = 0; i < l->count; ++i, ++n) {
        if (have && !(prev < l->keys[i]))
          return pool.error(Code::corrupted, "verify: buffer keys out of order");
        if (l->kind[i] != Kind::put && l->kind[i] != Kind::tombstone && l->kind[i] != Kind::blind)
          return pool.error(Code::corrupted, "verify: buffer entry of no kind");
        blind += l->kind[i] == Kind::blind ? 1 : 0;
        prev = l->keys[i];
        have = true;
      }
    }
    if (n != size_) return pool.error(Code::corrupted, "verify: buffer size differs from its leaves");
    if (blind != blind_)
      return pool.error(Code::corrupted, "verify: buffer's blind-put count differs");
    return inner_.verify([](std::uint64_t a, std::uint64_t b) { return a < b; },
                         [&](std::uint64_t lw, const std::uint64_t* lo, const std::uint64_t* hi) {
                           const Leaf* l = reinterpret_cast<const Leaf*>(lw);
                           for (unsigned i = 0; i < l->count; ++i)
                             if ((lo != nullptr && l->keys[i] < *lo) ||
                                 (hi != nullptr && !(l->keys[i] < *hi)))
                               return pool.error(Code::corrupted,
                                                 "verify: buffer key outside its inner fences");
                           return Status::Ok();
                         });
  }

 private:
  static BufEntry entry(const Leaf* l, unsigned i) {
    return {l->keys[i], l->values[i], l->kind[i] == Kind::tombstone, l->kind[i] == Kind::blind};
  }
  Leaf* new_leaf() {
    void* m = arena_.allocate(sizeof(Leaf));
    if (m == nullptr) index_common::fatal("dptree", "no DRAM for the buffer tree");
    Leaf* l = static_cast<Leaf*>(m);
    l->count = 0;
    l->next = nullptr;
    return l;
  }
  const Leaf* leaf_for(std::uint64_t k) const {
    auto token = [](std::uint64_t) -> std::optional<std::uint64_t> { return 0; };
    return reinterpret_cast<const Leaf*>(
        inner_.descend<kInnerKeys>(index_common::WordProbe{k}, token).first);
  }
  static unsigned lower(const Leaf* l, std::uint64_t k) {
    unsigned i = 0;
    while (i < l->count && l->keys[i] < k) ++i;
    return i;
  }
  Leaf* split(Leaf* l) {
    Leaf* r = new_leaf();
    const unsigned half = l->count / 2;
    for (unsigned i = half; i < l->count; ++i) {
      r->keys[i - half] = l->keys[i];
      r->values[i - half] = l->values[i];
      r->kind[i - half] = l->kind[i];
    }
    r->count = l->count - half;
    l->count = half;
    r->next = l->next;
    l->next = r;
    auto smo = inner_.smo_lock();
    index_common::InnerTree::Path path;
    inner_.path_to<kInnerKeys>(index_common::WordProbe{r->keys[0]}, &path);
    if (!inner_.insert_separator(path, reinterpret_cast<std::uint64_t>(l), r->keys[0],
                                 reinterpret_cast<std::uint64_t>(r)))
      index_common::fatal("dptree", "buffer inner tree refused a separator");
    return r;
  }

  pm::DramArena arena_;
  index_common::InnerTree inner_;
  Leaf* first_ = nullptr;
  std::size_t size_ = 0;
  std::size_t blind_ = 0;
};

// Bloom filter over key words, sized for `capacity` keys at false-positive rate `fp`.
class Bloom {
 public:
  void reset(std::size_t capacity, double fp) {
    const double bits_per_key = -std::log(fp) / (std::log(2.0) * std::log(2.0));
    const std::size_t bits =
        std::max<std::size_t>(64, static_cast<std::size_t>(bits_per_key * capacity));
    words_.assign((bits + 63) / 64, 0);
    hashes_ = std::clamp(static_cast<unsigned>(std::lround(bits_per_key * std::log(2.0))), 1u, 16u);
  }
  void add(std::uint64_t k) {
    for_bits(k, [&](std::size_t b) { words_[b / 64] |= std::uint64_t{1} << (b % 64); });
  }
  bool may_contain(std::uint64_t k) const {
    bool all = true;
    for_bits(k, [&](std::size_t b) { all = all && (words_[b / 64] >> (b % 64) & 1) != 0; });
    return all;
  }
  std::uint64_t dram_bytes() const { return words_.size() * 8; }

 private:
  template <class Fn>
  void for_bits(std::uint64_t k, Fn fn) const {
    const std::uint64_t h = key_hash(k ^ 0x5bd1e9955bd1e995ull);
    const std::uint64_t h1 = h, h2 = (h >> 32) | 1;
    const std::size_t bits = words_.size() * 64;
    for (unsigned i = 0; i < hashes_; ++i) fn((h1 + i * h2) % bits);
  }
  std::vector<std::uint64_t> words_;
  unsigned hashes_ = 1;
};

}  // namespace pmindex::dptree

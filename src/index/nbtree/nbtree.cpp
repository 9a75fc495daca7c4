// NBTree leaf operations: log-structured insert, in-place update and delete, search with
// sync-on-read, key 0's side record and out-of-line values. Steps (I*, U*, D*, R*, W*, Z*, V*)
// are defined in PROTOCOL.md.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>
#include <type_traits>

#include "index/common/node_search.h"
#include "index/common/prefetch.h"
#include "index/common/reclaim.h"
#include "index/nbtree/nbtree.h"
#include "isa.h"

namespace pmindex::nbtree {

std::string_view to_string(HookPoint p) {
  switch (p) {
    case HookPoint::insert_before_commit_cas: return "insert_before_commit_cas";
    case HookPoint::update_before_cas: return "update_before_cas";
    case HookPoint::delete_before_cas: return "delete_before_cas";
    case HookPoint::sync_before_cas: return "sync_before_cas";
    case HookPoint::smo_started: return "smo_started";
    case HookPoint::smo_before_copy_ptr_cas: return "smo_before_copy_ptr_cas";
    case HookPoint::smo_after_copy_ptr: return "smo_after_copy_ptr";
    case HookPoint::smo_drain_wait: return "smo_drain_wait";
    case HookPoint::smo_after_sync: return "smo_after_sync";
    case HookPoint::smo_link_before_pm: return "smo_link_before_pm";
    case HookPoint::smo_link_after_list: return "smo_link_after_list";
    case HookPoint::smo_done: return "smo_done";
    case HookPoint::inner_node_written: return "inner_node_written";
  }
  return "?";
}

using detail::full_fence;
using detail::spin_pause;

NBTree::NBTree(std::unique_ptr<pm::Pool> pool, std::uint32_t node_size, std::uint32_t max_value,
               std::uint32_t max_key)
    : pool_(std::move(pool)),
      node_size_(node_size),
      cap_(static_cast<int>(node_size / sizeof(Entry)) - 1),
      fanout_(std::clamp(static_cast<int>(node_size / 16), 4, Inner::kMaxFanout)),
      max_value_(max_value) {
  mode_ = pool_->mode();
  key_mode_ = pool_->info().layout.key_mode;
  keys_.configure(pool_.get(), key_mode_, max_key);
  bytes_ = keys_.bytes_mode();
  search_avx2_ = isa::search_level() == isa::Level::avx2;
  if (bytes_) first_low_ = seps_.make("");  // "" is the smallest key
}

NBTree::~NBTree() {
  epochs_.drain();
  free_dram();
}

Index::ThreadScope NBTree::attach_thread() {
  auto participant = std::make_shared<sync::EpochManager::Participant>(epochs_.attach());
  return ThreadScope([participant]() mutable { participant.reset(); });
}

// --- keys and values ----------------------------------------------------------------------------

Code NBTree::make_probe(std::string_view key, Probe* p) const {
  if (bytes_) [[unlikely]] {
    if (Code c = keys_.check(key); c != Code::ok) return c;  // key_too_large
    *p = keys_.probe(key);  // fingerprint of the whole key
    return Code::ok;
  }
  if (key.size() != 8) return Code::invalid_argument;
  if (key_mode_ == KeyType::f64 && std::isnan(decode_f64(key))) return Code::invalid_argument;
  p->bytes = key;
  std::uint64_t be;  // inline: one load and a byte swap (issue 16)
  std::memcpy(&be, key.data(), 8);
  p->word = le_to_native(__builtin_bswap64(be));  // big-endian: integer order == memcmp order
  p->fp = fingerprint(p->word);
  return Code::ok;
}

// In bytes mode the probe's bytes point into the PM record, which the caller keeps alive
// (pinned, or quiescent).
NBTree::Probe NBTree::probe_of_word(std::uint64_t key_word) const {
  Probe p;
  if (!bytes_) {
    p.word = key_word;
    p.fp = fingerprint(key_word);
    return p;
  }
  if (!index_common::read_record(*pool_, key_word, keys_.max_key(), &p.bytes)) p.bytes = {};
  p.fp = index_common::fingerprint_bytes(p.bytes);
  return p;
}

// K1 (bytes mode): allocate under L2, then write and persist the record outside the lock.
std::uint64_t NBTree::new_key_record(std::string_view key, Code* code) {
  const std::uint64_t off = pm_allocate(index_common::record_bytes(key.size()), code);
  if (off != 0) index_common::fill_record(*pool_, off, key);
  return off;
}

// K3 (bytes mode): a key record leaves the index only after every slot that named it is gone
// (or it was never committed); a pinned reader may still compare against it, so it is freed
// after an epoch.
void NBTree::retire_key(std::uint64_t key_word) {
  if (!bytes_ || key_word == 0) return;
  epochs_.retire([this, key_word] {
    std::lock_guard<sync::SpinLock> lock(alloc_mu_);
    index_common::free_record(*pool_, key_word);
  });
}

bool NBTree::bound_eq(std::uint64_t a, std::uint64_t b) const {
  if (a == b || !bytes_) return a == b;
  if (a == 0 || b == 0 || a == kNoHigh || b == kNoHigh) return false;
  return index_common::SeparatorStore::view(a) == index_common::SeparatorStore::view(b);
}

std::uint64_t NBTree::make_bound(std::string_view key_bytes, std::uint64_t key_word) {
  return keys_.separator_for(key_bytes, key_word, seps_);
}

NBTree::Probe NBTree::probe_of_bound(std::uint64_t bound) const {
  Probe p;
  if (bytes_) p.bytes = index_common::SeparatorStore::view(bound);
  else p.word = bound;
  return p;
}

// V1-V3: the common path keeps an 8-byte value below 2^61 inline; everything else goes to a
// record that is written and persisted before its offset can be published.
Code NBTree::encode_value(std::string_view value, std::uint64_t* word) {
  if (value.size() == 8) {
    const std::uint64_t be = decode_u64(value);
    if (be < kInlineLimit) {
      *word = be;
      return Code::ok;
    }
    std::uint64_t le = 0;
    std::memcpy(&le, value.data(), 8);
    le = le_to_native(le);
    if (le < kInlineLimit) {
      *word = le | kLittleEndian;
      return Code::ok;
    }
  }
  if (value.size() > max_value_) return Code::value_too_large;
  Code code = Code::ok;
  const std::size_t bytes = sizeof(ValueRecord) + value.size();
  const std::uint64_t off = pm_allocate(bytes, &code);
  if (off == 0) return code;
  auto* rec = pool_->at<ValueRecord>(off);
  pm::store(rec, ValueRecord{static_cast<std::uint32_t>(value.size()), 0});  // V2
  pm::copy(rec + 1, value.data(), value.size());
  pm::persist(rec, bytes);                                                  // V3
  *word = kOutOfLine | off;
  return Code::ok;
}

// read_value's uncommon case (a record value other than 8 bytes, or a caller's string that
// does not hold 8 bytes yet).
void NBTree::read_record_value(std::uint64_t word, std::string* out) const {
  const auto* rec = pool_->at<ValueRecord>(payload_of(word) & ~kOutOfLine);
  out->assign(reinterpret_cast<const char*>(rec + 1), rec->length);
}

void NBTree::free_value(std::uint64_t word) {
  const std::uint64_t p = payload_of(word);
  if ((p & kOutOfLine) == 0) return;
  const std::uint64_t off = p & ~kOutOfLine;
  pm_free(off, sizeof(ValueRecord) + pool_->at<ValueRecord>(off)->length);
}

// V4: a replaced record is freed once no pinned reader can still dereference it.
void NBTree::retire_value(std::uint64_t word) {
  const std::uint64_t p = payload_of(word);
  if ((p & kOutOfLine) == 0) return;
  epochs_.retire([this, word] { free_value(word); });
}

std::uint8_t NBTree::fingerprint(std::uint64_t key) {
  std::uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return static_cast<std::uint8_t>(h >> 56);
}

// --- leaf search --------------------------------------------------------------------------------

// The descent is a template over the key order, so the u64 path compares integers directly
// (one branch per operation picks the instantiation, in find_leaf):
//   U64Order:   key >= bound, key > (inclusive) high.
//   BytesOrder: memcmp order against SeparatorStore words; `strict` stands for "the keys just
//               below `key`" (the link phase's predecessor of a leaf's low, S10). A torn
//               inner-node snapshot (N2) may hold a 0 word past the count: it compares as
//               anything, and validation discards the result. Bound words are loaded with
//               acquire (kLoad) because they are dereferenced before N2's fence: the writer's
//               release fence (InnerWrite, N1) then orders the bound's creation before the read.
namespace {
using index_common::prefetch_lines;

// kIsa: the form of the inner nodes' vector count (node_search.h, docs/isa.md).
template <index_common::SearchIsa kIsaArg>
struct U64OrderIsa {
  static constexpr index_common::SearchIsa kIsa = kIsaArg;
  static constexpr std::memory_order kLoad = std::memory_order_relaxed;
  static constexpr unsigned kSearchWindow = 16;  // compares are cheap: count (node_search.h)
  std::uint64_t key;
  bool ge(std::uint64_t bound) const { return key >= bound; }
  bool above(std::uint64_t high) const { return key > high; }
};
using U64Order = U64OrderIsa<index_common::kBuiltIsa>;
template <class O>
inline constexpr bool kIsU64Order = false;
template <index_common::SearchIsa I>
inline constexpr bool kIsU64Order<U64OrderIsa<I>> = true;
struct BytesOrder {
  static constexpr std::memory_order kLoad = std::memory_order_acquire;
  static constexpr unsigned kSearchWindow = 0;  // compares read key bytes: binary steps only
  std::string_view key;
  bool strict;
  bool ge(std::uint64_t bound) const {
    if (bound == 0) return false;
    const std::string_view b = index_common::SeparatorStore::view(bound);
    return strict ? key > b : key >= b;
  }
  bool above(std::uint64_t high) const {
    if (high == kNoHigh || high == 0) return false;
    const std::string_view h = index_common::SeparatorStore::view(high);
    return strict ? key > h : key >= h;
  }
};
}  // namespace

template <class Order>
Leaf* NBTree::resolve(Leaf* leaf, const Order& order) {
  // A leaf whose link phase finished is no longer in the tree; its copy covers the same range.
  while ((leaf->flag.load(std::memory_order_acquire) & Leaf::kLinked) != 0) {
    const SmoDesc* d = leaf->copy_ptr.load(std::memory_order_acquire);
    leaf = (d->count == 2 && order.ge(d->split)) ? d->leaves[1] : d->leaves[0];
  }
  return leaf;
}

Leaf* NBTree::find_leaf(const Probe& p) const {
  if (bytes_) return descend(BytesOrder{p.bytes, false});
  return descend(U64Order{p.word});
}

Leaf* NBTree::find_leaf_before(std::uint64_t low) const {
  if (bytes_) return descend(BytesOrder{index_common::SeparatorStore::view(low), true});
  return descend(U64Order{low - 1});
}

// Inlined into each caller (issue 16): a lookup's descent has no call per level.
template <class Order>
[[gnu::always_inline]] inline Leaf* NBTree::descend(const Order& order) const {
  Inner* node = root_node_.load(std::memory_order_acquire);
  for (;;) {
    Inner* right = nullptr;
    void* child = snapshot(node, order, &right);
    if (right != nullptr) {
      node = right;
      continue;
    }
    if (node->level == 1) {
      // The lines a lookup reads first (flag and bitmap, then the fingerprints), together.
      prefetch_lines(child, 2 * 64);
      return resolve(static_cast<Leaf*>(child), order);
    }
    node = static_cast<Inner*>(child);
    prefetch_lines(node, sizeof(Inner));  // all at once: the search touches lines at random
  }
}

// N2: one validated snapshot of the node: the child covering the key, or (N3, *right set) the
// right sibling to move to when the key lies above the node's high.
template <class Order>
[[gnu::always_inline]] inline void* NBTree::snapshot(const Inner* node, const Order& order,
                                                     Inner** right) {
  for (;;) {
    const std::uint64_t v1 = node->version.load(std::memory_order_acquire);
    if ((v1 & 1) != 0) {
      spin_pause("nbtree.inner.read");
      continue;
    }
    void* child = nullptr;
    *right = nullptr;
    if (order.above(node->high.load(Order::kLoad))) {
      *right = node->sibling.load(std::memory_order_relaxed);  // N3: B-link move right
    } else {
      // The last i with keys[i] <= key (keys[0] is the node's low): 1 + the number of
      // keys[1..n) <= key, by node_search.h (integer keys count the last 16 slots). A torn
      // snapshot may be unsorted; the search still ends, and the version check below throws
      // its result away.
      const int count = node->count.load(std::memory_order_relaxed);
      unsigned lo = 1;
      if constexpr (kIsU64Order<Order>) {
        // Integer keys: fixed binary steps over the 63 separators, then the vector window
        // (issue 16). It reads keys[1 .. 64] (keys[64] is children[0]: still inside the node)
        // and counts at most 63 whatever count a torn snapshot read, so no clamp is needed.
        static_assert(sizeof(Inner::keys[0]) == 8 &&
                      std::atomic<std::uint64_t>::is_always_lock_free);
        static_assert(((Inner::kMaxFanout - 1) & Inner::kMaxFanout) == 0,
                      "count_u64_not_above's fixed steps (capacity 2^m - 1)");
        lo += index_common::count_u64_not_above<Inner::kMaxFanout - 1, false, Order::kIsa>(
            reinterpret_cast<const std::uint64_t*>(&node->keys[1]),
            static_cast<unsigned>(count) - 1u, order.key);
      } else {
        const int n = std::clamp(count, 1, Inner::kMaxFanout);
        const auto sep = [node](unsigned i) { return node->keys[1 + i].load(Order::kLoad); };
        const auto below = [&order](std::uint64_t s) { return !order.ge(s); };
        lo += index_common::count_not_above<Order::kSearchWindow>(
            static_cast<unsigned>(n - 1), Inner::kMaxFanout - 1, sep, below);
      }
      child = node->children[lo - 1].load(std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (node->version.load(std::memory_order_relaxed) == v1) return child;
  }
}

// The committed slot holding `key`, or -1. Fingerprints are compared 32 at a time with AVX2;
// without it (ThreadSanitizer builds, the baseline PMINDEX_ISA) eight at a time: in
// x = word ^ (fp repeated), a byte is zero exactly where the fingerprint matches; the exact
// zero-byte test sets 0x80 in those bytes, and the multiply gathers the eight flags into one
// byte (bit 8j moves to bit 56 + j; no two partial products meet, so nothing carries).
// One branch on the key mode per call; the candidate loop of each mode compares directly.
int NBTree::find_slot(const Leaf* leaf, const Probe& p, std::uint64_t bitmap,
                      std::uint64_t* key_word) const {
  return bytes_ ? find_slot_in<true>(leaf, p, bitmap, key_word)
                : find_slot_in<false>(leaf, p, bitmap, key_word);
}

template <bool kBytes, index_common::SearchIsa I>
[[gnu::always_inline]] inline int NBTree::find_slot_in(const Leaf* leaf, const Probe& p,
                                                       std::uint64_t bitmap,
                                                       std::uint64_t* key_word) const {
  const std::uint64_t committed = bitmap & ~Leaf::kSmoBit;
  if (committed == 0) return -1;
  std::uint64_t cand = 0;
#if defined(PMINDEX_NODE_SEARCH_AVX2)
  if constexpr (I == index_common::SearchIsa::avx2) {
    // 32 fingerprints per compare (the SWAR loop below took ~100 instructions a lookup, issue
    // 16). A vector load of words writers update with relaxed atomics is safe for the reasons
    // node_search.h gives: it only names candidate slots, each of which is then read with an
    // acquire load and compared in full. The baseline form and a ThreadSanitizer build take
    // the SWAR loop.
    const auto* v = reinterpret_cast<const char*>(&leaf->fpw[0]);  // 64 B aligned
    cand = (std::uint64_t{index_common::avx2::match_bytes(v + 32, p.fp)} << 32) |
           index_common::avx2::match_bytes(v, p.fp);
  } else
#endif
  {
    constexpr std::uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full;
    const std::uint64_t pattern = 0x0101010101010101ull * p.fp;
    const int words = (64 - __builtin_clzll(committed) + 7) / 8;
    for (int w = 0; w < words; ++w) {
      const std::uint64_t x = leaf->fpw[w].load(std::memory_order_relaxed) ^ pattern;
      const std::uint64_t zero = ~(((x & kLow7) + kLow7) | x | kLow7);  // 0x80 where x's byte is 0
      cand |= (((zero >> 7) * 0x0102040810204080ull) >> 56) << (8 * w);
    }
  }
  cand &= committed;
  const Entry* e = entries(leaf);
  while (cand != 0) {
    const int i = __builtin_ctzll(cand);
    cand &= cand - 1;
    const std::uint64_t k = pm::load_acquire(&e[i].key);
    if (kBytes ? k != 0 && keys_.matches(k, p) : k == p.word) {
      if (key_word != nullptr) *key_word = k;
      return i;
    }
    if (k == 0 && adr() && leaf->pending[i].load(std::memory_order_seq_cst) != 0 &&
        fault_ != Fault::skip_reader_persist) [[unlikely]] {
      // R4: a delete of this slot is in flight and may not be durable yet. The caller is
      // about to report "not found" (or insert the key again): write the line back first, so
      // no completed operation observes a delete a crash can still undo.
      pm::persist(&e[i], sizeof(Entry));
      reader_persists_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return -1;
}

// Every write of a committed slot (update, delete, and the sync CASes) counts itself in
// pending[slot] (W2, R1). seq_cst, sequenced before the PM CAS (release): a reader that sees
// the new word sees this increment (or the decrement that follows the write-back), and the
// SMO's drain (S8b) that set the seal first sees it.
void NBTree::begin_write(Leaf* leaf, int slot) const {
  pm::yield_point("nbtree.pending.inc");
  leaf->pending[slot].fetch_add(1, std::memory_order_seq_cst);
}

void NBTree::end_write(Leaf* leaf, int slot, const void* line) const {
  pm::persist(line, sizeof(Entry));  // U3 / D3 / S7: one write-back of the entry's line
  leave_write(leaf, slot);
}

// W2: an update or delete registers on its slot, then checks the seal (S8a). A writer that
// does not see the seal is seen by the drain (S8b): both sides store, then load, seq_cst. It
// stays registered through its sync-on-write (W1), so by the time the new leaves become
// reachable for direct writes (S13) every write of the old leaf has reached them.
bool NBTree::enter_write(Leaf* leaf, int slot) const {
  begin_write(leaf, slot);
  if ((leaf->flag.load(std::memory_order_seq_cst) & Leaf::kSealed) == 0) return true;
  leave_write(leaf, slot);
  return false;
}

void NBTree::leave_write(Leaf* leaf, int slot) const {
  pm::yield_point("nbtree.pending.dec");
  // release: the writes (and write-backs) before it happen-before a drain that sees 0.
  leaf->pending[slot].fetch_sub(1, std::memory_order_release);
}

// --- insert ---------------------------------------------------------------------------------------

// I2: waits until no lower slot is claimed-but-unannounced or pending with the same key.
// Returns true if the smo bit appeared meanwhile (the caller gives up its slot).
bool NBTree::wait_for_lower_inserts(const Leaf* leaf, int slot, const Probe& p) const {
  for (int j = 0; j < slot; ++j) {
    for (;;) {
      const std::uint8_t st = leaf->state[j].load(std::memory_order_acquire);
      if (st == Leaf::kDone) break;
      // Bytes mode: the announced word is the other insert's key record (K1 before I2; it is
      // retired through the epochs, so it stays readable while we are pinned).
      if (st == Leaf::kPending && !is_key(leaf->keys[j].load(std::memory_order_relaxed), p))
        break;
      if ((leaf->bitmap.load(std::memory_order_acquire) & Leaf::kSmoBit) != 0) return true;
      spin_pause("nbtree.insert.wait");
    }
  }
  return false;
}

Code NBTree::insert_word(const Probe& p, std::uint64_t key, std::uint64_t word) {
  const std::uint8_t fp = p.fp;
  for (;;) {
    Leaf* leaf = find_leaf(p);
    std::uint64_t b = leaf->bitmap.load(std::memory_order_acquire);
    if ((b & Leaf::kSmoBit) != 0) {  // C1: cooperative SMO, then retry
      // Someone else's SMO (a split, or a merge, M): whatever it did, retry. If it rolled
      // back for want of space (S2x) or gave up (a merge, M2x) the leaf is as before; a full
      // one sends this insert through its own S1 below, which answers pool_full.
      help_smo(leaf);
      if (leaf->copy_ptr.load(std::memory_order_acquire) == nullptr) {
        spin_pause("nbtree.insert.retry");
      }
      continue;
    }
    if (find_slot(leaf, p, b) >= 0) return Code::already_present;
    pm::yield_point("nbtree.insert.faa");
    const std::uint32_t s = leaf->num.fetch_add(1, std::memory_order_acq_rel);  // I1
    if (s >= static_cast<std::uint32_t>(cap_)) {
      pm::yield_point("nbtree.smo.bit");
      leaf->bitmap.fetch_or(Leaf::kSmoBit, std::memory_order_seq_cst);  // S1
      help_smo(leaf);
      if (leaf->copy_ptr.load(std::memory_order_acquire) == nullptr) return Code::pool_full;
      continue;
    }
    const int slot = static_cast<int>(s);
    // I2: announce the key, then wait for lower slots that announce the same key (or have
    // not announced yet). The lowest such insert decides; two committed copies of one key
    // can never exist, and at most one uncommitted copy is ever written to PM.
    pm::yield_point("nbtree.insert.announce");
    leaf->keys[slot].store(key, std::memory_order_relaxed);
    leaf->state[slot].store(Leaf::kPending, std::memory_order_release);
    const bool smo = wait_for_lower_inserts(leaf, slot, p);
    Entry* e = &entries(leaf)[slot];
    bool written = false;
    b = leaf->bitmap.load(std::memory_order_acquire);
    for (;;) {
      if (smo || (b & Leaf::kSmoBit) != 0) {
        // I7: the commit CAS can never succeed once the smo bit is set. Withdraw the PM copy
        // so no uncommitted entry outlives this attempt, then help and retry.
        if (written) {
          std::uint64_t expected = key;
          pm::cas(&e->key, expected, 0);
          pm::persist(e, sizeof(Entry));
        }
        leaf->state[slot].store(Leaf::kDone, std::memory_order_release);
        break;
      }
      if (find_slot(leaf, p, b) >= 0) {
        if (written) {  // unreachable by I2; withdrawn defensively
          std::uint64_t expected = key;
          pm::cas(&e->key, expected, 0);
          pm::persist(e, sizeof(Entry));
        }
        leaf->state[slot].store(Leaf::kDone, std::memory_order_release);
        return Code::already_present;
      }
      if (!written) {
        pm::store(&e->value, word);          // I3: value first
        pm::publish(&e->key, key);           // I4: key = durability point (eADR)
        if (fault_ != Fault::skip_insert_persist) [[likely]] {
          pm::persist(e, sizeof(Entry));     // I5: ADR: the one write-back; eADR: fence
        }
        leaf->set_fp(slot, fp);
        written = true;
      }
      hook(HookPoint::insert_before_commit_cas, leaf);
      pm::yield_point("nbtree.insert.commit");
      // I6: commit. acq_rel: the fingerprint and the entry are visible to whoever sees the bit.
      if (leaf->bitmap.compare_exchange_weak(b, b | (std::uint64_t{1} << slot),
                                             std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
        leaf->state[slot].store(Leaf::kDone, std::memory_order_release);
        return Code::ok;
      }
    }
    // I7: the bit is another thread's (this insert claimed a slot below capacity): retry as
    // C1 does.
    help_smo(leaf);
    if (leaf->copy_ptr.load(std::memory_order_acquire) == nullptr) {
      spin_pause("nbtree.insert.retry");
    }
  }
}

// --- update / delete --------------------------------------------------------------------------------

Code NBTree::update_word(const Probe& p, std::uint64_t word, std::uint64_t* old_word) {
  for (;;) {
    Leaf* leaf = find_leaf(p);
    std::uint64_t key = 0;
    const int slot = find_slot(leaf, p, leaf->bitmap.load(std::memory_order_acquire), &key);
    if (slot < 0) return Code::not_found;
    if (!enter_write(leaf, slot)) {  // W2: sealed, its new leaves take the write: help, retry
      help_smo(leaf);
      continue;
    }
    Entry* e = &entries(leaf)[slot];
    std::uint64_t cur = pm::load_acquire(&e->value);
    bool ok = false;
    for (;;) {
      if (pm::load_acquire(&e->key) != key) break;  // deleted meanwhile: linearised after it
      hook(HookPoint::update_before_cas, leaf);
      pm::yield_point("nbtree.update.cas");
      if (pm::cas(&e->value, cur, word)) {  // U2: in-place update, clean word
        ok = true;
        break;
      }
    }
    pm::persist(e, sizeof(Entry));  // U3
    if (ok) {
      full_fence();
      *old_word = cur;
      // V4: the record this update replaced is ours to free only if no SMO can have copied it.
      if ((leaf->bitmap.load(std::memory_order_seq_cst) & Leaf::kSmoBit) == 0) retire_value(cur);
      if (const SmoDesc* d = leaf->copy_ptr.load(std::memory_order_seq_cst)) {
        sync_slot(leaf, slot, d);  // W1: sync-on-write
      }
    }
    leave_write(leaf, slot);  // W2: after W1
    return ok ? Code::ok : Code::not_found;
  }
}

Code NBTree::remove_key(const Probe& p) {
  for (;;) {
    Leaf* leaf = find_leaf(p);
    std::uint64_t key = 0;
    const int slot = find_slot(leaf, p, leaf->bitmap.load(std::memory_order_acquire), &key);
    if (slot < 0) return Code::not_found;
    if (!enter_write(leaf, slot)) {  // W2: sealed, its new leaves take the delete: help, retry
      help_smo(leaf);
      continue;
    }
    Entry* e = &entries(leaf)[slot];
    hook(HookPoint::delete_before_cas, leaf);
    pm::yield_point("nbtree.delete.cas");
    std::uint64_t expected = key;
    const bool ok = pm::cas(&e->key, expected, 0);  // D2: key := empty
    std::uint64_t v = 0;
    if (ok) {
      // D2b: an out-of-line value is taken out of the slot too, so exactly one thread frees it.
      v = pm::load_acquire(&e->value);
      while ((payload_of(v) & kOutOfLine) != 0 && !pm::cas(&e->value, v, 0)) {
      }
    }
    pm::persist(e, sizeof(Entry));  // D3
    bool merge = false;
    if (ok) {
      leaf->deleted.fetch_add(1, std::memory_order_relaxed);  // M0's live count
      full_fence();
      if ((leaf->bitmap.load(std::memory_order_seq_cst) & Leaf::kSmoBit) == 0) {
        retire_value(v);
        retire_key(key);  // K3 (bytes mode), under V4's rule
        merge = true;
      }
      if (const SmoDesc* d = leaf->copy_ptr.load(std::memory_order_seq_cst)) {
        sync_slot(leaf, slot, d);  // W1: sync-on-write of the deletion
      }
    }
    leave_write(leaf, slot);  // W2: after W1
    if (merge) maybe_merge(leaf);  // M0 (optional; after W2, so its drain never waits for us)
    return ok ? Code::ok : Code::not_found;
  }
}

// --- search ------------------------------------------------------------------------------------------

Code NBTree::find_word(const Probe& p, std::uint64_t* word) const {
  return find_in_leaf(find_leaf(p), p, word);
}

Code NBTree::find_in_leaf(Leaf* leaf, const Probe& p, std::uint64_t* word) const {
  return bytes_ ? find_in_leaf_t<true>(leaf, p, word) : find_in_leaf_t<false>(leaf, p, word);
}

template <bool kBytes, index_common::SearchIsa I>
[[gnu::always_inline]] inline Code NBTree::find_in_leaf_t(Leaf* leaf, const Probe& p,
                                                          std::uint64_t* word) const {
  std::uint64_t key = 0;
  int slot = find_slot_in<kBytes, I>(leaf, p, leaf->bitmap.load(std::memory_order_acquire), &key);
  if (slot < 0) return Code::not_found;
  for (;;) {
    std::uint64_t k = 0;
    const std::uint64_t w = read_word(leaf, slot, &k);
    if (k != key) return Code::not_found;
    // R2: the value was read before copy_ptr; if there is none yet, any writer of what we
    // read wrote before copy_ptr was published and the sync phase carries it over.
    full_fence();
    const SmoDesc* d = leaf->copy_ptr.load(std::memory_order_seq_cst);
    if (d == nullptr) {
      *word = w;
      return Code::ok;
    }
    if (d->map_leaf[slot] == 0xff) {  // deleted before the copy: the read above saw it live
      *word = w;                      // only if it raced the delete; linearised before it
      return Code::ok;
    }
    sync_slot(leaf, slot, d);  // R3: sync-on-read, then read the new leaf
    const int m = d->map_slot[slot];
    leaf = d->leaves[d->map_leaf[slot]];
    slot = m;
  }
}

// --- key 0 (side record in the root) -------------------------------------------------------------

Code NBTree::zero_insert(std::uint64_t word) {
  std::lock_guard<sync::SpinLock> lock(zero_mu_);
  if (root_->zero_present != 0) return Code::already_present;
  pm::publish(&root_->zero_value, word);  // Z1
  pm::persist(&root_->zero_value, 8);
  pm::publish(&root_->zero_present, 1);   // Z2
  pm::persist(&root_->zero_present, 8);
  return Code::ok;
}

Code NBTree::zero_update(std::uint64_t word) {
  std::lock_guard<sync::SpinLock> lock(zero_mu_);
  if (root_->zero_present == 0) return Code::not_found;
  const std::uint64_t old = root_->zero_value;
  pm::publish(&root_->zero_value, word);  // Z3
  pm::persist(&root_->zero_value, 8);
  free_value(old);  // readers of key 0 hold zero_mu_
  return Code::ok;
}

Code NBTree::zero_remove() {
  std::lock_guard<sync::SpinLock> lock(zero_mu_);
  if (root_->zero_present == 0) return Code::not_found;
  pm::publish(&root_->zero_present, 0);  // Z4
  pm::persist(&root_->zero_present, 8);
  free_value(root_->zero_value);
  return Code::ok;
}

Code NBTree::zero_find(std::uint64_t* word) const {
  // The caller holds zero_mu_ while it copies the value out.
  if (root_->zero_present == 0) return Code::not_found;
  *word = root_->zero_value;
  return Code::ok;
}

// --- public operations ---------------------------------------------------------------------------

// pool_full: run the deferred frees and retry once (reclaim.h). A failed insert or update has
// rolled back (I7, S2x) and unpinned, so the retry is a plain retry and the deleters run
// outside any pinned section.
Code NBTree::insert(std::string_view key, std::string_view value) {
  return count_insert(
      index_common::retry_after_reclaim(epochs_, [&] { return insert_once(key, value); }));
}

Code NBTree::update(std::string_view key, std::string_view value) {
  return index_common::retry_after_reclaim(epochs_, [&] { return update_once(key, value); });
}

// Key 0 of the integer modes lives in the root (Z*); bytes keys all live in leaves.
Code NBTree::insert_once(std::string_view key, std::string_view value) {
  Probe p;
  if (Code c = make_probe(key, &p); c != Code::ok) return c;
  std::uint64_t word = 0;
  if (Code c = encode_value(value, &word); c != Code::ok) return c;
  auto guard = epochs_.pin();
  if (!bytes_) [[likely]] {
    const Code c = p.word == 0 ? zero_insert(word) : insert_word(p, p.word, word);
    if (c != Code::ok) free_value(word);  // never published (I7 withdrew any PM copy)
    return c;
  }
  Code c = Code::ok;
  const std::uint64_t kw = new_key_record(key, &c);  // K1, before the key word is stored
  if (kw == 0) {
    free_value(word);
    return c;
  }
  c = insert_word(p, kw, word);
  if (c != Code::ok) {
    free_value(word);
    retire_key(kw);  // announced (I2), maybe read by another insert: after an epoch
  }
  return c;
}

Code NBTree::update_once(std::string_view key, std::string_view value) {
  Probe p;
  if (Code c = make_probe(key, &p); c != Code::ok) return c;
  std::uint64_t word = 0;
  if (Code c = encode_value(value, &word); c != Code::ok) return c;
  auto guard = epochs_.pin();
  std::uint64_t old = 0;
  const Code c = !bytes_ && p.word == 0 ? zero_update(word) : update_word(p, word, &old);
  if (c != Code::ok) free_value(word);
  return c;
}

// Integer keys (issue 16's short path): the key decoded here, the descent, leaf search and
// slot read inlined, the value written straight into the caller's string. Key 0, f64 keys
// (their NaN check), byte-string keys and malformed keys take find_general.
Code NBTree::find(std::string_view key, std::string* value) const {
  return search_avx2_ ? find_u64_avx2(key, value) : find_u64_baseline(key, value);
}

Code NBTree::find_u64_baseline(std::string_view key, std::string* value) const {
  return find_u64<index_common::SearchIsa::baseline>(key, value);
}

// The only NBTree code a baseline build compiles with AVX2 (docs/isa.md).
PMINDEX_AVX2_ENTRY Code NBTree::find_u64_avx2(std::string_view key, std::string* value) const {
  return find_u64<index_common::SearchIsa::avx2>(key, value);
}

template <index_common::SearchIsa I>
[[gnu::always_inline]] inline Code NBTree::find_u64(std::string_view key,
                                                    std::string* value) const {
  if (key_mode_ != KeyType::u64 || key.size() != 8) [[unlikely]] return find_general(key, value);
  std::uint64_t be;
  std::memcpy(&be, key.data(), 8);
  Probe p;
  p.word = le_to_native(__builtin_bswap64(be));  // as make_probe
  if (p.word == 0) [[unlikely]] return find_general(key, value);
  p.bytes = key;
  p.fp = fingerprint(p.word);
  auto guard = epochs_.pin();
  std::uint64_t word = 0;
  const Code c = find_in_leaf_t<false, I>(descend(U64OrderIsa<I>{p.word}), p, &word);
  if (c == Code::ok && value != nullptr) read_value(word, value);
  return c;
}

Code NBTree::find_general(std::string_view key, std::string* value) const {
  Probe p;
  if (Code c = make_probe(key, &p); c != Code::ok) return c;
  auto guard = epochs_.pin();
  std::uint64_t word = 0;
  if (!bytes_ && p.word == 0) {
    std::lock_guard<sync::SpinLock> lock(zero_mu_);
    if (zero_find(&word) != Code::ok) return Code::not_found;
    if (value != nullptr) read_value(word, value);
    return Code::ok;
  }
  if (Code c = find_word(p, &word); c != Code::ok) return c;
  if (value != nullptr) read_value(word, value);
  return Code::ok;
}

// Batched lookups (Index::find_many), integer keys: descend's steps (snapshot, move right or
// down, prefetch the next node) one per round for each key of the batch, round-robin, then
// resolve and the leaf read of find_word. The descent never restarts (B-link), so no key is
// retried. Byte-string keys compare separator copies per step: one at a time. Key 0 lives in
// the root (find's side record).
void NBTree::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                        std::size_t n) const {
  if (bytes_) return Index::find_batch(keys, values, codes, n);
  Probe p[kFindBatch];
  void* cur[kFindBatch];        // the next inner node, or the leaf once its bit is in at_leaf
  std::uint8_t at[kFindBatch];  // batch position of the j-th key
  std::size_t live = 0;
  std::uint64_t alone = 0;
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = make_probe(keys[i], &p[live]);
    if (codes[i] != Code::ok) continue;
    if (p[live].word == 0) alone |= std::uint64_t{1} << i;
    else at[live++] = static_cast<std::uint8_t>(i);
  }
  const auto guard = epochs_.pin();
  Inner* const root = root_node_.load(std::memory_order_acquire);  // acquire: as descend
  for (std::size_t j = 0; j < live; ++j) cur[j] = root;
  std::uint64_t pending = live == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << live) - 1;
  std::uint64_t at_leaf = 0;
  while (pending != 0) {
    for (std::uint64_t m = pending; m != 0; m &= m - 1) {
      const auto j = static_cast<std::size_t>(std::countr_zero(m));
      const std::uint64_t bit = std::uint64_t{1} << j;
      const U64Order order{p[j].word};
      if ((at_leaf & bit) != 0) {
        Leaf* leaf = resolve(static_cast<Leaf*>(cur[j]), order);
        std::uint64_t word = 0;
        const std::size_t i = at[j];
        codes[i] = find_in_leaf_t<false>(leaf, p[j], &word);
        if (codes[i] == Code::ok && values != nullptr) read_value(word, &values[i]);
        pending &= ~bit;
        continue;
      }
      const Inner* node = static_cast<const Inner*>(cur[j]);
      Inner* right = nullptr;
      void* child = snapshot(node, order, &right);
      if (right != nullptr) {
        cur[j] = right;
        prefetch_lines(right, sizeof(Inner));
      } else if (node->level == 1) {
        cur[j] = child;
        at_leaf |= bit;
        prefetch_lines(child, 2 * 64);  // as descend
      } else {
        cur[j] = child;
        prefetch_lines(child, sizeof(Inner));
      }
    }
  }
  for (; alone != 0; alone &= alone - 1) {
    const auto i = static_cast<std::size_t>(std::countr_zero(alone));
    codes[i] = find(keys[i], values != nullptr ? values + i : nullptr);
  }
}

Code NBTree::remove(std::string_view key) {
  Probe p;
  if (Code c = make_probe(key, &p); c != Code::ok) return c;
  Code c;
  {
    auto guard = epochs_.pin();
    c = count_remove(!bytes_ && p.word == 0 ? zero_remove() : remove_key(p));
  }
  // M2x for want of space: the blocks of replaced leaves may still wait in the epoch
  // manager (E2). Run the deferred frees and, if any ran, try the merge once more.
  if (merge_found_pool_full() && index_common::reclaim_deferred(epochs_)) {
    auto guard = epochs_.pin();
    maybe_merge(find_leaf(p));
    merge_found_pool_full();  // a second failure is not retried
  }
  return c;
}

// Scan: leaf by leaf in key order, re-descending from the root for each leaf (a leaf's range
// never changes, so the next leaf is the one covering high + 1). Each record is read like
// find() (sync-on-read included): every returned value was the key's value at some instant
// during the scan; the result is not a snapshot of the whole range (PROTOCOL.md, "Scan").
std::size_t NBTree::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  if (max == 0) return 0;
  Probe cur;             // the cursor: u64 mode its word, bytes mode its bytes (cur_bytes)
  std::string cur_bytes;
  if (bytes_) {
    cur_bytes.assign(start);
    cur.bytes = cur_bytes;
  } else if (start.size() == 8) {
    cur.word = decode_u64(start);
  } else if (start.size() > 8) {
    cur.word = decode_u64(start.substr(0, 8));
    if (cur.word == ~std::uint64_t{0}) return 0;
    ++cur.word;  // every 8-byte key with this prefix is < start
  } else {
    // A shorter start padded with zero bytes: every 8-byte key >= start is >= the padding.
    std::string padded(start);
    padded.resize(8, '\0');
    cur.word = decode_u64(padded);
  }
  auto guard = epochs_.pin();
  std::string value;
  if (!bytes_ && cur.word == 0) {
    std::lock_guard<sync::SpinLock> lock(zero_mu_);
    std::uint64_t word = 0;
    if (zero_find(&word) == Code::ok) {
      read_value(word, &value);
      out.append(encode_u64(0), value);
    }
    cur.word = 1;
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> recs;  // u64: (key, value word)
  std::vector<std::pair<std::string, std::uint64_t>> brecs;   // bytes: (key, value word)
  while (out.size() < max) {
    Leaf* leaf = find_leaf(cur);
    recs.clear();
    brecs.clear();
    const std::uint64_t b = leaf->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit;
    const Entry* e = entries(leaf);
    for (std::uint64_t bits = b; bits != 0; bits &= bits - 1) {
      const int i = __builtin_ctzll(bits);
      const std::uint64_t k = pm::load_acquire(&e[i].key);
      if (k == 0 || (!bytes_ && k < cur.word)) continue;
      const Probe kp = probe_of_word(k);  // bytes: the record (pinned, so it stays readable)
      if (bytes_ && kp.bytes < cur.bytes) continue;
      std::uint64_t w = 0;
      if (find_word(kp, &w) != Code::ok) continue;
      if (bytes_) brecs.emplace_back(std::string(kp.bytes), w);
      else recs.emplace_back(k, w);
    }
    std::sort(recs.begin(), recs.end());
    std::sort(brecs.begin(), brecs.end());  // memcmp order within the leaf
    for (const auto& [k, w] : recs) {
      if (out.size() >= max) break;
      read_value(w, &value);
      out.append(encode_u64(k), value);
    }
    for (const auto& [k, w] : brecs) {
      if (out.size() >= max) break;
      read_value(w, &value);
      out.append(k, value);
    }
    if (leaf->high == kNoHigh) break;
    if (bytes_) {  // the next leaf starts at this one's (exclusive) high
      cur_bytes.assign(index_common::SeparatorStore::view(leaf->high));
      cur.bytes = cur_bytes;
    } else {
      cur.word = leaf->high + 1;
    }
  }
  return out.size();
}

}  // namespace pmindex::nbtree

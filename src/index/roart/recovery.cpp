// roart: recovery (PROTOCOL.md R4-R6): read-only checks at open, then the start-now walk that
// marks every reachable block and finishes splits a crash interrupted.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iterator>

#include "index/common/close_counts.h"
#include "index/roart/roart.h"

namespace pmindex::roart {

using art::load_word;
using art::NodeLock;

namespace {
// relaxed: a statistic, read by tests after the operations that count it have returned.
std::atomic<std::uint64_t> g_finished_splits{0};
std::atomic<std::uint64_t> g_undone_splits{0};
std::atomic<std::uint64_t> g_finished_merges{0};
std::atomic<bool> g_merge_without_intent{false};
}  // namespace

std::uint64_t Roart::finished_merges_total() {
  return g_finished_merges.load(std::memory_order_relaxed);
}
void Roart::set_merge_without_intent_for_testing(bool on) {
  if (on && !pm::kTracing) std::abort();  // the tracing flavour only
  g_merge_without_intent.store(on, std::memory_order_relaxed);  // relaxed: set between runs
}
bool Roart::merge_without_intent_flag() {
  return g_merge_without_intent.load(std::memory_order_relaxed);
}

std::uint64_t Roart::finished_splits_total() {
  return g_finished_splits.load(std::memory_order_relaxed);
}
std::uint64_t Roart::undone_splits_total() {
  return g_undone_splits.load(std::memory_order_relaxed);
}

// R4 (read only, so a refused pool is unchanged): the root object, its top word and its tail
// array are checked; R5: start-now allocator, commit_open, the index answers at once, and a
// background walk marks every reachable block.
Result<std::unique_ptr<Index>> Roart::recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Roart> idx(new Roart(std::move(pool)));
  pm::Pool& p = *idx->pool_;
  idx->recovery_.clean_shutdown = p.was_clean();
  idx->recovery_.warning = p.open_warning();
  idx->recovery_.records_counted = false;
  const std::uint64_t root_off = p.root();
  if (root_off == 0) {  // crashed before R3: nothing was reachable
    p.allocator().begin_recovery(/*start_now=*/false);
    if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
    p.commit_open();
    if (Status s = idx->init_root(o.key_type == KeyType::bytes ? o.max_key_size : 8,
                                  o.max_value_size);
        !s.ok())
      return s;
    return std::unique_ptr<Index>(std::move(idx));
  }
  Root* r = p.checked<Root>(root_off, sizeof(Root), 64);
  if (r == nullptr || r->magic != kRootMagic)
    return p.error(Code::corrupted, "roart root object is missing or has a wrong magic");
  if (Status s = index_common::check_root_stamp(r->stamp, p); !s.ok()) return s;
  const bool fixed_keys = idx->key_mode_ != KeyType::bytes;
  if (r->max_key_size > art::kMaxKeyBytes || (fixed_keys && r->max_key_size != 8) ||
      !index_common::ValueCodec::valid_limit(r->max_value_size))
    return p.error(Code::corrupted, "roart root holds impossible size limits");
  idx->root_ = r;
  {
    const PmTree probe(art::PmPlacement{&p}, &r->top, &r->lock, 1, r->max_key_size);
    if (std::string e = probe.check_top(); !e.empty())
      return p.error(Code::corrupted, "roart root word: " + e);
    if (std::string e = idx->check_array(r->tail); !e.empty())
      return p.error(Code::corrupted, "roart tail array: " + e);
  }
  p.allocator().begin_recovery(/*start_now=*/true);
  p.commit_open();
  idx->make_tree(art::run_tag(p.generation()));
  idx->recovery_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  idx->recovered_records_pending();
  idx->start_walk(root_off);
  return std::unique_ptr<Index>(std::move(idx));
}

// One array met by the walk. An array with a committed intent (a split a crash interrupted
// after A5) is marked with its intent and the intent's arrays: the right one always (named
// only by the intent until A7), the left one only while the trie lacks the separator (after
// A6 the trie names it, and may by now name its successor); its own slots are not followed
// (their records are the new arrays'). The split is finished at the array's first touch (R6).
std::string Roart::walk_array(std::uint64_t off, bool tail, std::string_view hi,
                              std::vector<std::uint64_t>* seen, std::vector<Pending>* pending,
                              std::uint64_t* records) {
  pm::Allocator& al = pool_->allocator();
  if (std::string e = check_array(off); !e.empty()) return e;
  seen->push_back(off);
  ArrayHeader* a = array(off);
  if (al.mark_reachable(off, array_bytes(slots_of(a))) != Code::ok) return "leaf array cannot be marked";
  const std::uint64_t ioff = load_word(a->intent);
  if (ioff != 0) {
    if (ioff % 8 != 0 || !pool_->in_heap(ioff, sizeof(Intent))) return "split intent out of bounds";
    const Intent* in = pool_->at<const Intent>(ioff);
    if (in->key_len > root_->max_key_size || !pool_->in_heap(ioff, sizeof(Intent) + in->key_len))
      return "split intent out of bounds";
    if (al.mark_reachable(ioff, sizeof(Intent) + in->key_len) != Code::ok)
      return "split intent cannot be marked";
    pending->push_back(Pending{off, ioff, tail, std::string(hi)});
    if (in->reserved == kMergeKind) {
      if (std::string e = walk_merge(in, seen, records); !e.empty()) return e;
      return walk_slots(a, records);
    }
    if (in->reserved != 0) return "intent of an unknown kind";
    if (std::string e = walk_array(in->right, false, {}, seen, pending, records); !e.empty())
      return e;
    std::uint64_t named = 0;
    const Code c = tree_->find(std::string_view(in->key(), in->key_len), &named);
    if (c == Code::corrupted) return "trie damaged at a split's separator";
    if (c == Code::not_found)
      return walk_array(in->left, false, {}, seen, pending, records);
    return {};
  }
  return walk_slots(a, records);
}

// R5 for a merge intent (held by the merge's right array B, which the caller walks as any
// array: its own records are B's): the merged array m is marked (its records are A's and B's);
// the left array A too if its separator already left the trie (M3 done: nothing else reaches
// A now, and its records are live through m), else the trie walk reaches A by its separator.
std::string Roart::walk_merge(const Intent* in, std::vector<std::uint64_t>* seen,
                              std::uint64_t* records) {
  pm::Allocator& al = pool_->allocator();
  if (std::string e = check_array(in->left); !e.empty()) return "merge intent's left " + e;
  if (std::string e = check_array(in->right); !e.empty()) return "merge intent's merged " + e;
  if (load_word(array(in->left)->intent) != 0 || load_word(array(in->right)->intent) != 0)
    return "merge intent names an array with an intent";
  if (al.mark_reachable(in->right, array_bytes(slots_of(array(in->right)))) != Code::ok)
    return "merged array cannot be marked";
  std::uint64_t named = 0;
  const Code c = tree_->find(std::string_view(in->key(), in->key_len), &named);
  if (c == Code::ok) return named == in->left ? std::string() : "merge intent disagrees with the trie";
  if (c != Code::not_found) return "trie damaged at a merge's separator";
  seen->push_back(in->left);
  if (al.mark_reachable(in->left, array_bytes(slots_of(array(in->left)))) != Code::ok)
    return "leaf array cannot be marked";
  return walk_slots(array(in->left), records);
}

// An array's records and their out-of-line values marked and counted.
std::string Roart::walk_slots(ArrayHeader* a, std::uint64_t* records) {
  pm::Allocator& al = pool_->allocator();
  const std::uint64_t* s = slot_words(a);
  for (unsigned i = 0; i < slots_of(a); ++i) {
    const std::uint64_t w = load_word(s[i]);
    if (w == 0) continue;
    const art::Record* r = record(w);
    if (al.mark_reachable(w & kOffsetMask, art::record_bytes(r->key_len)) != Code::ok)
      return "record cannot be marked";
    if (values_.mark(r->value) != Code::ok) return "out-of-line value cannot be marked";
    ++*records;
  }
  return {};
}

// R6: the interrupted split of p.array (locked by its first toucher, after the walk) finished
// from its intent, each step idempotent: the separator enters the trie naming the left array
// unless it is there (A6; if it is, it names the left array or a successor), the array's name
// moves to the right array (A7), the array is unlocked obsolete and leaves (A8). An A6 that
// cannot allocate answers pool_full with nothing changed (the caller undoes the split, R6u).
Status Roart::finish_intent(const Pending& p) const {
  const Intent* in = pool_->at<const Intent>(p.intent);
  const std::string_view sep(in->key(), in->key_len);
  std::uint64_t named = 0;
  Code c = tree_->find(sep, &named);
  if (c == Code::not_found) c = tree_->insert(sep, in->left);  // A6
  if (c != Code::ok) return pool_->error(c, "roart: an interrupted split cannot be finished");
  Where w;
  w.tail = p.tail;
  w.hi = p.hi;
  if (replace(w, p.array, in->right) != Code::ok)  // A7
    return pool_->error(Code::corrupted, "roart: an interrupted split's array is not named");
  // Every later visitor sees this run's tag and the obsolete bit: it starts again.
  pm::publish(&array(p.array)->lock, NodeLock::fresh(tag_) | NodeLock::kObsolete);
  retire_array(p.array);  // A8
  retire_intent(p.intent);
  g_finished_splits.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

// R6u: A6 of R6 could not allocate (the pool is full after the restart). As the live split
// does when its A6 fails, the split is undone and the array stays the live, unsplit one: a
// full pool is not damage. The array's lock is held (its first touch); nothing names the
// intent's arrays but the intent, and only this lock holder reads them now.
// U1 (the one persistent step) the intent word is set to 0 and persisted. Before it nothing
//    changed (A6 failed without a trace), so a crash then meets the same intent again (R5/R6);
//    after it the intent, both new arrays and the record of the insert that split (never
//    acknowledged) are unreachable, and a crash leaves them unmarked by the next walk: free.
// U2 those blocks are retired through the epoch manager, and the recovered record count
//    (the walk counted the new arrays' records, R5) loses the record of the undone insert.
// Refuses (false, nothing changed) unless every slot word of the array is also a slot word of
// one of the new arrays: the walk marked the new arrays' records, not the array's own (R5).
bool Roart::undo_intent(const Pending& p) const {
  ArrayHeader* a = array(p.array);
  const Intent* in = pool_->at<const Intent>(p.intent);
  std::vector<std::uint64_t> split_words;  // the new arrays' slot words
  for (const std::uint64_t off : {in->left, in->right}) {
    ArrayHeader* h = array(off);
    for (unsigned i = 0; i < slots_of(h); ++i)
      if (const std::uint64_t w = load_word(slot_words(h)[i]); w != 0) split_words.push_back(w);
  }
  std::sort(split_words.begin(), split_words.end());
  std::vector<std::uint64_t> own;
  for (unsigned i = 0; i < slots_of(a); ++i)
    if (const std::uint64_t w = load_word(slot_words(a)[i]); w != 0) own.push_back(w);
  std::sort(own.begin(), own.end());
  if (!std::includes(split_words.begin(), split_words.end(), own.begin(), own.end())) return false;
  std::vector<std::uint64_t> only_split;  // the undone insert's record
  std::set_difference(split_words.begin(), split_words.end(), own.begin(), own.end(),
                      std::back_inserter(only_split));
  const std::uint64_t left = in->left, right = in->right;
  pm::publish(&a->intent, 0);
  pm::persist(&a->intent, sizeof a->intent);  // U1
  for (const std::uint64_t w : only_split) {  // U2
    retire_value(load_word(record(w)->value));
    retire_record(w);
    // The walk's count included it; the Index counter is bumped by non-const writers only,
    // and this const first touch (a find may make it) is the one place that drops a record.
    (void)const_cast<Roart*>(this)->count_remove(Code::ok);
  }
  retire_array(left);
  retire_array(right);
  retire_intent(p.intent);
  g_undone_splits.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// R7 (the walk, after its marks and before any writer runs; readers may run): the merge whose
// intent p.array (B) holds, committed (M2) before a crash, is finished; each step idempotent,
// so a crash here meets the same intent at the next walk. B is locked from its stale word
// (a first touch of B waits for this walk, A9), A (if its separator is still in the trie) by
// an ordinary first touch and lock; M3 removes A's separator unless gone, M4 names m where B
// was, M5 leaves A and B obsolete and retires them and the intent.
// R7u: M3 cannot allocate (a full pool): U1' B's intent word is set to 0 and persisted (from
// then m and the intent are unreachable: the next walk frees them), U2' both are retired, A
// and B go on as they were (B's lock word is put back, so its first touch admits it).
bool Roart::finish_merge(const Pending& p) {
  auto guard = tree_->epochs().pin();
  ArrayHeader* b = array(p.array);
  const Intent* in = pool_->at<const Intent>(p.intent);
  const std::uint64_t stale = NodeLock::load(b->lock);
  const std::uint64_t tag_word = std::uint64_t{tag_} << 32;
  std::uint64_t expected = stale;
  if (NodeLock::tag_of(stale) == tag_ || !pm::cas(&b->lock, expected, tag_word | NodeLock::kLocked))
    return false;
  const std::string_view sep(in->key(), in->key_len);
  ArrayHeader* a = array(in->left);
  std::uint64_t named = 0;
  Code c = tree_->find(sep, &named);
  bool a_locked = false;
  if (c == Code::ok) {  // M3 not done: A is reachable, first touch and lock it
    Touch t;
    if (named != in->left || load_word(a->intent) != 0 ||
        !write_lock(a, Where{in->left, false, std::string(sep)}, &t))
      return false;
    a_locked = true;
    c = tree_->remove(sep, &named);  // M3
    if (c == Code::pool_full) {  // R7u
      pm::publish(&b->intent, 0);
      pm::persist(&b->intent, sizeof b->intent);  // U1'
      retire_array(in->right);                    // U2'
      retire_intent(p.intent);
      unlock(a);
      pm::publish(&b->lock, stale);
      g_finished_merges.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    if (c != Code::ok || named != in->left) return false;
  } else if (c != Code::not_found) {
    return false;
  }
  Where wb;
  wb.array = p.array;
  wb.tail = p.tail;
  wb.hi = p.hi;
  if (replace(wb, p.array, in->right) != Code::ok) return false;  // M4
  if (a_locked) unlock_obsolete(a);  // M5
  else pm::publish(&a->lock, NodeLock::fresh(tag_) | NodeLock::kObsolete);
  pm::publish(&b->lock, NodeLock::fresh(tag_) | NodeLock::kObsolete);
  retire_array(in->left);
  retire_array(p.array);
  retire_intent(p.intent);
  g_finished_merges.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool Roart::count_for_close(std::uint64_t* records, std::uint64_t* nodes) const {
  bool counted = true;
  auto count_array = [&](std::uint64_t off) {
    if (!check_array(off).empty() || load_word(array(off)->intent) != 0) return false;
    ++*nodes;
    ArrayHeader* a = array(off);
    const std::uint64_t* s = slot_words(a);
    for (unsigned i = 0; i < slots_of(a); ++i) *records += load_word(s[i]) != 0 ? 1 : 0;
    return true;
  };
  const std::string e =
      tree_->walk([&](std::uint64_t, std::size_t, bool is_record, std::uint64_t value) {
        if (!is_record) {
          ++*nodes;
          return true;
        }
        counted = count_array(value);
        return counted;
      });
  return e.empty() && counted && count_array(load_word(root_->tail));
}

void Roart::start_walk(std::uint64_t root_off) {
  walk_done_.store(false, std::memory_order_relaxed);  // relaxed: before the thread starts
  walker_ = std::thread([this, root_off] {
    pm::Allocator& al = pool_->allocator();
    std::vector<std::uint64_t> seen;
    std::vector<Pending> pending;
    std::uint64_t records = 0, nodes = 0;
    std::string err;
    auto mark = [&](std::uint64_t ref, std::size_t bytes, bool is_record, std::uint64_t value) {
      if (al.mark_reachable(ref, bytes) != Code::ok) return false;
      if (!is_record) {
        ++nodes;
        return true;
      }
      const art::Record* r = pool_->at<const art::Record>(ref);
      err = walk_array(value, false, std::string_view(r->key(), r->key_len), &seen, &pending,
                       &records);
      return err.empty();
    };
    Status s = Status::Ok();
    if (al.mark_reachable(root_off, sizeof(Root)) != Code::ok) {
      s = pool_->error(Code::corrupted, "roart root object cannot be marked");
    } else if (std::string e = tree_->walk(mark); !e.empty()) {
      s = pool_->error(Code::corrupted, "roart recovery walk: " + (err.empty() ? e : err));
    } else if (std::string t = walk_array(load_word(root_->tail), true, {}, &seen, &pending,
                                          &records);
               !t.empty()) {
      s = pool_->error(Code::corrupted, "roart recovery walk: " + t);
    } else {
      std::sort(seen.begin(), seen.end());
      if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
        s = pool_->error(Code::corrupted, "roart recovery walk: a leaf array is reached twice");
      else if (s = index_common::check_close_counts(*pool_, "roart", records, nodes + seen.size());
               s.ok())  // writers wait for this walk: its counts are exact
        s = al.finish_recovery();  // only a complete walk frees: unvisited blocks may be live
      for (const Pending& p : pending) {  // R7: merges finish before any writer runs
        if (!s.ok()) break;
        if (pool_->at<const Intent>(p.intent)->reserved == kMergeKind && !finish_merge(p))
          s = pool_->error(Code::corrupted, "roart recovery walk: a merge cannot be finished");
      }
    }
    std::lock_guard<std::mutex> lock(walk_mu_);
    if (!s.ok()) corrupted_.store(true, std::memory_order_relaxed);  // relaxed: read after walk_done_
    walk_status_ = std::move(s);
    recovery_.records = records;
    recovery_.nodes = nodes + seen.size();
    recovery_.repaired = pending.size();
    set_recovered_records(records);
    walk_done_.store(true, std::memory_order_release);  // release: pairs with writable()
    walk_cv_.notify_all();
  });
}

Status Roart::wait_recovery_walk() const {
  std::unique_lock<std::mutex> lock(walk_mu_);
  walk_cv_.wait(lock, [&] { return walk_done_.load(std::memory_order_acquire); });
  return walk_status_;
}

}  // namespace pmindex::roart

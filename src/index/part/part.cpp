// part: creation, start-now recovery and the native API over art::Tree (PROTOCOL.md).
#include "index/part/part.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "index/common/key_group.h"
#include "index/common/close_counts.h"
#include "index/common/reclaim.h"
#include "index/common/traits.h"

namespace pmindex::part {

namespace {
std::uint32_t max_key_of(const Options& o) {
  return o.key_type == KeyType::bytes ? o.max_key_size : 8;
}
}  // namespace

pm::Layout Part::layout_for(const Options& o) { return pm::Layout{"part", 0, o.key_type, 0}; }

Status Part::validate(const Options& o) {
  if (o.node_size != 0)
    return Status(Code::invalid_argument, "part has fixed node sizes (N4..N256); node_size must be 0");
  if (o.key_type == KeyType::bytes && o.max_key_size > art::kMaxKeyBytes)
    return Status(Code::invalid_argument,
                  "part keys are limited to " + std::to_string(art::kMaxKeyBytes) + " bytes");
  if (!index_common::ValueCodec::valid_limit(o.max_value_size))
    return Status(Code::invalid_argument, "part max_value_size must be in [8, 65536]");
  return Status::Ok();
}

std::size_t Part::default_pool_size(const Options& o) {
  // A record block (64 B until small classes land) and about one node line per record, then
  // out-of-line values; doubled for slack.
  const std::size_t value = o.max_value_size > 8 ? 64 + o.max_value_size : 0;
  const std::size_t per_record = 128 + max_key_of(o) + value;
  return std::max<std::size_t>(std::size_t{4} << 20, o.expected_records * per_record * 2);
}

Part::Part(std::unique_ptr<pm::Pool> pool)
    : pool_(std::move(pool)), open_start_(std::chrono::steady_clock::now()) {
  key_mode_ = pool_->info().layout.key_mode;
}

Part::~Part() {
  if (walker_.joinable()) walker_.join();
}

void Part::make_tree(std::uint32_t tag) {
  values_.configure(pool_.get(), root_->max_value_size);
  tree_ = std::make_unique<PmTree>(art::PmPlacement{pool_.get()}, &root_->top, &root_->lock, tag,
                                   root_->max_key_size);
}

Result<std::unique_ptr<Index>> Part::create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  std::unique_ptr<Part> idx(new Part(std::move(pool)));
  if (Status s = idx->init_root(max_key_of(o), o.max_value_size); !s.ok()) return s;
  idx->recovery_.created = true;
  return std::unique_ptr<Index>(std::move(idx));
}

Status Part::init_root(std::uint32_t max_key, std::uint32_t max_value) {
  Code code = Code::ok;
  const std::uint64_t off = pool_->allocator().allocate(sizeof(Root), &code);
  if (off == 0) return pool_->error(code, "no space for the index root");
  Root* r = pool_->at<Root>(off);
  Root init{};
  init.magic = kRootMagic;
  init.max_key_size = max_key;
  init.max_value_size = max_value;
  init.stamp = index_common::make_root_stamp(pool_->info().layout);
  pm::copy(r, &init, sizeof init);  // R1: the root object, empty tree
  pm::persist(r, sizeof init);      // R2: persisted before it is reachable
  pool_->set_root(off);             // R3: published in the pool header
  root_ = r;
  make_tree(art::run_tag(pool_->generation()));
  return Status::Ok();
}

// R4 (read only, so a refused pool is unchanged): the root object and its top word are checked;
// R5: start-now allocator, commit_open, the tree answers at once, and a background walk marks
// every reachable block (checking each as first touch does) before finish_recovery().
Result<std::unique_ptr<Index>> Part::recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  std::unique_ptr<Part> idx(new Part(std::move(pool)));
  pm::Pool& p = *idx->pool_;
  idx->recovery_.clean_shutdown = p.was_clean();
  idx->recovery_.warning = p.open_warning();
  idx->recovery_.records_counted = false;
  const std::uint64_t root_off = p.root();
  if (root_off == 0) {  // crashed between pool creation and R3: nothing was reachable
    p.allocator().begin_recovery(/*start_now=*/false);
    if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
    p.commit_open();
    if (Status s = idx->init_root(max_key_of(o), o.max_value_size); !s.ok()) return s;
    return std::unique_ptr<Index>(std::move(idx));
  }
  Root* r = p.checked<Root>(root_off, sizeof(Root), 64);
  if (r == nullptr || r->magic != kRootMagic)
    return p.error(Code::corrupted, "part root object is missing or has a wrong magic");
  if (Status s = index_common::check_root_stamp(r->stamp, p); !s.ok()) return s;
  const bool fixed_keys = idx->key_mode_ != KeyType::bytes;
  if (r->max_key_size > art::kMaxKeyBytes || (fixed_keys && r->max_key_size != 8) ||
      !index_common::ValueCodec::valid_limit(r->max_value_size))
    return p.error(Code::corrupted, "part root holds impossible size limits");
  idx->root_ = r;
  {  // the top word is followed before the walk: check it now (read only)
    const PmTree probe(art::PmPlacement{&p}, &r->top, &r->lock, 1, r->max_key_size);
    if (std::string e = probe.check_top(); !e.empty())
      return p.error(Code::corrupted, "part root word: " + e);
  }
  p.allocator().begin_recovery(/*start_now=*/true);
  p.commit_open();
  idx->make_tree(art::run_tag(p.generation()));
  idx->recovery_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - idx->open_start_).count();
  idx->recovered_records_pending();  // size() waits for the walk's count
  idx->start_walk(root_off);
  return std::unique_ptr<Index>(std::move(idx));
}

void Part::start_walk(std::uint64_t root_off) {
  walk_done_.store(false, std::memory_order_relaxed);  // relaxed: before the thread starts
  walker_ = std::thread([this, root_off] {
    pm::Allocator& al = pool_->allocator();
    std::unordered_set<std::uint64_t> nodes;
    std::uint64_t records = 0;
    auto mark = [&](std::uint64_t ref, std::size_t bytes, bool is_record, std::uint64_t value) {
      if (!is_record && !nodes.insert(ref).second) return false;  // reached twice: a cycle/DAG
      if (al.mark_reachable(ref, bytes) != Code::ok) return false;
      records += is_record ? 1 : 0;
      return !is_record || values_.mark(value) == Code::ok;
    };
    Status s = Status::Ok();
    if (al.mark_reachable(root_off, sizeof(Root)) != Code::ok) {
      s = pool_->error(Code::corrupted, "part root object cannot be marked");
    } else if (std::string e = tree_->walk(mark); !e.empty()) {
      s = pool_->error(Code::corrupted, "part recovery walk: " + e);
    } else if (s = index_common::check_close_counts(*pool_, "part", records, nodes.size());
               s.ok()) {  // writers wait for this walk: its counts are exact
      s = al.finish_recovery();  // only a complete walk frees: unvisited blocks may be live
    }
    std::lock_guard<std::mutex> lock(walk_mu_);
    if (!s.ok()) corrupted_.store(true, std::memory_order_relaxed);  // relaxed: read after walk_done_
    walk_status_ = std::move(s);
    recovery_.records = records;
    recovery_.nodes = nodes.size();
    set_recovered_records(records);  // also after a failed walk: size() must not wait forever
    walk_done_.store(true, std::memory_order_release);  // release: pairs with writable()
    walk_cv_.notify_all();
  });
}

Status Part::wait_recovery_walk() const {
  std::unique_lock<std::mutex> lock(walk_mu_);
  walk_cv_.wait(lock, [&] { return walk_done_.load(std::memory_order_acquire); });
  return walk_status_;
}

// Writers wait for the recovery walk: it must see the tree as recovered, and no block from
// before the restart may be freed before it is marked (allocator.h, start-now mode).
Code Part::writable() const {
  if (!walk_done_.load(std::memory_order_acquire)) [[unlikely]]
    (void)wait_recovery_walk();
  return corrupted_.load(std::memory_order_relaxed) ? Code::corrupted : Code::ok;
}

Code Part::check_key(std::string_view key) const {
  if (key_mode_ == KeyType::bytes) return key.size() > root_->max_key_size ? Code::key_too_large : Code::ok;
  if (key.size() != 8) return Code::invalid_argument;
  if (key_mode_ == KeyType::f64 && std::isnan(decode_f64(key))) return Code::invalid_argument;
  return Code::ok;
}

void Part::release_value(void* ctx, std::uint64_t word) {
  static_cast<const Part*>(ctx)->values_.release(word);  // K3
}

void Part::retire_value(std::uint64_t word) {
  if (!values_.inline_values()) tree_->epochs().retire(this, &Part::release_value, word);
}

Code Part::insert(std::string_view key, std::string_view value) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;
  auto once = [&] {
    Code code = Code::ok;
    const std::uint64_t word = values_.make_word(value, &code);  // K1 (out of line)
    if (code != Code::ok) return code;
    const Code c = tree_->insert(key, word);
    if (c != Code::ok) values_.release(word);  // never published
    return c;
  };
  Code c = index_common::retry_after_reclaim(tree_->epochs(), once);
  // Full after removes: records move out of sparse units (P11), whose space then serves
  // nodes; the retired originals are freed by the reclaim before the retry.
  if (c == Code::pool_full && removed_since_relocation_.load(std::memory_order_relaxed)) {
    removed_since_relocation_.store(false, std::memory_order_relaxed);
    if (relocate_records(Relocate::sparse_units) != 0) {
      c = index_common::retry_after_reclaim(tree_->epochs(), once);
      // It made room: the next full pool may find more to move. It did not: not again
      // before the next remove (each attempt walks the whole tree).
      if (c != Code::pool_full) removed_since_relocation_.store(true, std::memory_order_relaxed);
    }
  }
  return count_insert(c);
}

// P11 driver. The walk's view is a hint (it runs beside writers): each move rechecks under
// the container's lock (art::Tree::relocate). Units are the allocator's 256 B carriers of
// the 16..192 B classes (docs/allocator.md); a unit with a node, an out-of-line value, the
// root object or any block of 256 B or more never moves.
std::size_t Part::relocate_records(Relocate what) {
  std::unique_lock<std::mutex> lock(relocate_mu_, std::try_to_lock);
  if (!lock.owns_lock() || writable() != Code::ok) return 0;
  constexpr std::uint64_t kUnit = pm::Allocator::kXPLineAlign;
  auto unit_of = [](std::uint64_t off) { return off & ~(kUnit - 1); };
  struct Moving {
    std::uint64_t ref;
    std::size_t bytes;
    std::string key;
  };
  struct Unit {
    std::uint64_t live = 0;  // class bytes of live blocks in the unit
    bool fixed = false;      // holds something that does not move
  };
  std::vector<Moving> records;
  std::unordered_map<std::uint64_t, Unit> units;
  auto hold = [&](std::uint64_t off, std::size_t bytes, bool fixed) {
    const std::size_t cls = pm::Allocator::class_size(pm::Allocator::class_of(bytes));
    for (std::uint64_t u = unit_of(off); u < off + cls; u += kUnit) {
      Unit& x = units[u];
      x.live += std::min<std::uint64_t>(cls, kUnit);
      x.fixed = x.fixed || fixed || cls >= kUnit;
    }
  };
  const bool sparse = what == Relocate::sparse_units;
  if (sparse) {  // pass 1, the census: live bytes per unit, and which units hold more than records
    const auto guard = tree_->epochs().pin();  // nothing the walk reaches is freed meanwhile
    hold(pool_->root(), sizeof(Root), true);
    const std::string e =
        tree_->walk([&](std::uint64_t ref, std::size_t bytes, bool is_record, std::uint64_t v) {
          hold(ref, bytes, !is_record);
          std::size_t vb = 0;
          if (is_record && values_.record_size(v, &vb) && vb != 0) hold(v, vb, true);
          return true;
        });
    if (!e.empty()) return 0;  // a torn view beside a writer (or damage): not now
  }
  std::unordered_set<std::uint64_t> evacuate;
  if (sparse) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> cand;  // (live, unit)
    for (const auto& [u, x] : units)
      if (!x.fixed && x.live < kUnit) cand.emplace_back(x.live, u);
    units = {};
    std::sort(cand.begin(), cand.end());
    std::uint64_t room = 0, need = 0;
    for (const auto& [live, u] : cand) room += kUnit - live;
    for (const auto& [live, u] : cand) {
      room -= kUnit - live;  // this unit's holes are no destination once it empties
      if (need + live > room) break;
      need += live;
      evacuate.insert(u);
    }
    if (evacuate.empty()) return 0;
  }
  {  // pass 2: the records to move, with their keys (only the evacuated units' when sparse)
    const auto guard = tree_->epochs().pin();
    const std::string e =
        tree_->walk([&](std::uint64_t ref, std::size_t bytes, bool is_record, std::uint64_t) {
          if (!is_record || (sparse && !evacuate.contains(unit_of(ref)))) return true;
          const auto* r = pool_->at<art::Record>(ref);  // key immutable while published
          records.push_back(Moving{ref, bytes, std::string(r->key(), r->key_len)});
          return true;
        });
    if (!e.empty()) return 0;
  }
  pm::Allocator& al = pool_->allocator();
  std::vector<std::pair<std::uint64_t, std::size_t>> held;  // free blocks inside `evacuate`
  std::size_t moved = 0;
  for (const Moving& m : records) {
    pm::yield_point("part.relocate");
    Code code = Code::ok;
    std::uint64_t to = 0;
    for (;;) {
      to = al.allocate(m.bytes, &code);
      if (to == 0 || !sparse || !evacuate.contains(unit_of(to))) break;
      held.emplace_back(to, m.bytes);  // would refill a unit being emptied
    }
    if (to == 0) break;
    const Code c = tree_->relocate(m.key, m.ref, to, relocation_copy_first_);
    if (c == Code::ok) {
      ++moved;
    } else {
      al.deallocate(to, m.bytes);  // gone or moved meanwhile: never published
      if (c == Code::corrupted) break;
    }
  }
  for (const auto& [off, bytes] : held) al.deallocate(off, bytes);
  return moved;
}

// B1-B2 (PROTOCOL.md): the input checked and its value words made first (out-of-line values
// are K1 records, unreachable until B2), then the tree built bottom-up and published by one
// store (art::Tree::build). `fill` has no meaning for a trie (each node is the smallest type
// that holds its children); it is checked as every index checks it. On any error nothing is
// left allocated and the index is unchanged.
Status Part::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "fill factor must be in (0, 1]");
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (Code c = check_key(sorted[i].key); c != Code::ok)
      return Status(c, "part bulk_load: record " + std::to_string(i) + " has a key this tree refuses");
    if (Code c = values_.check(sorted[i].value); c != Code::ok)
      return Status(c, "part bulk_load: record " + std::to_string(i) + " has a value this tree refuses");
    if (i > 0 && !(sorted[i - 1].key < sorted[i].key))
      return Status(Code::invalid_argument, "part bulk_load: keys are not sorted and distinct (record " +
                                                std::to_string(i) + ")");
  }
  if (Code c = writable(); c != Code::ok) return pool_->error(c, "part bulk_load: the tree is damaged");
  if (!tree_->empty()) return Status(Code::invalid_argument, "part bulk_load needs an empty index");
  std::vector<std::uint64_t> words;
  words.reserve(sorted.size());
  const auto release_words = [&] {
    for (const std::uint64_t w : words) values_.release(w);
  };
  for (const KeyValue& kv : sorted) {
    Code code = Code::ok;
    const std::uint64_t w = values_.make_word(kv.value, &code);  // K1 (out of line)
    if (code != Code::ok) {
      release_words();
      return pool_->error(code, "part bulk_load: no room for the values");
    }
    words.push_back(w);
  }
  const Code c = index_common::retry_after_reclaim(tree_->epochs(), [&] {
    return tree_->build(sorted.size(), [&](std::size_t i) { return sorted[i].key; }, words.data());
  });
  if (c != Code::ok) {
    release_words();
    return c == Code::invalid_argument
               ? Status(c, "part bulk_load needs an empty index (a writer got in)")
               : pool_->error(c, "part bulk_load: no room for the tree");
  }
  count_loaded(sorted.size());
  return Status::Ok();
}

Code Part::update(std::string_view key, std::string_view value) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;
  return index_common::retry_after_reclaim(tree_->epochs(), [&] {
    Code code = Code::ok;
    const std::uint64_t word = values_.make_word(value, &code);
    if (code != Code::ok) return code;
    std::uint64_t old = 0;
    const Code c = tree_->update(key, word, &old);
    if (c != Code::ok) {
      values_.release(word);
      return c;
    }
    retire_value(old);  // K3 once no reader can hold it
    return Code::ok;
  });
}

// The lookup hot path (issue 20), built as a leaf function in its common case, as APEX's:
// for an 8-byte key, a flat epoch pin (EpochManager::try_pin_flat) and the tree's one-word
// descent (art::Tree::find_word: per level one lock word compare, the parent's validation,
// one shape compare, the slot), then the value word straight into the caller's string.
// Everything else (other keys, out-of-line values, a declined pin, a level find_word leaves
// to find, items pending at unpin, a string to size, the first answer) takes find_any.
Code Part::find(std::string_view key, std::string* value) const {
  // relaxed: a stale false only sends this lookup the general way (note_answer).
  if (key.size() != 8 || !flat_find_.load(std::memory_order_relaxed)) [[unlikely]]
    return find_any(key, value);
  const sync::EpochManager::FlatPin pin = tree_->epochs().try_pin_flat();
  if (!pin) [[unlikely]] return find_any(key, value);
  std::uint64_t word = 0;
  Code c = Code::ok;
  const bool answered = tree_->find_word(key, &word, &c);
  if (tree_->epochs().unpin_flat(pin)) [[unlikely]] tree_->epochs().after_unpin_flat(pin);
  if (!answered) [[unlikely]] return find_any(key, value);
  if (c != Code::ok || value == nullptr) return c;
  if (value->size() != 8) [[unlikely]] value->resize(8);
  std::memcpy(value->data(), &word, 8);  // inline values only (flat_find_)
  return Code::ok;
}

Code Part::find_any(std::string_view key, std::string* value) const {
  if (Code c = check_key(key); c != Code::ok) return c;
  Code c = Code::ok;
  {
    const auto guard = tree_->epochs().pin();  // an out-of-line value stays until it is copied
    std::uint64_t word = 0;
    c = tree_->find(key, &word, guard);
    if (c == Code::ok && value != nullptr && !values_.read(word, value)) c = Code::corrupted;
  }
  note_answer();
  return c;
}

void Part::note_answer() const {
  if (first_answer_.load(std::memory_order_relaxed) == 0) [[unlikely]] {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - open_start_).count();
    double zero = 0;
    first_answer_.compare_exchange_strong(zero, s, std::memory_order_relaxed);
  }
  if (!flat_find_.load(std::memory_order_relaxed)) [[unlikely]] {
    // relaxed: a stale false only sends a lookup the general way.
    const bool well_formed = key_mode_ == KeyType::u64 ||
                             (key_mode_ == KeyType::bytes && root_->max_key_size >= 8);
    if (well_formed && values_.inline_values()) flat_find_.store(true, std::memory_order_relaxed);
  }
}

// Batched lookups (Index::find_many): the tree's interleaved descents (art::Tree::find_batch),
// then the values, under one pin as find.
void Part::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                      std::size_t n) const {
  static_assert(kFindBatch <= PmTree::kMaxBatch);
  std::string_view ok_keys[kFindBatch];
  std::uint8_t at[kFindBatch];  // batch position of the j-th well-formed key
  const std::size_t live = index_common::compact_checked(
      keys, codes, n, [&](std::string_view k) { return check_key(k); },
      [&](std::string_view k) { return k; }, ok_keys, at);
  if (live == 0) return;
  auto guard = tree_->epochs().pin();  // out-of-line values stay until they are copied
  std::uint64_t words[kFindBatch];
  Code got[kFindBatch];
  tree_->find_batch(ok_keys, live, words, got);
  for (std::size_t j = 0; j < live; ++j) {
    const std::size_t i = at[j];
    codes[i] = got[j];
    if (got[j] == Code::ok && values != nullptr && !values_.read(words[j], &values[i]))
      codes[i] = Code::corrupted;
  }
  note_answer();
}

Code Part::remove(std::string_view key) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;
  std::uint64_t old = 0;
  const Code c = tree_->remove(key, &old);
  if (c == Code::ok) {
    retire_value(old);
    if (!removed_since_relocation_.load(std::memory_order_relaxed)) [[unlikely]]
      removed_since_relocation_.store(true, std::memory_order_relaxed);
  }
  return count_remove(c);
}

std::size_t Part::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  auto guard = tree_->epochs().pin();
  std::string value;
  tree_->scan(start, max, [&](std::string_view k, std::uint64_t word) {
    if (!values_.read(word, &value)) value.clear();
    out.append(k, value);
  });
  return out.size();
}

namespace {
bool value_readable(const void* ctx, std::uint64_t word) {
  std::size_t bytes = 0;
  return static_cast<const index_common::ValueCodec*>(ctx)->record_size(word, &bytes);
}
}  // namespace

Status Part::verify_with(art::TreeStats* stats) const {
  if (Status s = wait_recovery_walk(); !s.ok()) return s;
  // Stale prefixes are legal after a crash until a writer repairs them (P7); counted in stats.
  const std::string e = tree_->verify(stats, /*allow_stale=*/true, &value_readable, &values_);
  if (!e.empty()) return pool_->error(Code::corrupted, "part verify: " + e);
  return Status::Ok();
}

Status Part::verify() const { return verify_with(nullptr); }

Footprint Part::footprint() const {
  Footprint f;
  const auto s = pool_->allocator().stats();
  f.pm_bytes = s.bytes_in_use;
  f.pm_reserved = s.bytes_reserved;
  f.dram_bytes = 0;  // everything lives in the pool; lock words and metadata are in the nodes
  return f;
}

// A pool whose recovery walk found damage is left unclean: a clean close would record counts
// of the damaged tree, and the next open would then accept it as whole (issue 18).
Status Part::close() {
  Status walk = wait_recovery_walk();
  if (!closed_) {
    tree_->epochs().drain();
    if (walk.ok()) {  // else unclean: the next open walks again and refuses the damage again
      // The counts let the next walk see a tree that lost nodes (one read-only walk here, the
      // recovery walk's own, counting instead of marking).
      std::unordered_set<std::uint64_t> nodes;
      std::uint64_t records = 0;
      const std::string e =
          tree_->walk([&](std::uint64_t ref, std::size_t, bool is_record, std::uint64_t) {
            records += is_record ? 1 : 0;
            return is_record || nodes.insert(ref).second;
          });
      if (e.empty()) {
        pool_->close_clean(records, nodes.size());
      } else {
        pool_->close_clean();
      }
    }
    closed_ = true;
  }
  return walk;
}

IndexRegistry::Entry Part::registry_entry() {
  return {"part",
          "P-ART: persistent adaptive radix tree (N4/N16/N48/N256, path compression, OLC)",
          &Part::layout_for, &Part::validate, &Part::default_pool_size, &Part::create,
          &Part::recover,
          {.architecture = "radix tree (ART); PM (nodes and records)",
           .node_structure = "N4/N16/N48/N256 with compressed prefixes; key+value records; "
                             "child slots carry their key byte",
           .concurrency = "optimistic lock coupling: lock-free readers, node locks "
                          "(run-tagged lock words in the nodes)",
           .variable_keys = "inlined (records hold the key)",
           .allocator = traits::kPmindexAllocatorStartNow,
           .numa = "no",
           .recovery = "instant: node metadata rebuilt on first touch; background "
                       "reachability walk (writers wait for it)"}};
}

}  // namespace pmindex::part

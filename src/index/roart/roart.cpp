// roart: creation, the leaf arrays and the native API over the trie core (PROTOCOL.md A1-A9).
#include "index/roart/roart.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "index/common/key_group.h"
#include "index/common/node_search.h"
#include "index/common/prefetch.h"
#include "index/common/reclaim.h"
#include "index/common/traits.h"

namespace pmindex::roart {

using art::NodeLock;
using art::load_word;

namespace {
std::uint32_t max_key_of(const Options& o) {
  return o.key_type == KeyType::bytes ? o.max_key_size : 8;
}
// 16-bit fingerprint: FNV-1a folded, so keys sharing long prefixes still differ.
std::uint16_t fingerprint(std::string_view k) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : k) h = (h ^ c) * 0x100000001b3ull;
  h ^= h >> 29;
  return static_cast<std::uint16_t>(h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48));
}
// The first 8 key bytes big-endian, zero padded: comparing two prefix words as integers orders
// keys as memcmp does on those bytes; equal words are a tie decided by the full keys.
std::uint64_t prefix_of(std::string_view k) {
  std::uint64_t w = 0;
  for (std::size_t i = 0; i < 8; ++i)
    w = w << 8 | (i < k.size() ? static_cast<unsigned char>(k[i]) : 0u);
  return w;
}
constexpr std::uint64_t slot_word(std::uint16_t fp, std::uint64_t rec) {
  return std::uint64_t{fp} << 48 | rec;
}
constexpr std::uint16_t fp_of(std::uint64_t slot) { return static_cast<std::uint16_t>(slot >> 48); }
// Bit i set when slot word i of the first n (n a multiple of 4, at most 64) carries
// fingerprint fp: four words per AVX2 compare (two per SSE4.1 one in a baseline build). The words may change under the caller (an
// optimistic read): a torn answer is thrown away when the array's version does not validate,
// and every candidate's word is loaded again before it is used. A vector load is not a C++
// atomic, so a ThreadSanitizer build compares word by word with atomic loads (node_search.h).
std::uint64_t fp_matches(const std::uint64_t* s, unsigned n, std::uint16_t fp) {
  std::uint64_t m = 0;
#if defined(PMINDEX_NODE_SEARCH_SCALAR)
  for (unsigned i = 0; i < n; ++i) m |= std::uint64_t{fp_of(load_word(s[i])) == fp} << i;
#elif defined(__AVX2__)
  const __m256i want = _mm256_set1_epi64x(fp);
  for (unsigned i = 0; i < n; i += 4) {
    const __m256i x = _mm256_srli_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)), 48);
    const auto eq = static_cast<unsigned>(_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(x, want))));
    m |= std::uint64_t{eq} << i;
  }
#else
  const __m128i want = _mm_set1_epi64x(fp);
  for (unsigned i = 0; i < n; i += 2) {
    const __m128i x = _mm_srli_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)), 48);
    const auto eq = static_cast<unsigned>(_mm_movemask_pd(_mm_castsi128_pd(_mm_cmpeq_epi64(x, want))));
    m |= std::uint64_t{eq} << i;
  }
#endif
  return m;
}
int compare(std::string_view a, std::string_view b) { return a.compare(b); }
// Set by a merge that could not allocate (M1) in this thread's current remove: remove() then
// runs the epoch manager's deferred frees (the arrays earlier merges retired are the free
// space of a full pool) and tries the merge once more, outside the operation's pin.
thread_local bool t_merge_starved = false;
}  // namespace

pm::Layout Roart::layout_for(const Options& o) { return pm::Layout{"roart", 0, o.key_type, 0}; }

Status Roart::validate(const Options& o) {
  if (o.node_size != 0)
    return Status(Code::invalid_argument, "roart has fixed node and leaf-array sizes; node_size must be 0");
  if (o.key_type == KeyType::bytes && o.max_key_size > art::kMaxKeyBytes)
    return Status(Code::invalid_argument,
                  "roart keys are limited to " + std::to_string(art::kMaxKeyBytes) + " bytes");
  if (!index_common::ValueCodec::valid_limit(o.max_value_size))
    return Status(Code::invalid_argument, "roart max_value_size must be in [8, 65536]");
  return Status::Ok();
}

std::size_t Roart::default_pool_size(const Options& o) {
  // A record (16 B + key, small classes), a 16 B slot at half fill, a share of the trie; then
  // out-of-line values; doubled for slack. At least 16 MiB: every write retires a record or
  // a whole leaf array (copy on write), and the epoch manager frees a thread's retired blocks
  // only two epochs after its bag of 1,024 fills: two threads updating and removing the same
  // 8 keys filled a 4 MiB pool with retired blocks and got pool_full (test_upsert_race).
  const std::size_t value = o.max_value_size > 8 ? 64 + o.max_value_size : 0;
  const std::size_t per_record = 96 + max_key_of(o) + value;
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * per_record * 2);
}

Roart::Roart(std::unique_ptr<pm::Pool> pool) : pool_(std::move(pool)) {
  key_mode_ = pool_->info().layout.key_mode;
  const char* scan = std::getenv("PMINDEX_ROART_SCAN");
  copy_first_scans_ = scan != nullptr && std::string_view(scan) == "copy_first";
}

Roart::~Roart() {
  if (walker_.joinable()) walker_.join();
}

void Roart::make_tree(std::uint32_t tag) {
  tag_ = tag;
  values_.configure(pool_.get(), root_->max_value_size);
  tree_ = std::make_unique<PmTree>(art::PmPlacement{pool_.get()}, &root_->top, &root_->lock, tag,
                                   root_->max_key_size);
}

Result<std::unique_ptr<Index>> Roart::create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  std::unique_ptr<Roart> idx(new Roart(std::move(pool)));
  if (Status s = idx->init_root(max_key_of(o), o.max_value_size); !s.ok()) return s;
  idx->recovery_.created = true;
  return std::unique_ptr<Index>(std::move(idx));
}

// R1-R3: the first (empty) leaf array and the root naming it as the tail, each persisted
// before it is reachable; the root is published last.
Status Roart::init_root(std::uint32_t max_key, std::uint32_t max_value) {
  Code code = Code::ok;
  const std::uint64_t off = pool_->allocator().allocate(sizeof(Root), &code);
  if (off == 0) return pool_->error(code, "no space for the index root");
  tag_ = art::run_tag(pool_->generation());
  const std::uint64_t first = new_array(kMinSlots, nullptr, 0, &code);
  if (first == 0) return pool_->error(code, "no space for the first leaf array");  // R1
  Root* r = pool_->at<Root>(off);
  Root init{};
  init.magic = kRootMagic;
  init.max_key_size = max_key;
  init.max_value_size = max_value;
  init.stamp = index_common::make_root_stamp(pool_->info().layout);
  init.tail = first;
  pm::copy(r, &init, sizeof init);
  pm::persist(r, sizeof init);  // R2
  pool_->set_root(off);         // R3
  root_ = r;
  make_tree(tag_);
  return Status::Ok();
}

Code Roart::check_key(std::string_view key) const {
  if (key_mode_ == KeyType::bytes) return key.size() > root_->max_key_size ? Code::key_too_large : Code::ok;
  if (key.size() != 8) return Code::invalid_argument;
  if (key_mode_ == KeyType::f64 && std::isnan(decode_f64(key))) return Code::invalid_argument;
  return Code::ok;
}

// --- locating and locking an array -----------------------------------------------------------

// The array whose range holds `key`. The tail word is read BEFORE the trie: a split of the
// tail inserts its separator into the trie before it replaces the tail (A6, A7), so a reader
// that finds no separator >= key after reading the tail holds a tail that covered key when it
// was read (if it was replaced since, it is obsolete and the reader starts again).
Code Roart::locate(std::string_view key, Where* w) const {
  // acquire: the array named by the word was written and persisted before it was published.
  const std::uint64_t tail = load_word(root_->tail);
  const Code c = tree_->seek_ge(key, &w->hi, &w->array);
  if (c == Code::corrupted) return c;
  const bool got = c == Code::ok;
  w->tail = !got;
  if (!got) w->array = tail;
  // The array's words are read next: its bounds first (the rest is checked at first touch).
  if (w->array % 64 != 0 || !pool_->in_heap(w->array, sizeof(ArrayHeader))) return Code::corrupted;
  return Code::ok;
}

// The array after the one named by separator hi (scans): the first separator > hi is the
// first >= hi + NUL (keys order by bytes, then length).
Code Roart::locate_after(std::string_view hi, Where* w) const {
  std::string after(hi);
  after.push_back('\0');
  return locate(after, w);
}

// Waits while a writer holds the array; returns the version to validate against. A word left
// by another run is admitted first (A9: checked, bitmap and prefix words rebuilt, retagged).
std::uint64_t Roart::read_lock(ArrayHeader* a, const Where& where, Touch* t) const {
  *t = Touch::ok;
  for (;;) {
    pm::yield_point("roart.read");
    std::uint64_t w = NodeLock::load(a->lock);
    if (NodeLock::tag_of(w) != tag_) [[unlikely]] {
      if (!admit(a, where, w)) {
        *t = Touch::damaged;
        return 0;
      }
      continue;
    }
    if (NodeLock::damaged(w)) [[unlikely]] {
      *t = Touch::damaged;
      return 0;
    }
    if (NodeLock::locked(w)) {
      pm::yield_point("roart.spin");
      __builtin_ia32_pause();
      continue;
    }
    if (NodeLock::obsolete(w)) *t = Touch::restart;
    return w;
  }
}

// A9: first touch in this run. The first thread locks the array from the stale word. An array
// with a committed intent is one whose split a crash interrupted after A5: it waits for the
// recovery walk (which marked the intent's arrays, R5) and finishes the split (R6), leaving
// the array obsolete; if the pool is too full to finish it, the split is undone (R6u) and the
// array goes on as one without an intent. Otherwise it checks the array as recovery does,
// rebuilds the volatile bitmap and prefix words and unlocks it retagged.
bool Roart::admit(ArrayHeader* a, const Where& where, std::uint64_t stale) const {
  std::string bad = check_array(pool_->offset_of(a));  // before any other word is read
  std::uint64_t ioff = bad.empty() ? load_word(a->intent) : 0;
  if (ioff != 0) {
    if (!wait_recovery_walk().ok()) return false;
    // The walk finished every merge intent (R7: the array is obsolete now, the CAS below
    // fails) or undid it (R7u: the word is 0); one still here is damage.
    ioff = load_word(a->intent);
    if (ioff != 0 && merge_intent(ioff)) return false;
  }
  std::uint64_t expected = stale;
  const std::uint64_t tag_word = std::uint64_t{tag_} << 32;
  if (!pm::cas(&a->lock, expected, tag_word | NodeLock::kLocked)) return true;
  if (ioff != 0) {
    const Pending p{pool_->offset_of(a), ioff, where.tail, where.hi};
    const Status s = finish_intent(p);
    if (s.ok()) return true;
    if (s.code() != Code::pool_full || !undo_intent(p)) {
      pm::publish(&a->lock, tag_word | NodeLock::kDamaged);
      return false;
    }
    bad = check_array(p.array);  // R6u left an ordinary array: first-touched as any other
  }
  if (!bad.empty()) {
    pm::publish(&a->lock, tag_word | NodeLock::kDamaged);
    return false;
  }
  std::uint64_t* s = slot_words(a);
  std::uint64_t* pw = prefix_words(a);
  std::uint64_t bitmap = 0;
  for (unsigned i = 0; i < slots_of(a); ++i) {
    const std::uint64_t w = load_word(s[i]);
    if (w == 0) continue;
    bitmap |= std::uint64_t{1} << i;
    pm::publish(&pw[i], prefix_of(key_of(w)));  // volatile, never persisted
  }
  pm::publish(&a->bitmap, bitmap);
  pm::publish(&a->lock, NodeLock::fresh(tag_));
  return true;
}

// Whether the intent word names a merge intent (in bounds, its kind word says so); a merge's
// right array keeps its own records (M2-M4), so they are checked as any array's.
bool Roart::merge_intent(std::uint64_t ioff) const {
  return ioff % 8 == 0 && pool_->in_heap(ioff, sizeof(Intent)) &&
         pool_->at<const Intent>(ioff)->reserved == kMergeKind;
}

// What first touch, the walk and verify check of one array's own words and the records they
// name (bounds, key lengths, fingerprints). The slots of an array with an intent are not
// checked: a split committed (A5) and its records belong to the intent's arrays, which may
// have freed some since (R5).
std::string Roart::check_array(std::uint64_t off) const {
  if (off == 0 || !pool_->in_heap(off, sizeof(ArrayHeader)) || off % 64 != 0)
    return "leaf array out of bounds";
  ArrayHeader* a = array(off);
  const std::uint64_t meta = a->meta;
  if ((meta >> 32) != kArrayMagic || !valid_class(meta & 0xffffffffu))
    return "leaf array header is invalid";
  if (!pool_->in_heap(off, array_bytes(slots_of(a)))) return "leaf array out of bounds";
  if (const std::uint64_t i = load_word(a->intent); i != 0 && !merge_intent(i)) return {};
  const std::uint64_t* s = slot_words(a);
  for (unsigned i = 0; i < slots_of(a); ++i) {
    const std::uint64_t w = load_word(s[i]);
    if (w == 0) continue;
    const std::uint64_t r = w & kOffsetMask;
    if (r % 8 != 0 || !pool_->in_heap(r, sizeof(art::Record))) return "record out of bounds";
    const art::Record* rec = pool_->at<const art::Record>(r);
    if (rec->key_len > root_->max_key_size || !pool_->in_heap(r, art::record_bytes(rec->key_len)))
      return "record key length out of range";
    if (fp_of(w) != fingerprint(key_of(w))) return "slot fingerprint does not match its key";
  }
  return {};
}

bool Roart::write_lock(ArrayHeader* a, const Where& w, Touch* t) const {
  for (;;) {
    std::uint64_t v = read_lock(a, w, t);
    if (*t != Touch::ok) return false;
    pm::yield_point("roart.upgrade");
    if (pm::cas(&a->lock, v, v + NodeLock::kLocked)) return true;
  }
}

// The holder is the only writer of a held word; release (publish): the critical section's
// writes reach the next holder and validating readers.
void Roart::unlock(ArrayHeader* a) const {
  pm::publish(&a->lock, NodeLock::bump(NodeLock::load(a->lock), NodeLock::kLocked));
}
void Roart::unlock_obsolete(ArrayHeader* a) const {
  pm::publish(&a->lock, NodeLock::bump(NodeLock::load(a->lock), NodeLock::kLocked + 1));
}

// The live slot holding key, or -1. Optimistic: the caller validates the version. The
// fingerprints are compared all at once (fp_matches): a loop over the live bits cost about
// 390 instructions of a lookup in arrays of ~45 records (callgrind, 1M keys).
int Roart::find_slot(ArrayHeader* a, std::string_view key, std::uint16_t fp) const {
  const std::uint64_t* s = slot_words(a);
  const unsigned n = std::min(slots_of(a), kMaxSlots);  // the class, immutable once published
  for (std::uint64_t m = fp_matches(s, n, fp) & load_word(a->bitmap); m != 0; m &= m - 1) {
    const int i = std::countr_zero(m);
    const std::uint64_t w = load_word(s[i]);
    if (w == 0 || fp_of(w) != fp) continue;
    if (key_of(w) == key) return i;
  }
  return -1;
}

unsigned Roart::live_items(ArrayHeader* a, Item* out) const {
  const std::uint64_t* s = slot_words(a);
  const std::uint64_t* pw = prefix_words(a);
  unsigned n = 0;
  for (std::uint64_t m = load_word(a->bitmap); m != 0; m &= m - 1) {
    const int i = std::countr_zero(m);
    const std::uint64_t w = load_word(s[i]);
    if (w != 0) out[n++] = Item{load_word(pw[i]), w};
  }
  return n;
}

// --- writes ---------------------------------------------------------------------------------

// A1: a record written and persisted while unreachable; returns its slot word (0: no space).
std::uint64_t Roart::new_record(std::string_view key, std::uint64_t value, Code* code) const {
  const std::size_t bytes = art::record_bytes(key.size());
  const std::uint64_t ref = pool_->allocator().allocate(bytes, code);
  if (ref == 0) return 0;
  art::Record* r = pool_->at<art::Record>(ref);
  const art::Record head{static_cast<std::uint32_t>(key.size()), 0, value};
  pm::copy(r, &head, sizeof head);
  if (!key.empty()) pm::copy(r->key(), key.data(), key.size());
  pm::persist(r, bytes);  // A1
  return slot_word(fingerprint(key), ref);
}

// A1: an array image built in DRAM (items packed from slot 0), copied into a fresh block and
// persisted while unreachable. Returns its offset, 0 on failure.
std::uint64_t Roart::new_array(unsigned slots, const Item* items, unsigned n, Code* code) const {
  alignas(64) unsigned char buf[array_bytes(kMaxSlots)];
  const std::size_t bytes = array_bytes(slots);
  std::memset(buf, 0, bytes);
  ArrayHeader* h = reinterpret_cast<ArrayHeader*>(buf);
  h->lock = NodeLock::fresh(tag_);
  h->meta = kArrayMagic << 32 | slots;
  h->bitmap = n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
  std::uint64_t* s = slot_words(h);
  std::uint64_t* pw = s + slots;
  for (unsigned i = 0; i < n; ++i) {
    s[i] = items[i].slot;
    pw[i] = items[i].prefix;
  }
  const std::uint64_t ref = pool_->allocator().allocate(bytes, code);
  if (ref == 0) return 0;
  void* dst = pool_->at<void>(ref);
  pm::copy(dst, buf, bytes);
  pm::persist(dst, bytes);  // A1
  return ref;
}

// A3/A7: the one 8-byte store that makes new_array take old_array's place (the trie record's
// value word of separator hi, or the root's tail word). Caller holds old_array's lock.
Code Roart::replace(const Where& w, std::uint64_t old_array, std::uint64_t new_array) const {
  if (w.tail) {
    if (load_word(root_->tail) != old_array) return Code::corrupted;
    pm::publish(&root_->tail, new_array);
    pm::persist(&root_->tail, sizeof root_->tail);  // A3 / A7 (tail)
    return Code::ok;
  }
  std::uint64_t old = 0;
  const Code c = tree_->update(w.hi, new_array, &old);  // A3 / A7 (the core's P8)
  if (c != Code::ok) return c;
  return old == old_array ? Code::ok : Code::corrupted;
}

// A full array (lock held) meets one more record: a copy in the next size class takes all
// (A2-A3), or a full 64-slot array splits (A4-A8). On success the array is left obsolete and
// unlocked; otherwise still locked, and the caller frees the record.
Code Roart::grow_or_split(const Where& w, ArrayHeader* a, std::uint64_t rec_slot) {
  std::vector<Item> items(kMaxSlots + 1);
  const unsigned n = live_items(a, items.data());
  items.resize(n);
  items.push_back(Item{prefix_of(key_of(rec_slot)), rec_slot});
  const std::uint64_t off = pool_->offset_of(a);
  const unsigned slots = slots_of(a);
  if (slots >= kMaxSlots) return split(w, a, items);
  Code code = Code::ok;
  const std::uint64_t grown = new_array(slots * 2, items.data(), n + 1, &code);  // A2
  if (grown == 0) return code;
  if (const Code c = replace(w, off, grown); c != Code::ok) {
    pool_->allocator().deallocate(grown, array_bytes(slots * 2));
    return c;
  }
  unlock_obsolete(a);
  retire_array(off);
  grows_.fetch_add(1, std::memory_order_relaxed);
  return Code::ok;
}

// A4-A8: the 65 records sorted by key split in two halves; the separator is the left half's
// greatest key. Both new arrays and the intent are persisted (A4), the intent is committed in
// the old array (A5), the separator enters the trie naming the left array (A6), the old
// array's name moves to the right array (A7), the old array leaves (A8). A crash after A5
// is finished by the recovery walk (R5), before anything else can change these arrays.
Code Roart::split(const Where& w, ArrayHeader* a, std::vector<Item>& items) {
  std::sort(items.begin(), items.end(), [&](const Item& x, const Item& y) {
    if (x.prefix != y.prefix) return x.prefix < y.prefix;
    return compare(key_of(x.slot), key_of(y.slot)) < 0;
  });
  const unsigned total = static_cast<unsigned>(items.size());
  const unsigned half = total / 2;
  const std::string_view sep = key_of(items[half - 1].slot);
  auto class_for = [](unsigned k) {
    unsigned c = kMinSlots;
    while (c < k) c *= 2;
    return c;
  };
  const unsigned lslots = class_for(half), rslots = class_for(total - half);
  Code code = Code::ok;
  const std::uint64_t left = new_array(lslots, items.data(), half, &code);  // A4
  const std::uint64_t right =
      left == 0 ? 0 : new_array(rslots, items.data() + half, total - half, &code);  // A4
  const std::size_t ibytes = sizeof(Intent) + sep.size();
  const std::uint64_t ioff = right == 0 ? 0 : pool_->allocator().allocate(ibytes, &code);
  auto drop = [&] {
    if (ioff != 0) pool_->allocator().deallocate(ioff, ibytes);
    if (right != 0) pool_->allocator().deallocate(right, array_bytes(rslots));
    if (left != 0) pool_->allocator().deallocate(left, array_bytes(lslots));
  };
  if (ioff == 0) {
    drop();
    return code;
  }
  Intent* in = pool_->at<Intent>(ioff);
  const Intent head{static_cast<std::uint32_t>(sep.size()), 0, left, right};
  pm::copy(in, &head, sizeof head);
  if (!sep.empty()) pm::copy(in + 1, sep.data(), sep.size());
  pm::persist(in, ibytes);  // A4
  pm::publish(&a->intent, ioff);
  pm::persist(&a->intent, sizeof a->intent);  // A5: the split's commit
  const Code c = tree_->insert(sep, left);     // A6
  if (c != Code::ok) {  // pool_full (or damage): undo A5, nothing else was published
    pm::publish(&a->intent, 0);
    pm::persist(&a->intent, sizeof a->intent);
    drop();
    return c == Code::already_present ? Code::corrupted : c;
  }
  const std::uint64_t off = pool_->offset_of(a);
  if (const Code r = replace(w, off, right); r != Code::ok) return r;  // A7
  unlock_obsolete(a);
  retire_array(off);  // A8
  retire_intent(ioff);
  splits_.fetch_add(1, std::memory_order_relaxed);
  return Code::ok;
}

// A3e's guard (R6 relies on it): an array still holding a split intent whose separator is
// w.hi (a split cut between A6 and A7 by a crash, not yet touched in this run) must see w.hi
// in the trie at its R6, or it would read "A6 not done" and name w.hi's array, freed by A3e,
// again (and R5 would mark it). So the next array, if it holds an intent, is touched first:
// R6 finishes its split (a live split in progress there is waited for). False: it is damaged
// (the empty array stays). Only rightward waits, so no lock cycle: nothing holding the next
// array's lock waits for this one's.
bool Roart::next_split_settled(const Where& w) const {
  Where next;
  if (locate_after(w.hi, &next) != Code::ok) return false;
  ArrayHeader* n = array(next.array);  // its header is in bounds (locate checked)
  if (load_word(n->intent) == 0) return true;  // the live case: nothing to wait for
  Touch t;
  (void)read_lock(n, next, &t);
  return t != Touch::damaged;
}

// A3s: after a remove leaves an array at a quarter of its class (above the smallest), a copy
// in the class below takes its place (one 8-byte store, as a grow). A3e: an array left empty
// (not the tail) leaves the trie: its separator's record is removed (the core's P9), so the
// next array's range takes in the empty one's (a range may grow without its array's lock: a
// writer holding that lock still covers its key). Lock held; on success the array is left
// obsolete and unlocked. No space: the array stays as it is.
void Roart::maybe_shrink(const Where& w, ArrayHeader* a) {
  const unsigned slots = slots_of(a);
  const unsigned live = static_cast<unsigned>(std::popcount(load_word(a->bitmap)));
  if (live == 0 && !w.tail && next_split_settled(w)) {
    std::uint64_t named = 0;
    const Code c = tree_->remove(w.hi, &named);  // A3e
    if (c == Code::ok && named == pool_->offset_of(a)) {
      unlock_obsolete(a);
      retire_array(named);
      shrinks_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // pool_full (the trie could not shrink a node) or damage: the empty array stays
    if (c == Code::ok) corrupted_.store(true, std::memory_order_relaxed);  // relaxed: a flag
  }
  // M0: an underfull array first tries its right neighbour (locked after it, the lock order),
  // then, once unlocked (and shrunk if due), its left neighbour (locked first, then it again).
  // Looked for at 16, 12, 8 and 4 records (M0): a remove-heavy run on arrays whose
  // neighbours are too full pays the neighbour search on one remove in four, not on each.
  const bool underfull = live <= kMergeBelow && live % 4 == 0;
  if (underfull && !w.tail && merge_right(w, a)) return;
  std::string kmin;  // the smallest key held: where merge_left looks left from
  if (underfull && live != 0) {
    Item items[kMaxSlots];
    const unsigned n = live_items(a, items);
    kmin = smallest_key(items, n);
  }
  if (slots <= kMinSlots || live > slots / 4) {
    unlock(a);
    if (underfull && live != 0) merge_left(w, kmin);
    return;
  }
  Item items[kMaxSlots];
  const unsigned n = live_items(a, items);
  Code code = Code::ok;
  const std::uint64_t small = new_array(slots / 2, items, n, &code);
  const std::uint64_t off = pool_->offset_of(a);
  if (small == 0 || replace(w, off, small) != Code::ok) {
    if (small != 0) pool_->allocator().deallocate(small, array_bytes(slots / 2));
    unlock(a);
  } else {
    unlock_obsolete(a);
    retire_array(off);
    shrinks_.fetch_add(1, std::memory_order_relaxed);
  }
  if (underfull && live != 0) merge_left(w, kmin);
}

// The smallest key of `n` >= 1 live items (slots are not in key order): where merge_left
// looks left from.
std::string Roart::smallest_key(const Item* items, unsigned n) const {
  std::string_view kmin = key_of(items[0].slot);
  for (unsigned i = 1; i < n; ++i)
    if (compare(key_of(items[i].slot), kmin) < 0) kmin = key_of(items[i].slot);
  return std::string(kmin);
}

// M0, rightward: a (locked, named at w, not the tail) and the array after it. The right one
// is locked second (every writer that holds two array locks took the left one first, and A3e
// only waits rightward, so no cycle). True: merged, a unlocked.
bool Roart::merge_right(const Where& w, ArrayHeader* a) {
  Where wb;
  if (locate_after(w.hi, &wb) != Code::ok) return false;
  ArrayHeader* b = array(wb.array);
  Touch t;
  if (!write_lock(b, wb, &t)) return false;  // replaced meanwhile (or damaged): not now
  // Locked and not obsolete, found as the first separator above w.hi while a (and so w.hi)
  // stays: b is a's right neighbour.
  if (merge(w, a, wb, b)) return true;
  unlock(b);
  return false;
}

// M0, leftward: the array named at w (no lock held) and its left neighbour, found from kmin
// (a key it held; what is found is checked under the locks). The left array is locked first,
// then whatever array now follows it.
void Roart::merge_left(const Where& w, const std::string& kmin) {
  Where wl;
  if (!left_of(w, kmin, &wl)) return;
  ArrayHeader* l = array(wl.array);
  Touch t;
  if (!write_lock(l, wl, &t)) return;
  Where wb;
  ArrayHeader* b = nullptr;
  if (locate_after(wl.hi, &wb) == Code::ok) {
    b = array(wb.array);
    if (!write_lock(b, wb, &t)) b = nullptr;
  }
  if (b != nullptr && merge(wl, l, wb, b)) return;
  if (b != nullptr) unlock(b);
  unlock(l);
}

bool Roart::lands_on(const Where& w, std::string_view from) const {
  std::string hi;
  std::uint64_t v = 0;
  const Code c = tree_->seek_ge(from, &hi, &v);
  return w.tail ? c == Code::not_found : c == Code::ok && hi == w.hi;
}

// The trie entry before w's (w.tail: the last one). Its separator s is the greatest below
// kmin; let c* be the length of the common prefix of s and kmin. For c > c*, kmin's first c
// bytes are above s, so seek_ge of them lands on w's own name; for c <= c* they are <= s, so
// it lands on s or before. A binary search over c finds c* (O(log |kmin|) seeks of one entry);
// then a short scan from `from` = kmin[0, c*) (a prefix of s) meets s just before w's name.
// If more separators than the scan takes lie between, s's next byte is found by a binary
// search over bytes (seek_ge(from + x) lands on w's name iff x > that byte) and appended to
// `from`, a few rounds at most; otherwise not found, no merge. Concurrent changes can only make
// this miss or find a stale entry, which merge_left refuses under the locks.
bool Roart::left_of(const Where& w, std::string_view kmin, Where* left) const {
  constexpr std::size_t kLook = 16;
  if (lands_on(w, {})) return false;     // w's array is the first one
  if (!lands_on(w, kmin)) return false;  // w's range changed meanwhile
  std::size_t lo = 0, hi = kmin.size();  // lands_on(kmin[0, lo)) false, (kmin[0, hi)) true
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (lands_on(w, kmin.substr(0, mid))) hi = mid;
    else lo = mid;
  }
  std::string from(kmin.substr(0, lo));
  std::vector<std::pair<std::string, std::uint64_t>> got;
  for (int round = 0; round < 8; ++round) {
    got.clear();
    if (tree_->scan(from, kLook, [&](std::string_view k, std::uint64_t v) {
          got.emplace_back(k, v);
        }) != Code::ok)
      return false;
    std::size_t j = 0;
    if (w.tail) {
      j = got.size() < kLook ? got.size() : 0;  // 0: the end was not reached
    } else {
      while (j < got.size() && got[j].first != w.hi) ++j;
      if (j == got.size()) j = 0;
    }
    if (j != 0) {
      left->array = got[j - 1].second;
      left->tail = false;
      left->hi = std::move(got[j - 1].first);
      return left->array % 64 == 0 && pool_->in_heap(left->array, sizeof(ArrayHeader));
    }
    if (got.size() < kLook) return false;  // w's name met first: changed meanwhile
    unsigned blo = 0, bhi = 256;  // lands_on(from + blo) false; bhi: true (or past the bytes)
    from.push_back('\0');
    if (lands_on(w, from)) return false;
    while (bhi - blo > 1) {
      const unsigned mid = (blo + bhi) / 2;
      from.back() = static_cast<char>(mid);
      if (lands_on(w, from)) bhi = mid;
      else blo = mid;
    }
    from.back() = static_cast<char>(blo);
  }
  return false;
}

// M1-M5: a (named by separator wa.hi) and b, its right neighbour (named at wb), both locked,
// become one array m in the smallest class holding both (at most kMergeMax records), named
// where b was; a's separator leaves the trie. M1 m and the merge intent {wa.hi, a, m} are
// written and persisted while unreachable; M2 the intent's offset is stored into b's intent
// word and persisted: the commit (a crash from here is finished by the recovery walk, R7);
// M3 wa.hi is removed from the trie (the core's P9): a's keys now reach b, which is locked;
// M4 b's name is set to m (one store, persisted); M5 a and b are unlocked obsolete and
// retired with the intent. If M3 cannot allocate, M2 is undone and nothing changed.
bool Roart::merge(const Where& wa, ArrayHeader* a, const Where& wb, ArrayHeader* b) {
  Item items[2 * kMaxSlots];
  unsigned n = live_items(a, items);
  n += live_items(b, items + n);
  if (n > kMergeMax) return false;
  unsigned slots = kMinSlots;
  while (slots < n) slots *= 2;
  const std::uint64_t aoff = pool_->offset_of(a), boff = pool_->offset_of(b);
  Code code = Code::ok;
  const std::uint64_t m = new_array(slots, items, n, &code);  // M1
  if (m == 0) {
    t_merge_starved = code == Code::pool_full;
    return false;
  }
  const std::size_t ibytes = sizeof(Intent) + wa.hi.size();
  std::uint64_t ioff = 0;
  if (!merge_without_intent()) {
    ioff = pool_->allocator().allocate(ibytes, &code);
    if (ioff == 0) {
      pool_->allocator().deallocate(m, array_bytes(slots));
      t_merge_starved = code == Code::pool_full;
      return false;
    }
    Intent* in = pool_->at<Intent>(ioff);
    const Intent head{static_cast<std::uint32_t>(wa.hi.size()), kMergeKind, aoff, m};
    pm::copy(in, &head, sizeof head);
    if (!wa.hi.empty()) pm::copy(in + 1, wa.hi.data(), wa.hi.size());
    pm::persist(in, ibytes);  // M1
    pm::publish(&b->intent, ioff);
    pm::persist(&b->intent, sizeof b->intent);  // M2: the merge's commit
  }
  std::uint64_t named = 0;
  const Code c = tree_->remove(wa.hi, &named);  // M3
  if (c != Code::ok) {  // pool_full (a trie node could not shrink) or damage: undo M2
    if (ioff != 0) {
      pm::publish(&b->intent, 0);
      pm::persist(&b->intent, sizeof b->intent);
      pool_->allocator().deallocate(ioff, ibytes);
    }
    pool_->allocator().deallocate(m, array_bytes(slots));
    if (c != Code::pool_full) corrupted_.store(true, std::memory_order_relaxed);  // relaxed: a flag
    return false;
  }
  if (named != aoff || replace(wb, boff, m) != Code::ok) {  // M4
    // The trie named another array at wa.hi, or b is not named where it was found: damage.
    corrupted_.store(true, std::memory_order_relaxed);  // relaxed: a flag
    unlock_obsolete(a);
    unlock(b);
    return true;
  }
  unlock_obsolete(a);  // M5
  unlock_obsolete(b);
  retire_array(aoff);
  retire_array(boff);
  if (ioff != 0) retire_intent(ioff);
  merges_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// --- reclamation (the trie's epoch manager) --------------------------------------------------

void Roart::free_array(void* self, std::uint64_t off) {
  const Roart* t = static_cast<const Roart*>(self);
  t->pool_->allocator().deallocate(off, array_bytes(slots_of(t->array(off))));
}
void Roart::free_record(void* self, std::uint64_t off) {
  const Roart* t = static_cast<const Roart*>(self);
  const art::Record* r = t->pool_->at<const art::Record>(off);
  t->pool_->allocator().deallocate(off, art::record_bytes(r->key_len));
}
void Roart::free_value(void* self, std::uint64_t word) {
  static_cast<const Roart*>(self)->values_.release(word);
}
void Roart::free_intent(void* self, std::uint64_t off) {
  const Roart* t = static_cast<const Roart*>(self);
  const Intent* in = t->pool_->at<const Intent>(off);
  t->pool_->allocator().deallocate(off, sizeof(Intent) + in->key_len);
}
void Roart::retire_array(std::uint64_t off) const {
  tree_->epochs().retire(const_cast<Roart*>(this), &free_array, off);
}
void Roart::retire_record(std::uint64_t slot) const {
  tree_->epochs().retire(const_cast<Roart*>(this), &free_record, slot & kOffsetMask);
}
void Roart::retire_value(std::uint64_t word) const {
  if (!values_.inline_values()) tree_->epochs().retire(const_cast<Roart*>(this), &free_value, word);
}
void Roart::retire_intent(std::uint64_t off) const {
  tree_->epochs().retire(const_cast<Roart*>(this), &free_intent, off);
}

// --- operations -----------------------------------------------------------------------------

// Runs op(where, array, fingerprint) with the array of key locked, starting again from the
// trie while the array met turns out replaced. op unlocks the array.
template <class Op>
Code Roart::with_array(std::string_view key, Op&& op) {
  auto guard = tree_->epochs().pin();
  const std::uint16_t fp = fingerprint(key);
  for (;;) {
    Where w;
    if (const Code c = locate(key, &w); c != Code::ok) return c;
    ArrayHeader* a = array(w.array);
    Touch t;
    if (!write_lock(a, w, &t)) {
      if (t == Touch::damaged) return Code::corrupted;
      pm::yield_point("roart.restart");
      continue;
    }
    // Locked and not obsolete: the array still has the name locate found, so it covers key.
    return op(w, a, fp);
  }
}

Code Roart::insert_word(std::string_view key, std::uint64_t word) {
  return with_array(key, [&](const Where& w, ArrayHeader* a, std::uint16_t fp) {
    if (find_slot(a, key, fp) >= 0) {
      unlock(a);
      return Code::already_present;
    }
    Code code = Code::ok;
    const std::uint64_t rec = new_record(key, word, &code);  // A1
    if (rec == 0) {
      unlock(a);
      return code;
    }
    const std::uint64_t bitmap = load_word(a->bitmap);
    const unsigned slots = slots_of(a);
    const std::uint64_t full = slots == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << slots) - 1;
    if (bitmap != full) {
      const int i = std::countr_one(bitmap);
      pm::publish(&prefix_words(a)[i], prefix_of(key));  // volatile (A9 rebuilds it)
      pm::publish(&slot_words(a)[i], rec);
      pm::persist(&slot_words(a)[i], sizeof rec);  // A2a: the insert's commit
      pm::publish(&a->bitmap, bitmap | std::uint64_t{1} << i);
      unlock(a);
      return Code::ok;
    }
    const Code c = grow_or_split(w, a, rec);
    if (c != Code::ok) {
      unlock(a);
      pool_->allocator().deallocate(rec & kOffsetMask, art::record_bytes(key.size()));
    }
    return c;
  });
}

Code Roart::update_word(std::string_view key, std::uint64_t word, std::uint64_t* old) {
  return with_array(key, [&](const Where&, ArrayHeader* a, std::uint16_t fp) {
    const int i = find_slot(a, key, fp);
    if (i < 0) {
      unlock(a);
      return Code::not_found;
    }
    Code code = Code::ok;
    const std::uint64_t rec = new_record(key, word, &code);  // A1: out of place
    if (rec == 0) {
      unlock(a);
      return code;
    }
    std::uint64_t* s = &slot_words(a)[i];
    const std::uint64_t prev = load_word(*s);
    *old = load_word(record(prev)->value);
    pm::publish(s, rec);
    pm::persist(s, sizeof rec);  // A2b: one slot-word swap
    unlock(a);
    retire_record(prev);
    return Code::ok;
  });
}

Code Roart::remove_word(std::string_view key, std::uint64_t* old) {
  return with_array(key, [&](const Where& w, ArrayHeader* a, std::uint16_t fp) {
    const int i = find_slot(a, key, fp);
    if (i < 0) {
      unlock(a);
      return Code::not_found;
    }
    std::uint64_t* s = &slot_words(a)[i];
    const std::uint64_t prev = load_word(*s);
    *old = load_word(record(prev)->value);
    pm::publish(s, 0);
    pm::persist(s, sizeof *s);  // A2c: the remove's commit
    pm::publish(&a->bitmap, load_word(a->bitmap) & ~(std::uint64_t{1} << i));
    maybe_shrink(w, a);  // unlocks
    retire_record(prev);
    return Code::ok;
  });
}

// Optimistic: the value word is read before the array's version is validated; a writer
// persists before it unlocks, so a validated answer is never taken back by a crash.
Code Roart::find_word(std::string_view key, std::uint64_t* word) const {
  const std::uint16_t fp = fingerprint(key);
  for (;;) {
    Where w;
    if (const Code c = locate(key, &w); c != Code::ok) return c;
    ArrayHeader* a = array(w.array);
    Touch t;
    const std::uint64_t v = read_lock(a, w, &t);
    if (t == Touch::damaged) return Code::corrupted;
    if (t == Touch::restart) continue;
    const int i = find_slot(a, key, fp);
    std::uint64_t value = 0;
    if (i >= 0) {
      const std::uint64_t s = load_word(slot_words(a)[i]);
      if (s != 0) value = load_word(record(s)->value);
    }
    pm::yield_point("roart.check");
    if (NodeLock::load(a->lock) != v) continue;
    if (i < 0) return Code::not_found;
    *word = value;
    return Code::ok;
  }
}

Code Roart::writable() const {
  if (!walk_done_.load(std::memory_order_acquire)) [[unlikely]]
    (void)wait_recovery_walk();
  return corrupted_.load(std::memory_order_relaxed) ? Code::corrupted : Code::ok;
}

Code Roart::insert(std::string_view key, std::string_view value) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;
  return count_insert(index_common::retry_after_reclaim(tree_->epochs(), [&] {
    Code code = Code::ok;
    const std::uint64_t word = values_.make_word(value, &code);  // K1 (out of line)
    if (code != Code::ok) return code;
    const Code c = insert_word(key, word);
    if (c != Code::ok) values_.release(word);  // never published
    return c;
  }));
}

Code Roart::update(std::string_view key, std::string_view value) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;
  return index_common::retry_after_reclaim(tree_->epochs(), [&] {
    Code code = Code::ok;
    const std::uint64_t word = values_.make_word(value, &code);
    if (code != Code::ok) return code;
    std::uint64_t old = 0;
    const Code c = update_word(key, word, &old);
    if (c != Code::ok) {
      values_.release(word);
      return c;
    }
    retire_value(old);
    return Code::ok;
  });
}

Code Roart::find(std::string_view key, std::string* value) const {
  if (Code c = check_key(key); c != Code::ok) return c;
  auto guard = tree_->epochs().pin();  // records and out-of-line values stay until copied
  std::uint64_t word = 0;
  const Code c = find_word(key, &word);
  if (c == Code::ok && value != nullptr && !values_.read(word, value)) return Code::corrupted;
  return c;
}

// Batched lookups (Index::find_many), under one pin as find. First the trie's interleaved
// exact-match descents (art::Tree::find_batch) as a warm-up whose answers are dropped: a key
// that is not a separator still walks, with its misses overlapped, the nodes its seek_ge
// visits down to where it leaves the trie. Then probe_batch runs find_word's steps pass by
// pass, and find_word answers alone every key probe_batch could not.
void Roart::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                       std::size_t n) const {
  static_assert(kFindBatch <= PmTree::kMaxBatch && kFindBatch <= 64);
  std::string_view ok_keys[kFindBatch];
  std::uint8_t at[kFindBatch];  // batch position of the j-th well-formed key
  const std::size_t live = index_common::compact_checked(
      keys, codes, n, [&](std::string_view k) { return check_key(k); },
      [&](std::string_view k) { return k; }, ok_keys, at);
  if (live == 0) return;
  auto guard = tree_->epochs().pin();  // records and out-of-line values stay until copied
  std::uint64_t words[kFindBatch];
  Code got[kFindBatch];
  tree_->find_batch(ok_keys, live, words, got);  // warm-up only: got and words are rewritten
  for (std::uint64_t m = probe_batch(ok_keys, live, words, got); m != 0; m &= m - 1) {
    const auto j = static_cast<std::size_t>(std::countr_zero(m));
    got[j] = find_word(ok_keys[j], &words[j]);
  }
  for (std::size_t j = 0; j < live; ++j) {
    const std::size_t i = at[j];
    codes[i] = got[j];
    if (got[j] == Code::ok && values != nullptr && !values_.read(words[j], &values[i]))
      codes[i] = Code::corrupted;
  }
}

// find_word's steps for every key, one pass per step, each pass ending with a prefetch of
// what the key reads in the next one: locate (the trie is warm) and the array's header line;
// read_lock (A9 first touch included) and the array's slot words; the records whose
// fingerprint matches; then find_slot, the value word and the version check exactly as
// find_word does them. A key whose array is obsolete or whose version changed goes to the
// returned mask; damage answers corrupted as find_word does.
std::uint64_t Roart::probe_batch(const std::string_view* keys, std::size_t n,
                                 std::uint64_t* words, Code* got) const {
  Where w[kFindBatch];
  ArrayHeader* arr[kFindBatch];
  std::uint64_t ver[kFindBatch];
  std::uint16_t fp[kFindBatch];
  std::uint64_t live = 0, alone = 0;
  for (std::size_t j = 0; j < n; ++j) {
    got[j] = locate(keys[j], &w[j]);
    if (got[j] != Code::ok) continue;
    arr[j] = array(w[j].array);
    index_common::prefetch_lines(arr[j], 64);
    fp[j] = fingerprint(keys[j]);
    live |= std::uint64_t{1} << j;
  }
  for (std::uint64_t m = live; m != 0; m &= m - 1) {
    const auto j = static_cast<std::size_t>(std::countr_zero(m));
    Touch t;
    ver[j] = read_lock(arr[j], w[j], &t);
    if (t != Touch::ok) {
      live &= ~(std::uint64_t{1} << j);
      if (t == Touch::damaged) got[j] = Code::corrupted;
      else alone |= std::uint64_t{1} << j;
      continue;
    }
    // Admitted: meta was checked (a class of at most 64 slots in bounds).
    index_common::prefetch_lines(slot_words(arr[j]), 8 * slots_of(arr[j]));
  }
  for (std::uint64_t m = live; m != 0; m &= m - 1) {
    const auto j = static_cast<std::size_t>(std::countr_zero(m));
    const std::uint64_t* s = slot_words(arr[j]);
    for (std::uint64_t b = load_word(arr[j]->bitmap); b != 0; b &= b - 1) {
      const std::uint64_t sw = load_word(s[std::countr_zero(b)]);
      if (sw != 0 && fp_of(sw) == fp[j]) index_common::prefetch_lines(record(sw), 64);
    }
  }
  for (std::uint64_t m = live; m != 0; m &= m - 1) {
    const auto j = static_cast<std::size_t>(std::countr_zero(m));
    ArrayHeader* a = arr[j];
    const int i = find_slot(a, keys[j], fp[j]);
    std::uint64_t value = 0;
    if (i >= 0) {
      const std::uint64_t s = load_word(slot_words(a)[i]);
      if (s != 0) value = load_word(record(s)->value);
    }
    pm::yield_point("roart.check");
    if (NodeLock::load(a->lock) != ver[j]) {
      alone |= std::uint64_t{1} << j;
      continue;
    }
    got[j] = i < 0 ? Code::not_found : Code::ok;
    if (i >= 0) words[j] = value;
  }
  return alone;
}

Code Roart::remove(std::string_view key) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;
  std::uint64_t old = 0;
  t_merge_starved = false;
  const Code c = remove_word(key, &old);
  if (c == Code::ok) retire_value(old);
  if (t_merge_starved && index_common::reclaim_deferred(tree_->epochs())) merge_at(key);
  t_merge_starved = false;
  return count_remove(c);
}

// M0 once more for the array holding key (after a merge found no space and deferred frees
// ran): the same tries as after the remove, without the shrink.
void Roart::merge_at(std::string_view key) {
  (void)with_array(key, [&](const Where& w, ArrayHeader* a, std::uint16_t) {
    Item items[kMaxSlots];
    const unsigned n = live_items(a, items);
    if (n == 0 || n > kMergeBelow || (!w.tail && merge_right(w, a))) {
      if (n == 0 || n > kMergeBelow) unlock(a);
      return Code::ok;
    }
    const std::string kmin = smallest_key(items, n);
    unlock(a);
    merge_left(w, kmin);
    return Code::ok;
  });
}

// The array's records with key >= from (> from when `after`), in key order, at most max:
// sorted by prefix word, keys compared only on prefix ties, copied out and then validated
// against the array's version (Touch::restart: the array changed, read it again).
Roart::Touch Roart::copy_out(ArrayHeader* a, const Where& w, std::string_view from, bool after,
                             std::size_t max,
                             std::vector<std::pair<std::string, std::uint64_t>>* out) const {
  Touch t;
  const std::uint64_t v = read_lock(a, w, &t);
  if (t != Touch::ok) return t;
  Item items[kMaxSlots];
  const unsigned n = live_items(a, items);
  out->clear();
  if (copy_first_scans_) {
    // Copy-first: every live record's key and value in slot order (their lines requested at
    // once), then a sort by full key.
    for (unsigned i = 0; i < n; ++i) index_common::prefetch_lines(record(items[i].slot), 64);
    for (unsigned i = 0; i < n; ++i) {
      const std::string_view key = key_of(items[i].slot);
      const int c = compare(key, from);
      if (c < 0 || (after && c == 0)) continue;
      out->emplace_back(std::string(key), load_word(record(items[i].slot)->value));
    }
    std::sort(out->begin(), out->end());
    if (out->size() > max) out->resize(max);
    pm::yield_point("roart.check");
    return NodeLock::load(a->lock) == v ? Touch::ok : Touch::restart;
  }
  const std::uint64_t fp = prefix_of(from);
  unsigned k = 0;
  for (unsigned i = 0; i < n; ++i) {  // drop what is certainly below `from` by prefix alone
    if (items[i].prefix < fp) continue;
    items[k++] = items[i];
  }
  std::sort(items, items + k, [&](const Item& x, const Item& y) {
    if (x.prefix != y.prefix) return x.prefix < y.prefix;
    return compare(key_of(x.slot), key_of(y.slot)) < 0;
  });
  // The records to be copied, requested at once (+1: the first may equal `from`).
  for (unsigned i = 0; i < k && i <= max; ++i) index_common::prefetch_lines(record(items[i].slot), 64);
  for (unsigned i = 0; i < k && out->size() < max; ++i) {
    const std::string_view key = key_of(items[i].slot);
    const int c = items[i].prefix == fp ? compare(key, from) : 1;
    if (c < 0 || (after && c == 0)) continue;
    out->emplace_back(std::string(key), load_word(record(items[i].slot)->value));
  }
  pm::yield_point("roart.check");
  return NodeLock::load(a->lock) == v ? Touch::ok : Touch::restart;
}

std::size_t Roart::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  if (max == 0) return 0;
  auto guard = tree_->epochs().pin();
  std::string from(start);
  bool after = false;  // from was emitted already (a resumed array)
  std::vector<std::pair<std::string, std::uint64_t>> got;
  std::string value;
  Where w;
  bool have = false;  // w holds the next array to read
  while (out.size() < max) {
    if (!have && locate(from, &w) != Code::ok) break;
    have = false;
    const Touch t = copy_out(array(w.array), w, from, after, max - out.size(), &got);
    if (t == Touch::damaged) break;
    if (t == Touch::restart) {  // replaced meanwhile: look from the same key again
      pm::yield_point("roart.restart");
      continue;
    }
    for (const auto& [k, word] : got) {
      if (!values_.read(word, &value)) value.clear();
      out.append(k, value);
    }
    if (!got.empty()) {
      from = got.back().first;
      after = true;
    }
    if (w.tail || out.size() >= max) break;
    // The next array: the one after separator hi (its keys are all > hi >= from).
    const std::string hi = w.hi;
    if (locate_after(hi, &w) != Code::ok) break;
    have = true;
    from = hi;  // every key of the next array is > hi, and hi >= start
    after = true;
  }
  return out.size();
}

// --- verify and footprint ---------------------------------------------------------------------

namespace {
bool array_word_ok(const void* ctx, std::uint64_t word) {
  const pm::Pool* p = static_cast<const pm::Pool*>(ctx);
  return word % 64 == 0 && p->in_heap(word, sizeof(ArrayHeader));
}
}  // namespace

Status Roart::verify() const {
  if (Status s = wait_recovery_walk(); !s.ok()) return s;
  // First touch of every array (quiescent): interrupted splits are finished (A9, R6) and
  // metadata rebuilt, so what follows checks the structure as operations see it.
  for (bool again = true; again;) {
    again = false;
    auto guard = tree_->epochs().pin();
    std::vector<Where> all;
    tree_->scan("", ~std::size_t{0}, [&](std::string_view k, std::uint64_t v) {
      all.push_back(Where{v, false, std::string(k)});
    });
    all.push_back(Where{load_word(root_->tail), true, {}});
    for (const Where& w : all) {
      if (!check_array(w.array).empty()) break;  // reported below
      Touch t;
      (void)read_lock(array(w.array), w, &t);
      if (t == Touch::damaged) return pool_->error(Code::corrupted, "roart: a leaf array is damaged");
      if (t == Touch::restart) again = true;
    }
  }
  art::TreeStats st;
  if (std::string e = tree_->verify(&st, /*allow_stale=*/true, &array_word_ok, pool_.get());
      !e.empty())
    return pool_->error(Code::corrupted, "roart trie: " + e);
  std::vector<std::pair<std::string, std::uint64_t>> names;
  tree_->scan("", st.records + 1, [&](std::string_view k, std::uint64_t v) { names.emplace_back(k, v); });
  names.emplace_back(std::string(), load_word(root_->tail));
  std::vector<std::uint64_t> seen;
  const std::string* lo = nullptr;
  std::uint64_t records = 0;
  for (std::size_t j = 0; j < names.size(); ++j) {
    const bool tail = j + 1 == names.size();
    const std::uint64_t off = names[j].second;
    auto bad = [&](const std::string& what) {
      return pool_->error(Code::corrupted, "roart leaf array " + std::to_string(j) + ": " + what);
    };
    if (std::string e = check_array(off); !e.empty()) return bad(e);
    seen.push_back(off);
    ArrayHeader* a = array(off);
    if (load_word(a->intent) != 0) return bad("reachable array has a split intent");
    const std::uint64_t lock = NodeLock::load(a->lock);
    const bool touched = NodeLock::tag_of(lock) == tag_;
    if (touched && NodeLock::obsolete(lock)) return bad("reachable array is obsolete");
    std::vector<std::string> keys;
    std::uint64_t bitmap = 0;
    for (unsigned i = 0; i < slots_of(a); ++i) {
      const std::uint64_t s = load_word(slot_words(a)[i]);
      if (s == 0) continue;
      bitmap |= std::uint64_t{1} << i;
      const std::string_view k = key_of(s);
      if (touched && load_word(prefix_words(a)[i]) != prefix_of(k))
        return bad("prefix word does not match its key");
      if (lo != nullptr && compare(k, *lo) <= 0) return bad("key below the array's range");
      if (!tail && compare(k, names[j].first) > 0) return bad("key above the array's separator");
      std::size_t vbytes = 0;
      if (!values_.record_size(record(s)->value, &vbytes)) return bad("value word is unreadable");
      keys.emplace_back(k);
    }
    if (touched && bitmap != load_word(a->bitmap)) return bad("bitmap disagrees with the slots");
    std::sort(keys.begin(), keys.end());
    if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return bad("a key is held twice");
    records += keys.size();
    lo = &names[j].first;
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
    return pool_->error(Code::corrupted, "roart: one leaf array is named twice");
  (void)records;
  return Status::Ok();
}

std::uint64_t Roart::array_count_for_testing() const {
  std::uint64_t n = 1;  // the tail
  tree_->scan("", ~std::size_t{0}, [&](std::string_view, std::uint64_t) { ++n; });
  return n;
}

std::uint64_t Roart::requested_bytes_for_testing() const {
  std::uint64_t bytes = sizeof(Root);
  std::vector<std::uint64_t> arrays{load_word(root_->tail)};
  (void)tree_->walk([&](std::uint64_t, std::size_t b, bool is_record, std::uint64_t value) {
    bytes += b;
    if (is_record) arrays.push_back(value);
    return true;
  });
  for (const std::uint64_t off : arrays) {
    ArrayHeader* a = array(off);
    bytes += array_bytes(slots_of(a));
    for (unsigned i = 0; i < slots_of(a); ++i) {
      const std::uint64_t s = load_word(slot_words(a)[i]);
      if (s == 0) continue;
      bytes += art::record_bytes(record(s)->key_len);
      std::size_t vb = 0;
      if (!values_.inline_values() && values_.record_size(record(s)->value, &vb)) bytes += vb;
    }
  }
  return bytes;
}

void Roart::corrupt_for_testing(int what) {
  std::uint64_t first = 0;
  std::string hi;
  tree_->scan("", 1, [&](std::string_view k, std::uint64_t v) {
    first = v;
    hi.assign(k);
  });
  ArrayHeader* a = array(first != 0 ? first : load_word(root_->tail));
  const int i = std::countr_zero(load_word(a->bitmap));
  std::uint64_t* s = &slot_words(a)[i];
  switch (what) {
    case 0: pm::publish(s, load_word(*s) ^ (std::uint64_t{1} << 50)); break;
    case 1: pm::publish(&prefix_words(a)[i], load_word(prefix_words(a)[i]) + 1); break;
    case 2: pm::publish(&a->bitmap, load_word(a->bitmap) & ~(std::uint64_t{1} << i)); break;
    case 3: {
      const std::uint64_t tail = load_word(root_->tail);
      std::uint64_t old = 0;
      (void)tree_->update(hi, tail, &old);
      pm::publish(&root_->tail, first);
      break;
    }
    default: break;
  }
}

Footprint Roart::footprint() const {
  Footprint f;
  const auto s = pool_->allocator().stats();
  f.pm_bytes = s.bytes_in_use;
  f.pm_reserved = s.bytes_reserved;
  f.dram_bytes = 0;  // everything lives in the pool; lock words and metadata in the blocks
  return f;
}

// A pool whose recovery walk found damage is left unclean: a clean close would record counts
// of the damaged tree, and the next open would then accept it as whole (issue 18).
Status Roart::close() {
  Status walk = wait_recovery_walk();
  if (!closed_) {
    tree_->epochs().drain();
    std::uint64_t records = 0, nodes = 0;
    if (!walk.ok()) {
      // unclean: the next open walks again and refuses the damage again
    } else if (count_for_close(&records, &nodes)) {
      pool_->close_clean(records, nodes);
    } else {
      pool_->close_clean();
    }
    closed_ = true;
  }
  return walk;
}

IndexRegistry::Entry Roart::registry_entry() {
  return {"roart",
          "ROART: persistent ART (shared core) over 8-64-slot leaf arrays of fingerprinted "
          "record offsets",
          &Roart::layout_for, &Roart::validate, &Roart::default_pool_size, &Roart::create,
          &Roart::recover,
          {.architecture = "radix tree (ART) over leaf arrays; PM (nodes, arrays, records)",
           .node_structure = "ART N4-N256 naming leaf arrays by their greatest key; unsorted "
                             "leaf arrays of 8/16/32/64 slots (16-bit fingerprint + record "
                             "offset) with an 8-byte key prefix per slot",
           .concurrency = "optimistic lock coupling in the trie; one run-tagged lock word per "
                          "leaf array for every writer, optimistic readers",
           .variable_keys = "inlined (records hold the key)",
           .allocator = traits::kPmindexAllocatorStartNow,
           .numa = "no",
           .recovery = "instant: array metadata rebuilt on first touch; background "
                       "reachability walk finishes interrupted splits (writers wait for it)"}};
}

}  // namespace pmindex::roart

// reflist operations and recovery. Persistence steps (R1..R9) are defined in PROTOCOL.md.
#include "index/reflist/reflist.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "index/common/close_counts.h"

namespace pmindex::reflist {

pm::Layout RefList::layout_for(const Options& options) {
  return pm::Layout{"reflist", 0, options.key_type, 0};
}

std::size_t RefList::default_pool_size(const Options& o) {
  const std::size_t per_record = 64 + o.max_key_size + o.max_value_size;
  return std::max<std::size_t>(std::size_t{1} << 20, o.expected_records * per_record * 2);
}

RefList::RefList(std::unique_ptr<pm::Pool> pool) : pool_(std::move(pool)) {
  key_mode_ = pool_->info().layout.key_mode;
}

RefList::~RefList() = default;

std::atomic<bool> RefList::ignore_link_tags_for_testing_{false};

Status RefList::validate(const Options& o) {
  if (o.max_key_size > kMaxKeySize || o.max_value_size > kMaxValueSize)
    return Status(Code::invalid_argument, "reflist keys and values are limited to 4096 B");
  if ((o.pool_size != 0 ? o.pool_size : default_pool_size(o)) > kMaxPoolBytes)
    return Status(Code::invalid_argument,
                  "reflist pools are limited to 1 TiB (links hold 40-bit offsets beside a tag)");
  return Status::Ok();
}

Result<std::unique_ptr<Index>> RefList::create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  std::unique_ptr<RefList> idx(new RefList(std::move(pool)));
  const std::uint32_t max_key = o.key_type == KeyType::bytes ? o.max_key_size : 8;
  if (Status s = idx->init_root(max_key, o.max_value_size); !s.ok()) return s;
  idx->recovery_.created = true;
  return std::unique_ptr<Index>(std::move(idx));
}

Status RefList::init_root(std::uint32_t max_key, std::uint32_t max_value) {
  Code code = Code::ok;
  const std::uint64_t off = pool_->allocator().allocate(sizeof(Root), &code);
  if (off == 0) return pool_->error(code, "no space for the index root");
  Root* r = pool_->at<Root>(off);
  Root init{};
  init.magic = kRootMagic;
  init.head = kListEnd;  // an empty list: the end mark (a head of 0 is damage, W1t)
  init.max_key_size = max_key;
  init.max_value_size = max_value;
  init.stamp = index_common::make_root_stamp(pool_->info().layout);
  pm::copy(r, &init, sizeof init);       // R1: write the root object
  pm::persist(r, sizeof init);           // R2: persist it before it becomes reachable
  pool_->set_root(off);                  // R3: publish it in the pool header (atomic, persisted)
  root_ = r;
  return Status::Ok();
}

Result<std::unique_ptr<Index>> RefList::recover(std::unique_ptr<pm::Pool> pool,
                                                 const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<RefList> idx(new RefList(std::move(pool)));
  pm::Pool& p = *idx->pool_;
  idx->recovery_.clean_shutdown = p.was_clean();
  idx->recovery_.warning = p.open_warning();
  p.allocator().begin_recovery(/*start_now=*/false);
  const std::uint64_t root_off = p.root();
  if (root_off == 0) {
    // Crash between pool creation and R3: the pool is empty. Nothing was reachable.
    if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
    p.commit_open();
    const std::uint32_t max_key = o.key_type == KeyType::bytes ? o.max_key_size : 8;
    if (Status s = idx->init_root(max_key, o.max_value_size); !s.ok()) return s;
  } else {
    Root* r = p.checked<Root>(root_off);
    if (r == nullptr || (r->magic != kRootMagic && r->magic != kRootMagicUntagged))
      return p.error(Code::corrupted, "reflist root object is missing or has a wrong magic");
    if (p.size() > kMaxPoolBytes)
      return p.error(Code::corrupted, "reflist pool is larger than 1 TiB (links hold 40 bits)");
    // A REFLIST1 pool (written before tagged links, or by an upgrade that a crash cut short):
    // its links may be untagged; the walk accepts both forms and R10, R11 finish the upgrade.
    const bool untagged_ok = r->magic == kRootMagicUntagged;
    if (Status s = index_common::check_root_stamp(r->stamp, p); !s.ok()) return s;
    // Fixed-size key modes store exactly 8-byte keys; a root claiming otherwise is corrupted
    // (found by the fuzzer: a zeroed limit let recovery succeed and the next insert break it).
    const bool fixed_keys = idx->key_mode_ != KeyType::bytes;
    if (r->max_key_size > kMaxKeySize || r->max_value_size > kMaxValueSize ||
        (fixed_keys && r->max_key_size != 8))
      return p.error(Code::corrupted, "reflist root holds impossible size limits");
    idx->root_ = r;
    if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok) {
      return p.allocator().finish_recovery();
    }
    if (Status s = idx->rebuild(untagged_ok); !s.ok()) return s;
    // Each record is its own node: a chain cut short after a clean close is refused here.
    if (Status s = index_common::check_close_counts(p, "reflist", idx->recovery_.records,
                                                    idx->recovery_.nodes);
        !s.ok()) {
      (void)p.allocator().finish_recovery();
      return s;
    }
    if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
    p.commit_open();
    if (untagged_ok) {
      if (!idx->recovery_.clean_shutdown) {
        // Nothing can tell an untagged link that damage zeroed or moved from a good one: what
        // the walk found is taken (as before tagged links) and tagged from here on.
        if (!idx->recovery_.warning.empty()) idx->recovery_.warning += "; ";
        idx->recovery_.warning +=
            "reflist pool of the untagged format (REFLIST1) after an unclean end: its untagged "
            "links could not be checked for damage (upgraded to tagged links, REFLIST2)";
      }
      idx->upgrade_links();  // after commit_open: a crash in it leaves a pool the next open
    }                        // finishes upgrading
  }
  idx->recovery_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  idx->set_recovered_records(idx->recovery_.records);  // rebuild() counted every record
  return std::unique_ptr<Index>(std::move(idx));
}

std::size_t RefList::record_size(const Record* r) const {
  return sizeof(Record) + r->key_len + r->value_len;
}

// Follows one link without trusting it: the offset is bounds- and alignment-checked, the
// record's lengths checked against the root's limits, and the link's tag against the record's
// content (W1t); a link of 0, or one naming offset 0 without the end mark, is damage.
Status RefList::follow(std::uint64_t link, std::uint64_t from, bool untagged_ok,
                       std::uint64_t* off) const {
  const pm::Pool& p = *pool_;
  const bool ignore_tags =
      pm::kTracing && ignore_link_tags_for_testing_.load(std::memory_order_relaxed);
  // Untagged (REFLIST1, not yet upgraded by R10): the word is a plain offset, 0 at the end.
  const bool untagged = ignore_tags || (untagged_ok && link_tag(link) == 0);
  *off = link_off(link);
  const auto where = [&] {
    return from == 0 ? std::string("reflist root head")
                     : "reflist record at offset " + std::to_string(from) + ": its next";
  };
  if (*off == 0) {
    if (untagged || link == kListEnd) return Status::Ok();
    return p.error(Code::corrupted, where() + " names offset 0 without the end mark (link " +
                                        std::to_string(link) + ")");
  }
  // 16 B: a record of up to 16 key+value bytes is a 32 B block, not a whole line.
  const Record* r = p.checked<Record>(*off, sizeof(Record), pm::Allocator::kMinBlock);
  if (r == nullptr) {
    return p.error(Code::corrupted, where() + " names offset " + std::to_string(*off) +
                                        ", out of bounds or misaligned");
  }
  if (r->key_len > root_->max_key_size || r->value_len > root_->max_value_size ||
      !p.in_heap(*off, record_size(r))) {
    return p.error(Code::corrupted,
                   "reflist record at offset " + std::to_string(*off) + " has bad lengths");
  }
  if (!untagged) {
    if (const std::uint64_t tag = record_tag(r); tag != link_tag(link)) {
      return p.error(Code::corrupted,
                     "reflist record at offset " + std::to_string(*off) + ": its content's tag is " +
                         std::to_string(tag) + " but the link to it (" + where() +
                         ") carries tag " + std::to_string(link_tag(link)) +
                         " (a redirected link, or the record is damaged)");
    }
  }
  return Status::Ok();
}

// W1: walks the chain without trusting it: follow() checks every link and record, and keys
// must strictly increase (which also rules out a cycle, since a cycle would revisit a smaller
// key).
Status RefList::rebuild(bool untagged_ok) {
  pm::Pool& p = *pool_;
  map_.clear();
  std::uint64_t link = root_->head;
  std::uint64_t from = 0;
  std::string prev;
  bool first = true;
  for (;;) {
    std::uint64_t off = 0;
    if (Status s = follow(link, from, untagged_ok, &off); !s.ok()) return s;
    if (off == 0) break;
    const Record* r = pool_->at<Record>(off);
    std::string key(key_of(r));
    if (!first && !(prev < key)) {
      return p.error(Code::corrupted, "reflist chain is out of order or has a cycle at offset " +
                                          std::to_string(off));
    }
    if (p.allocator().mark_reachable(off, record_size(r)) != Code::ok) {
      return p.allocator().finish_recovery();
    }
    map_.emplace_hint(map_.end(), key, off);
    ++recovery_.records;
    prev = std::move(key);
    first = false;
    from = off;
    link = r->next;
  }
  recovery_.nodes = recovery_.records;
  return Status::Ok();
}

// R10, R11 (PROTOCOL.md, "Upgrading a REFLIST1 pool"): the chain was walked and every record
// checked by rebuild(); each untagged link is rewritten in place as the same offset with its
// target's tag (one 8-byte store, flushed), then, after a fence, the magic says REFLIST2. Until
// the magic is flipped a crash leaves a REFLIST1 pool with some links tagged, which the next
// open accepts and finishes.
void RefList::upgrade_links() {
  std::uint64_t* link = &root_->head;
  for (auto it = map_.begin();; ++it) {
    const std::uint64_t want =
        it == map_.end() ? kListEnd
                         : make_link(it->second, record_tag(pool_->at<Record>(it->second)));
    if (*link != want) {
      pm::publish(link, want);         // R10: tag the link (same target)
      pm::flush(link, sizeof *link);
    }
    if (it == map_.end()) break;
    link = &pool_->at<Record>(it->second)->next;
  }
  pm::fence();                                         // every tagged link durable first
  pm::publish(&root_->magic, kRootMagic);              // R11: the pool is REFLIST2
  pm::persist(&root_->magic, sizeof root_->magic);
}

Code RefList::check_key(std::string_view key) const {
  if (key_mode_ == KeyType::bytes) {
    return key.size() > root_->max_key_size ? Code::key_too_large : Code::ok;
  }
  if (key.size() != 8) return Code::invalid_argument;
  if (key_mode_ == KeyType::f64 && std::isnan(decode_f64(key))) return Code::invalid_argument;
  return Code::ok;
}

Code RefList::check_value(std::string_view value) const {
  return value.size() > root_->max_value_size ? Code::value_too_large : Code::ok;
}

std::uint64_t RefList::write_record(std::string_view key, std::string_view value,
                                    std::uint64_t next, Code* code) {
  // `next` is a link word copied as it is (its target and tag); the result is the new record's
  // link word: its offset with record_tag() of what was written (W1t).
  const std::size_t size = sizeof(Record) + key.size() + value.size();
  const std::uint64_t off = pool_->allocator().allocate(size, code);
  if (off == 0) return 0;
  Record* r = pool_->at<Record>(off);
  const Record header{{next}, static_cast<std::uint32_t>(key.size()),
                      static_cast<std::uint32_t>(value.size())};
  pm::store(r, header);                                     // R4: header, key and value
  pm::copy(r->bytes(), key.data(), key.size());
  pm::copy(r->bytes() + key.size(), value.data(), value.size());
  pm::persist(r, size);                                     // R5: persist the record
  return make_link(off, record_tag(static_cast<std::uint32_t>(key.size()),
                                   static_cast<std::uint32_t>(value.size()), r->bytes()));
}

std::uint64_t* RefList::link_before(std::string_view key) const {
  auto it = map_.lower_bound(key);
  if (it == map_.begin()) return &root_->head;
  return &pool_->at<Record>(std::prev(it)->second)->next;
}

Code RefList::insert(std::string_view key, std::string_view value) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = check_value(value); c != Code::ok) return c;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.lower_bound(key);
  if (it != map_.end() && it->first == key) return Code::already_present;
  std::uint64_t* link = link_before(key);
  Code code = Code::ok;
  const std::uint64_t to = write_record(key, value, *link, &code);
  if (to == 0) return code;
  pm::publish(link, to);             // R6: one failure-atomic 8-byte store links the record
  pm::persist(link, sizeof *link);   // R7: the insert is durable
  map_.emplace_hint(it, std::string(key), link_off(to));
  return count_insert(Code::ok);
}

Code RefList::update(std::string_view key, std::string_view value) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = check_value(value); c != Code::ok) return c;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return Code::not_found;
  const Record* old = pool_->at<Record>(it->second);
  const std::size_t old_size = record_size(old);
  std::uint64_t* link = link_before(key);
  Code code = Code::ok;
  // Out of place: a new record with the new value replaces the old one in one 8-byte store.
  const std::uint64_t to = write_record(key, value, old->next, &code);
  if (to == 0) return code;
  pm::publish(link, to);             // R6 (update): swap the new record in
  pm::persist(link, sizeof *link);   // R7 (update)
  pool_->allocator().deallocate(it->second, old_size);  // R9: unreachable now; reuse is safe
  it->second = link_off(to);
  return Code::ok;
}

Code RefList::find(std::string_view key, std::string* value) const {
  if (Code c = check_key(key); c != Code::ok) return c;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return Code::not_found;
  const Record* r = pool_->at<Record>(it->second);
  if (value != nullptr) value->assign(r->bytes() + r->key_len, r->value_len);
  return Code::ok;
}

Code RefList::remove(std::string_view key) {
  if (Code c = check_key(key); c != Code::ok) return c;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return Code::not_found;
  const Record* r = pool_->at<Record>(it->second);
  std::uint64_t* link = link_before(key);
  pm::publish(link, r->next);               // R8: unlink with one failure-atomic 8-byte store
  pm::persist(link, sizeof *link);
  pool_->allocator().deallocate(it->second, record_size(r));  // R9
  map_.erase(it);
  return count_remove(Code::ok);
}

std::size_t RefList::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = map_.lower_bound(start); it != map_.end() && out.size() < max; ++it) {
    const Record* r = pool_->at<Record>(it->second);
    out.append(key_of(r), {r->bytes() + r->key_len, r->value_len});
  }
  return out.size();
}

Status RefList::verify() const {
  std::lock_guard<std::mutex> lock(mu_);
  const pm::Pool& p = *pool_;
  if (root_->magic != kRootMagic) return p.error(Code::corrupted, "verify: root magic changed");
  std::uint64_t link = root_->head;
  std::uint64_t from = 0;
  auto it = map_.begin();
  std::string prev;
  std::size_t count = 0;
  for (;;) {
    std::uint64_t off = 0;
    if (Status s = follow(link, from, /*untagged_ok=*/false, &off); !s.ok()) return s;
    if (off == 0) break;
    const Record* r = p.at<Record>(off);
    const std::string_view key = key_of(r);
    if (count > 0 && !(prev < key))
      return p.error(Code::corrupted, "verify: keys out of order (or a cycle) in the chain");
    if (it == map_.end() || it->first != key || it->second != off)
      return p.error(Code::corrupted, "verify: DRAM map disagrees with the chain");
    prev.assign(key);
    ++it;
    ++count;
    from = off;
    link = r->next;
    if (count > map_.size()) return p.error(Code::corrupted, "verify: chain longer than map");
  }
  if (it != map_.end()) return p.error(Code::corrupted, "verify: map has keys the chain lacks");
  return Status::Ok();
}

Footprint RefList::footprint() const {
  Footprint f;
  const auto s = pool_->allocator().stats();
  f.pm_bytes = s.bytes_in_use;
  f.pm_reserved = s.bytes_reserved;
  std::lock_guard<std::mutex> lock(mu_);
  // std::map node: three pointers, colour, key string, offset; an estimate.
  for (const auto& [k, v] : map_) f.dram_bytes += 64 + (k.size() > 15 ? k.capacity() : 0);
  return f;
}

Status RefList::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) {
    // The map mirrors the PM chain one entry per record (each its own node): its size is
    // the count the next open's walk must find (no PM read, no extra line per operation).
    pool_->close_clean(map_.size(), map_.size());
    closed_ = true;
  }
  return Status::Ok();
}

}  // namespace pmindex::reflist

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

Status RefList::validate(const Options& o) {
  if (o.max_key_size > kMaxKeySize || o.max_value_size > kMaxValueSize)
    return Status(Code::invalid_argument, "reflist keys and values are limited to 4096 B");
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
    if (r == nullptr || r->magic != kRootMagic)
      return p.error(Code::corrupted, "reflist root object is missing or has a wrong magic");
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
    if (Status s = idx->rebuild(); !s.ok()) return s;
    // Each record is its own node: a chain cut short after a clean close is refused here.
    if (Status s = index_common::check_close_counts(p, "reflist", idx->recovery_.records,
                                                    idx->recovery_.nodes);
        !s.ok()) {
      (void)p.allocator().finish_recovery();
      return s;
    }
    if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
    p.commit_open();
  }
  idx->recovery_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  idx->set_recovered_records(idx->recovery_.records);  // rebuild() counted every record
  return std::unique_ptr<Index>(std::move(idx));
}

std::size_t RefList::record_size(const Record* r) const {
  return sizeof(Record) + r->key_len + r->value_len;
}

// Walks the chain without trusting it: every offset is bounds-checked, every record's lengths
// checked against the root's limits, and keys must strictly increase (which also rules out a
// cycle, since a cycle would revisit a smaller key).
Status RefList::rebuild() {
  pm::Pool& p = *pool_;
  map_.clear();
  std::uint64_t off = root_->head.offset;
  std::string prev;
  bool first = true;
  while (off != 0) {
    // 16 B: a record of up to 16 key+value bytes is a 32 B block, not a whole line.
    const Record* r = pm::PPtr<Record>{off}.checked(p, sizeof(Record), pm::Allocator::kMinBlock);
    if (r == nullptr) {
      return p.error(Code::corrupted, "reflist record offset " + std::to_string(off) +
                                          " is out of bounds or misaligned");
    }
    if (r->key_len > root_->max_key_size || r->value_len > root_->max_value_size ||
        !p.in_heap(off, record_size(r))) {
      return p.error(Code::corrupted,
                     "reflist record at offset " + std::to_string(off) + " has bad lengths");
    }
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
    off = r->next.offset;
  }
  recovery_.nodes = recovery_.records;
  return Status::Ok();
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
  return off;
}

std::uint64_t* RefList::link_before(std::string_view key) const {
  auto it = map_.lower_bound(key);
  if (it == map_.begin()) return root_->head.raw();
  return pool_->at<Record>(std::prev(it)->second)->next.raw();
}

Code RefList::insert(std::string_view key, std::string_view value) {
  if (Code c = check_key(key); c != Code::ok) return c;
  if (Code c = check_value(value); c != Code::ok) return c;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.lower_bound(key);
  if (it != map_.end() && it->first == key) return Code::already_present;
  std::uint64_t* link = link_before(key);
  Code code = Code::ok;
  const std::uint64_t off = write_record(key, value, *link, &code);
  if (off == 0) return code;
  pm::publish(link, off);            // R6: one failure-atomic 8-byte store links the record
  pm::persist(link, sizeof *link);   // R7: the insert is durable
  map_.emplace_hint(it, std::string(key), off);
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
  const std::uint64_t off = write_record(key, value, old->next.offset, &code);
  if (off == 0) return code;
  pm::publish(link, off);            // R6 (update): swap the new record in
  pm::persist(link, sizeof *link);   // R7 (update)
  pool_->allocator().deallocate(it->second, old_size);  // R9: unreachable now; reuse is safe
  it->second = off;
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
  pm::publish(link, r->next.offset);        // R8: unlink with one failure-atomic 8-byte store
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
  std::uint64_t off = root_->head.offset;
  auto it = map_.begin();
  std::string prev;
  std::size_t count = 0;
  while (off != 0) {
    const Record* r = p.checked<Record>(off, sizeof(Record), pm::Allocator::kMinBlock);
    if (r == nullptr || !p.in_heap(off, record_size(r)))
      return p.error(Code::corrupted, "verify: record offset out of bounds");
    if (r->key_len > root_->max_key_size || r->value_len > root_->max_value_size)
      return p.error(Code::corrupted, "verify: record lengths exceed the root's limits");
    const std::string_view key = key_of(r);
    if (count > 0 && !(prev < key))
      return p.error(Code::corrupted, "verify: keys out of order (or a cycle) in the chain");
    if (it == map_.end() || it->first != key || it->second != off)
      return p.error(Code::corrupted, "verify: DRAM map disagrees with the chain");
    prev.assign(key);
    ++it;
    ++count;
    off = r->next.offset;
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

// The parts of the native API every index shares: key encodings, ScanBuffer, Index::open.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "pmindex/index.h"

namespace pmindex {

std::string encode_u64(std::uint64_t v) {
  const std::uint64_t be = __builtin_bswap64(v);
  return std::string(reinterpret_cast<const char*>(&be), sizeof be);
}

std::uint64_t decode_u64(std::string_view bytes) {
  std::uint64_t be = 0;
  std::memcpy(&be, bytes.data(), std::min(bytes.size(), sizeof be));
  return __builtin_bswap64(be);
}

// Order-preserving: flip the sign bit of non-negative values and all bits of negative ones,
// so the unsigned order of the result is the numeric order of the doubles.
std::uint64_t f64_to_ordered(double v) {
  const auto bits = std::bit_cast<std::uint64_t>(v);
  return (bits >> 63) != 0 ? ~bits : bits | (std::uint64_t{1} << 63);
}

double ordered_to_f64(std::uint64_t v) {
  const std::uint64_t bits = (v >> 63) != 0 ? v & ~(std::uint64_t{1} << 63) : ~v;
  return std::bit_cast<double>(bits);
}

std::string encode_f64(double v) { return encode_u64(f64_to_ordered(v)); }
double decode_f64(std::string_view bytes) { return ordered_to_f64(decode_u64(bytes)); }

void ScanBuffer::append(std::string_view key, std::string_view value) {
  Entry e;
  e.key_off = static_cast<std::uint32_t>(bytes_.size());
  e.key_len = static_cast<std::uint32_t>(key.size());
  bytes_.insert(bytes_.end(), key.begin(), key.end());
  e.value_off = static_cast<std::uint32_t>(bytes_.size());
  e.value_len = static_cast<std::uint32_t>(value.size());
  bytes_.insert(bytes_.end(), value.begin(), value.end());
  entries_.push_back(e);
}

std::string_view ScanBuffer::key(std::size_t i) const {
  const Entry& e = entries_[i];
  return {bytes_.data() + e.key_off, e.key_len};
}

std::string_view ScanBuffer::value(std::size_t i) const {
  const Entry& e = entries_[i];
  return {bytes_.data() + e.value_off, e.value_len};
}

// Insert, or update what is there. A concurrent remove can land between the two steps (update
// then answers not_found) and a concurrent insert between an update's miss and the retried
// insert (already_present again), so loop until one step answers definitively. Each retry means
// another thread's operation completed, so the loop makes progress system-wide.
Code Index::upsert(std::string_view key, std::string_view value) {
  for (;;) {
    const Code c = insert(key, value);
    if (c != Code::already_present) return c;
    const Code u = update(key, value);
    if (u != Code::not_found) return u;
  }
}

Code Index::find_many(std::span<const std::string_view> keys, std::span<std::string> values,
                      std::span<Code> codes) const {
  if (codes.size() != keys.size() || (!values.empty() && values.size() != keys.size()))
    return Code::invalid_argument;
  for (std::size_t i = 0; i < keys.size(); i += kFindBatch) {
    const std::size_t n = std::min(kFindBatch, keys.size() - i);
    find_batch(keys.data() + i, values.empty() ? nullptr : values.data() + i, codes.data() + i,
               n);
  }
  return Code::ok;
}

void Index::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                       std::size_t n) const {
  for (std::size_t i = 0; i < n; ++i)
    codes[i] = find(keys[i], values != nullptr ? values + i : nullptr);
}

Status Index::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "fill factor must be in (0, 1]");
  for (const KeyValue& kv : sorted) {
    const Code c = insert(kv.key, kv.value);
    if (c != Code::ok) return Status(c, "bulk load stopped at a record");
  }
  return Status::Ok();
}

namespace {

// Far more than any pool can hold (2^40 records at 8 B each is 8 TiB); the limit keeps every
// default_pool_size product (at most ~2^18 bytes per record) inside 64 bits.
constexpr std::size_t kMaxExpectedRecords = std::size_t{1} << 40;

// The options every kind shares, then the kind's own. Runs before any file is touched, so a
// refused call leaves no file and an existing pool (overwrite) as it was.
Status validate(const IndexRegistry::Entry& e, const Options& o) {
  if (o.expected_records > kMaxExpectedRecords)
    return Status(Code::invalid_argument,
                  "expected_records " + std::to_string(o.expected_records) +
                      " is above the limit of 2^40; pass pool_size instead");
  return e.validate(o);
}

// The common part of opening: create-or-open decision, pool creation or header checks, then
// the index's own create or recover. open_or_create goes through Pool::create with
// open_existing, which opens the file when one is there or appears while creating (another
// process won the race), so the caller never sees "file exists".
Result<std::unique_ptr<Index>> open_with(const IndexRegistry::Entry& e, const Options& o) {
  pm::PoolOptions po;
  po.path = o.path;
  po.private_mapping = o.private_mapping;
  po.prefault = o.prefault;
  po.size = o.pool_size != 0 ? o.pool_size : e.default_pool_size(o);
  po.initial_size = o.initial_pool_size;
  po.mode = o.persistence;
  po.layout = e.layout(o);
  po.overwrite = o.overwrite && o.open_mode == OpenMode::create;
  po.open_existing = o.open_mode == OpenMode::open_or_create && !o.path.empty();
  // A created pool gets its name only once the index has published its root (format v2: a
  // finished pool whose root is 0 is corrupted), so no crash leaves a rootless pool at a path.
  po.defer_publish = true;
  auto pool = o.open_mode == OpenMode::open ? pm::Pool::open(po) : pm::Pool::create(po);
  if (!pool.ok()) return pool.status();
  if (!(*pool)->created()) return e.recover(std::move(pool).value(), o);
  auto idx = e.create(std::move(pool).value(), o);
  if (!idx.ok()) return idx.status();
  Status published = (*idx)->pool().publish();
  if (published.ok()) return idx;
  if (published.code() != Code::already_present || !po.open_existing) {
    return published.code() == Code::already_present
               ? Status(Code::invalid_argument,
                        o.path + ": file exists; refusing to overwrite it (pass overwrite to "
                                 "replace it)")
               : published;
  }
  { auto ours = std::move(idx).value(); }  // another creator won: drop ours (and its file)
  Options again = o;
  again.open_mode = OpenMode::open;
  return open_with(e, again);
}

}  // namespace

Result<std::unique_ptr<Index>> Index::open(const Options& o) {
  const IndexRegistry::Entry* e = IndexRegistry::find(o.kind);
  if (e == nullptr) {
    std::string names;
    for (const auto& n : IndexRegistry::names()) names += (names.empty() ? "" : ", ") + n;
    return Status(Code::invalid_argument,
                  "unknown index kind '" + o.kind + "' (known: " + names + ")");
  }
  Options opts = o;
  if (o.layout_from_pool && !o.path.empty()) {
    auto info = pm::Pool::inspect(o.path);
    if (!info.ok()) return info.status();
    opts.node_size = info->layout.node_size;
    opts.key_type = info->layout.key_mode;
  }
  if (o.open_mode != OpenMode::open) {
    if (Status s = validate(*e, opts); !s.ok()) return s;
  }
  return open_with(*e, opts);
}

}  // namespace pmindex

// Seeded workload and oracle checks (crash/workload.h).
#include "crash/workload.h"

#include <cinttypes>
#include <cstdio>
#include <random>

namespace pmindex::crash {

namespace {

std::string value_text(const std::string* v) {
  if (v == nullptr) return "absent";
  if (v->size() != 8) return "<" + std::to_string(v->size()) + " bytes>";
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, decode_u64(*v));
  return buf;
}

const std::string* lookup(const Oracle& o, const std::string& k) {
  auto it = o.find(k);
  return it == o.end() ? nullptr : &it->second;
}

// The first key where two states differ, described.
std::string first_difference(const Oracle& got, const Oracle& want, const char* name) {
  auto gi = got.begin();
  auto wi = want.begin();
  while (gi != got.end() || wi != want.end()) {
    std::string key;
    if (wi == want.end() || (gi != got.end() && gi->first < wi->first)) key = gi->first;
    else key = wi->first;
    const std::string* g = lookup(got, key);
    const std::string* w = lookup(want, key);
    if ((g == nullptr) != (w == nullptr) || (g != nullptr && *g != *w)) {
      return "key " + std::to_string(decode_u64(key)) + ": recovered " + value_text(g) + ", " +
             name + " " + value_text(w);
    }
    if (gi != got.end() && gi->first == key) ++gi;
    if (wi != want.end() && wi->first == key) ++wi;
  }
  return "no difference";
}

}  // namespace

std::vector<WorkOp> make_workload(std::uint64_t seed, std::size_t n, std::uint64_t key_space) {
  std::mt19937_64 rng(seed);
  std::vector<WorkOp> ops(n);
  for (WorkOp& op : ops) {
    const std::uint64_t r = rng() % 100;
    op.kind = r < 30 ? OpKind::insert : r < 50 ? OpKind::update : r < 60 ? OpKind::upsert
            : r < 80 ? OpKind::remove : r < 90 ? OpKind::find : OpKind::scan;
    op.key = 1 + rng() % key_space;
    op.value = rng();
  }
  return ops;
}

std::string describe(const WorkOp& op) {
  static const char* const kNames[] = {"insert", "update", "upsert", "remove", "find", "scan"};
  return std::string(kNames[static_cast<int>(op.kind)]) + "(" + std::to_string(op.key) + ")";
}

void apply_to_oracle(const WorkOp& op, Oracle& oracle) {
  const std::string k = encode_u64(op.key);
  const std::string v = encode_u64(op.value);
  switch (op.kind) {
    case OpKind::insert: oracle.emplace(k, v); break;
    case OpKind::update: if (auto it = oracle.find(k); it != oracle.end()) it->second = v; break;
    case OpKind::upsert: oracle[k] = v; break;
    case OpKind::remove: oracle.erase(k); break;
    case OpKind::find:
    case OpKind::scan: break;
  }
}

Status apply_checked(Index& index, const WorkOp& op, Oracle& oracle, std::size_t scan_length,
                     const std::function<bool(std::uint64_t key)>& owns) {
  const std::string k = encode_u64(op.key);
  const std::string v = encode_u64(op.value);
  const bool present = oracle.count(k) != 0;
  Code want = Code::ok;
  Code got = Code::ok;
  switch (op.kind) {
    case OpKind::insert:
      got = index.insert(k, v);
      want = present ? Code::already_present : Code::ok;
      break;
    case OpKind::update:
      got = index.update(k, v);
      want = present ? Code::ok : Code::not_found;
      break;
    case OpKind::upsert:
      got = index.upsert(k, v);
      break;
    case OpKind::remove:
      got = index.remove(k);
      want = present ? Code::ok : Code::not_found;
      break;
    case OpKind::find: {
      std::string value;
      got = index.find(k, &value);
      want = present ? Code::ok : Code::not_found;
      if (got == Code::ok && present && value != oracle.at(k)) {
        return Status(Code::corrupted, describe(op) + " returned " + value_text(&value) +
                                           ", oracle has " + value_text(&oracle.at(k)));
      }
      break;
    }
    case OpKind::scan: {
      ScanBuffer buf;
      const std::size_t n = index.scan(k, scan_length, buf);
      auto it = oracle.lower_bound(k);
      for (std::size_t i = 0; i < n; ++i) {
        if (owns && !owns(decode_u64(buf.key(i)))) continue;  // another writer's key
        if (it == oracle.end() || buf.key(i) != it->first || buf.value(i) != it->second)
          return Status(Code::corrupted, describe(op) + " disagrees with the oracle at record " +
                                             std::to_string(i));
        ++it;
      }
      // Every oracle key up to the last record returned was returned; a short scan reached
      // the end of the index.
      const bool missed = it != oracle.end() && (n < scan_length || (n > 0 && it->first <= buf.key(n - 1)));
      if (missed)
        return Status(Code::corrupted, describe(op) + " skipped key " +
                                           std::to_string(decode_u64(it->first)));
      break;
    }
  }
  if (got != want) {
    // An index that answers corrupted has recorded why; verify() reports it (the run has
    // failed already, so a verify beside another writer costs nothing that matters).
    const std::string why =
        got == Code::corrupted ? " (verify: " + index.verify().to_string() + ")" : "";
    return Status(Code::corrupted, describe(op) + " returned " + std::string(to_string(got)) +
                                       ", the oracle expects " + std::string(to_string(want)) +
                                       why);
  }
  apply_to_oracle(op, oracle);
  return Status::Ok();
}

Status match_contents(const Index& index, std::uint64_t key_space, const Oracle& a,
                      const Oracle* b, Oracle* matched) {
  Oracle got;
  ScanBuffer buf;
  const std::size_t max = static_cast<std::size_t>(key_space) + 16;
  index.scan(encode_u64(0), max, buf);
  for (std::size_t i = 0; i < buf.size(); ++i) {
    if (!got.emplace(std::string(buf.key(i)), std::string(buf.value(i))).second)
      return Status(Code::corrupted, "scan returned key " +
                                         std::to_string(decode_u64(buf.key(i))) + " twice");
  }
  const Oracle* which = nullptr;
  if (got == a) which = &a;
  else if (b != nullptr && got == *b) which = b;
  if (which == nullptr) {
    std::string msg = "recovered contents match no acceptable state (" +
                      first_difference(got, a, b ? "without the op in flight" : "oracle");
    if (b != nullptr) msg += "; " + first_difference(got, *b, "with the op in flight");
    return Status(Code::corrupted, msg + ")");
  }
  // Point lookups take other paths than scans in most indexes: check every key.
  std::string value;
  for (std::uint64_t key = 0; key <= key_space + 1; ++key) {
    const std::string k = encode_u64(key);
    const std::string* want = lookup(*which, k);
    const Code c = index.find(k, &value);
    if ((c == Code::ok) != (want != nullptr) || (want != nullptr && value != *want)) {
      return Status(Code::corrupted, "find(" + std::to_string(key) + ") returned " +
                                         (c == Code::ok ? value_text(&value) : "not found") +
                                         " but the scan-matched state has " + value_text(want));
    }
  }
  if (matched != nullptr) *matched = *which;
  return Status::Ok();
}

Result<std::unique_ptr<pm::Pool>> create_run_pool(const IndexRegistry::Entry& entry,
                                                  const Options& options, std::size_t size,
                                                  pm::Mode mode) {
  // The drivers call entry.create directly, which (like Index::open) expects checked options.
  if (Status s = entry.validate(options); !s.ok()) return s;
  pm::PoolOptions po;
  po.size = size;
  po.mode = mode;
  po.layout = entry.layout(options);
  return pm::Pool::create(po);
}

}  // namespace pmindex::crash

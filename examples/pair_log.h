// An index defined outside the library: the smallest crash-consistent index one can build on
// pmindex's public API (pool, allocator, persistence API), registered at run time so that
// Index::open, the crash driver and pmbench (`--plugin`) treat it like a built-in kind.
//
// "pair_log" keeps 8-byte keys and 8-byte values in 32-byte PM nodes chained from the root
// object (newest first); a DRAM std::map from key to node answers finds and scans. It is a
// teaching example, not a fast index: one reader-writer lock, O(log n) DRAM lookups.
//
// Persistence steps (what a crash at any instant leaves; compare a built-in index's PROTOCOL.md):
//   L1 insert into a new node: write next = head, key, value, state = live; persist the node;
//      then publish head = node (one failure-atomic 8-byte store, persisted). Before the
//      publish a crash forgets the node (the allocator reclaims it: nothing reaches it).
//   L2 insert into a reused free node (state = free, still chained): write key and value,
//      persist; then store state = live, persist. A crash before the state store leaves it free.
//   L3 update: store the value word (failure-atomic), persist.
//   L4 remove: store state = free, persist; the node stays chained for reuse by L2.
//   Recovery trusts nothing: every node offset is bounds- and alignment-checked, the walk is
//   bounded by the heap's capacity in nodes (a cycle is corruption), a state word other than
//   free/live or a key live twice is corruption; reachable blocks are declared to the allocator,
//   which frees everything else.
//
// kPersistBeforePublish = false is a deliberately broken variant (L1 publishes before the node
// is persisted) that exists only so a test can show the crash driver catching it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "pmindex/index.h"

namespace pair_log {

inline constexpr std::uint64_t kRootMagic = 0x474f4c52494150ull;  // "PAIRLOG"
inline constexpr std::uint64_t kFree = 0;
inline constexpr std::uint64_t kLive = 1;

// The pool accepts only a 64 B-aligned root offset: a root object of 64 B or more is.
struct Root {
  std::uint64_t magic;
  std::uint64_t head;  // offset of the newest node, 0 = none
  std::uint64_t reserved[6];
};
static_assert(sizeof(Root) == 64);

struct Node {  // one 32 B allocator block, never across a cache line
  std::uint64_t next;
  std::uint64_t key;    // the key as an integer (decode_u64): integer order = memcmp order
  std::uint64_t value;  // the value's 8 bytes
  std::uint64_t state;  // kFree or kLive
};
static_assert(sizeof(Node) == 32);

template <bool kPersistBeforePublish = true>
class PairLog final : public pmindex::Index {
 public:
  using Code = pmindex::Code;
  using Status = pmindex::Status;
  using PoolPtr = std::unique_ptr<pmindex::pm::Pool>;

  // The registry entry: call pmindex::IndexRegistry::add(PairLog<>::entry("pair_log")) once.
  static pmindex::IndexRegistry::Entry entry(std::string name) {
    pmindex::IndexRegistry::Entry e;
    e.name = std::move(name);
    e.description = "example external index: a PM node log with a DRAM map (examples/pair_log.h)";
    e.layout = &layout_for;
    e.validate = &validate;
    e.default_pool_size = &default_pool_size;
    e.create = &create;
    e.recover = &recover;
    e.traits = {.architecture = "node log; PM (nodes) + DRAM (std::map)",
                .node_structure = "one 32 B node per key, key and value inline",
                .concurrency = "one reader-writer lock",
                .variable_keys = "no: 8-byte keys",
                .allocator = "pmindex allocator (reachability at recovery)",
                .numa = "no",
                .recovery = "walk of the node chain; DRAM map rebuilt"};
    return e;
  }

  static pmindex::pm::Layout layout_for(const pmindex::Options& o) {
    return pmindex::pm::Layout{o.kind, 0, o.key_type, 1};
  }
  static Status validate(const pmindex::Options& o) {
    if (o.key_type == pmindex::KeyType::bytes)
      return Status(Code::invalid_argument, "pair_log takes 8-byte keys (u64 or f64) only");
    if (o.node_size != 0 || o.max_value_size != 8)
      return Status(Code::invalid_argument, "pair_log has no node size and 8-byte values only");
    return Status::Ok();
  }
  static std::size_t default_pool_size(const pmindex::Options& o) {
    return std::max<std::size_t>(std::size_t{1} << 20, o.expected_records * sizeof(Node) * 2);
  }

  static pmindex::Result<std::unique_ptr<pmindex::Index>> create(PoolPtr pool,
                                                                 const pmindex::Options&) {
    std::unique_ptr<PairLog> idx(new PairLog(std::move(pool)));
    if (Status s = idx->init_root(); !s.ok()) return s;
    idx->stats_.created = true;
    return std::unique_ptr<pmindex::Index>(std::move(idx));
  }

  static pmindex::Result<std::unique_ptr<pmindex::Index>> recover(PoolPtr pool,
                                                                  const pmindex::Options&) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_ptr<PairLog> idx(new PairLog(std::move(pool)));
    pmindex::pm::Pool& p = *idx->pool_;
    idx->stats_.clean_shutdown = p.was_clean();
    p.allocator().begin_recovery(/*start_now=*/false);
    if (p.root() == 0) {  // a crash before the root was published: nothing is reachable
      if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
      p.commit_open();
      if (Status s = idx->init_root(); !s.ok()) return s;
    } else {
      if (Status s = idx->rebuild(p.root()); !s.ok()) return s;
      if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
      p.commit_open();
    }
    idx->stats_.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::unique_ptr<pmindex::Index>(std::move(idx));
  }

  std::string_view kind() const override { return pool_->info().layout.kind; }

  Code insert(std::string_view key, std::string_view value) override {
    if (Code c = check(key, value); c != Code::ok) return c;
    std::unique_lock lock(mu_);
    const std::uint64_t k = pmindex::decode_u64(key);
    if (map_.contains(k)) return Code::already_present;
    std::uint64_t off = 0;
    if (!free_.empty()) {  // L2
      off = free_.back();
      Node* n = pool_->at<Node>(off);
      pmindex::pm::store(&n->key, k);
      pmindex::pm::store(&n->value, word(value));
      pmindex::pm::persist(n, sizeof(Node));
      pmindex::pm::store(&n->state, kLive);
      pmindex::pm::persist(&n->state, sizeof(n->state));
      free_.pop_back();
    } else {  // L1
      Code code = Code::ok;
      off = pool_->allocator().allocate(sizeof(Node), &code);
      if (off == 0) return code;
      Node* n = pool_->at<Node>(off);
      const Node init{root_->head, k, word(value), kLive};
      if (kPersistBeforePublish) {
        pmindex::pm::copy(n, &init, sizeof init);
        pmindex::pm::persist(n, sizeof init);
        pmindex::pm::publish(&root_->head, off);
        pmindex::pm::persist(&root_->head, sizeof(root_->head));
      } else {  // the broken variant: the node may reach PM after the pointer to it
        pmindex::pm::publish(&root_->head, off);
        pmindex::pm::persist(&root_->head, sizeof(root_->head));
        pmindex::pm::copy(n, &init, sizeof init);
        pmindex::pm::persist(n, sizeof init);
      }
    }
    map_.emplace(k, off);
    return count_insert(Code::ok);  // Index::size() counts what each kind reports
  }

  Code update(std::string_view key, std::string_view value) override {  // L3
    if (Code c = check(key, value); c != Code::ok) return c;
    std::unique_lock lock(mu_);
    auto it = map_.find(pmindex::decode_u64(key));
    if (it == map_.end()) return Code::not_found;
    Node* n = pool_->at<Node>(it->second);
    pmindex::pm::store(&n->value, word(value));
    pmindex::pm::persist(&n->value, sizeof(n->value));
    return Code::ok;
  }

  Code find(std::string_view key, std::string* value) const override {
    if (Code c = check(key, std::string_view("01234567", 8)); c != Code::ok) return c;
    std::shared_lock lock(mu_);
    auto it = map_.find(pmindex::decode_u64(key));
    if (it == map_.end()) return Code::not_found;
    if (value != nullptr) value->assign(bytes(pool_->at<Node>(it->second)->value));
    return Code::ok;
  }

  Code remove(std::string_view key) override {  // L4
    if (Code c = check(key, std::string_view("01234567", 8)); c != Code::ok) return c;
    std::unique_lock lock(mu_);
    auto it = map_.find(pmindex::decode_u64(key));
    if (it == map_.end()) return Code::not_found;
    Node* n = pool_->at<Node>(it->second);
    pmindex::pm::store(&n->state, kFree);
    pmindex::pm::persist(&n->state, sizeof(n->state));
    free_.push_back(it->second);
    map_.erase(it);
    return count_remove(Code::ok);
  }

  std::size_t scan(std::string_view start, std::size_t max,
                   pmindex::ScanBuffer& out) const override {
    out.clear();
    std::shared_lock lock(mu_);
    // A start key shorter than 8 bytes sorts before every key it prefixes (pad with zeros); a
    // longer one sorts after the key made of its first 8 bytes.
    std::string head(start.substr(0, 8));
    head.resize(8, '\0');
    const std::uint64_t from = pmindex::decode_u64(head);
    auto it = start.size() > 8 ? map_.upper_bound(from) : map_.lower_bound(from);
    for (; it != map_.end() && out.size() < max; ++it)
      out.append(pmindex::encode_u64(it->first), bytes(pool_->at<Node>(it->second)->value));
    return out.size();
  }

  // Every chained node is free or live, every live node is in the map at its offset, and the
  // map holds nothing else.
  Status verify() const override {
    std::shared_lock lock(mu_);
    std::size_t live = 0;
    std::uint64_t steps = 0;
    for (std::uint64_t off = root_->head; off != 0; off = pool_->at<Node>(off)->next) {
      const Node* n = pool_->checked<Node>(off, sizeof(Node), sizeof(Node));
      if (n == nullptr || ++steps > max_nodes())
        return pool_->error(Code::corrupted, "pair_log chain leaves the heap or has a cycle");
      if (n->state == kLive) {
        auto it = map_.find(n->key);
        if (it == map_.end() || it->second != off)
          return pool_->error(Code::corrupted, "pair_log live node missing from the DRAM map");
        ++live;
      } else if (n->state != kFree) {
        return pool_->error(Code::corrupted, "pair_log node with an impossible state word");
      }
    }
    if (live != map_.size())
      return pool_->error(Code::corrupted, "pair_log DRAM map holds keys no node has");
    return Status::Ok();
  }

  pmindex::RecoveryStats recovery_stats() const override { return stats_; }
  pmindex::Footprint footprint() const override {
    const pmindex::pm::AllocatorStats a = pool_->allocator().stats();
    std::shared_lock lock(mu_);
    // std::map node: three pointers, a colour word and the pair.
    return {a.bytes_in_use, a.bytes_reserved, map_.size() * (32 + 16) + free_.capacity() * 8};
  }
  Status close() override {
    std::unique_lock lock(mu_);
    if (!closed_) pool_->close_clean();
    closed_ = true;
    return Status::Ok();
  }
  const pmindex::pm::Pool& pool() const override { return *pool_; }

 private:
  explicit PairLog(PoolPtr pool) : pool_(std::move(pool)) {}

  static std::uint64_t word(std::string_view eight) {
    std::uint64_t w = 0;
    std::memcpy(&w, eight.data(), 8);
    return w;
  }
  static std::string bytes(std::uint64_t w) { return std::string(reinterpret_cast<char*>(&w), 8); }
  static Code check(std::string_view key, std::string_view value) {
    if (key.size() != 8 || value.size() != 8) return Code::invalid_argument;
    return Code::ok;
  }
  std::uint64_t max_nodes() const { return pool_->size() / sizeof(Node); }

  Status init_root() {
    Code code = Code::ok;
    const std::uint64_t off = pool_->allocator().allocate(sizeof(Root), &code);
    if (off == 0) return pool_->error(code, "no space for the pair_log root");
    root_ = pool_->at<Root>(off);
    const Root init{kRootMagic, 0, {}};
    pmindex::pm::copy(root_, &init, sizeof init);
    pmindex::pm::persist(root_, sizeof init);
    pool_->set_root(off);  // failure-atomic and persisted by the pool
    return Status::Ok();
  }

  Status rebuild(std::uint64_t root_off) {
    pmindex::pm::Allocator& alloc = pool_->allocator();
    root_ = pool_->checked<Root>(root_off);
    if (root_ == nullptr || root_->magic != kRootMagic)
      return pool_->error(Code::corrupted, "pair_log root is missing or has a wrong magic");
    if (alloc.mark_reachable(root_off, sizeof(Root)) != Code::ok) return alloc.finish_recovery();
    std::uint64_t steps = 0;
    for (std::uint64_t off = root_->head; off != 0;) {
      const Node* n = pool_->checked<Node>(off, sizeof(Node), sizeof(Node));
      if (n == nullptr || ++steps > max_nodes())
        return pool_->error(Code::corrupted, "pair_log chain leaves the heap or has a cycle");
      if (n->state == kLive) {
        if (!map_.emplace(n->key, off).second)
          return pool_->error(Code::corrupted, "pair_log key live in two nodes");
      } else if (n->state == kFree) {
        free_.push_back(off);
      } else {
        return pool_->error(Code::corrupted, "pair_log node with an impossible state word");
      }
      if (alloc.mark_reachable(off, sizeof(Node)) != Code::ok) return alloc.finish_recovery();
      off = n->next;
    }
    stats_.records = map_.size();
    set_recovered_records(map_.size());
    stats_.nodes = steps;
    return Status::Ok();
  }

  PoolPtr pool_;
  Root* root_ = nullptr;
  mutable std::shared_mutex mu_;
  std::map<std::uint64_t, std::uint64_t> map_;  // key word -> node offset
  std::vector<std::uint64_t> free_;             // chained nodes in state kFree
  pmindex::RecoveryStats stats_;
  bool closed_ = false;
};

}  // namespace pair_log

// NativeTarget: a built-in pmindex index through the native API.
#include <limits>
#include <string>
#include <vector>

#include "config.h"
#include "target.h"

namespace pmbench {
namespace {

class NativeSession final : public Session {
 public:
  explicit NativeSession(pmindex::Index& index) : index_(index), scope_(index.attach_thread()) {}
  bool find(std::string_view key, std::string_view* value) override {
    last_ = index_.find(key, &value_);
    if (value != nullptr) *value = value_;
    return last_ == pmindex::Code::ok;
  }
  void find_many(std::span<const std::string_view> keys, std::span<std::string_view> values,
                 bool* found) override {
    if (values_.size() < keys.size()) values_.resize(keys.size());
    if (codes_.size() < keys.size()) codes_.resize(keys.size());
    const std::span<pmindex::Code> codes(codes_.data(), keys.size());
    last_ = index_.find_many(keys, {values_.data(), keys.size()}, codes);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      found[i] = last_ == pmindex::Code::ok && codes[i] == pmindex::Code::ok;
      values[i] = values_[i];
      if (!found[i] && last_ == pmindex::Code::ok) last_ = codes[i];
    }
  }
  bool insert(std::string_view key, std::string_view value) override {
    return (last_ = index_.insert(key, value)) == pmindex::Code::ok;
  }
  bool update(std::string_view key, std::string_view value) override {
    return (last_ = index_.update(key, value)) == pmindex::Code::ok;
  }
  bool remove(std::string_view key) override {
    return (last_ = index_.remove(key)) == pmindex::Code::ok;
  }
  std::size_t scan(std::string_view start, int count, ScanResult* out) override {
    const std::size_t n = index_.scan(start, static_cast<std::size_t>(count), buffer_);
    if (out != nullptr) {
      out->records.clear();
      for (std::size_t i = 0; i < buffer_.size(); ++i)
        out->records.emplace_back(buffer_.key(i), buffer_.value(i));
    }
    return n;
  }
  pmindex::Code last_code() const override { return last_; }
  pmindex::Index* native_index() override { return &index_; }

 private:
  pmindex::Index& index_;
  pmindex::Index::ThreadScope scope_;
  pmindex::ScanBuffer buffer_;
  std::string value_;
  std::vector<std::string> values_;  // find_many's, reused (no allocation once sized)
  std::vector<pmindex::Code> codes_;
  pmindex::Code last_ = pmindex::Code::ok;
};

class NativeTarget final : public Target {
 public:
  NativeTarget(std::unique_ptr<pmindex::Index> index, TargetInfo info)
      : index_(std::move(index)), info_(std::move(info)) {}
  std::unique_ptr<Session> session() override { return std::make_unique<NativeSession>(*index_); }
  const TargetInfo& info() const override { return info_; }
  bool can_bulk_load() const override { return true; }
  bool bulk_load(std::span<const pmindex::KeyValue> sorted, double fill,
                 std::string* error) override {
    const pmindex::Status s = index_->bulk_load(sorted, fill);
    if (!s.ok()) *error = s.to_string();
    return s.ok();
  }
  std::pair<std::int64_t, std::int64_t> footprint() const override {
    const pmindex::Footprint f = index_->footprint();
    return {static_cast<std::int64_t>(f.dram_bytes), static_cast<std::int64_t>(f.pm_bytes)};
  }
  std::int64_t pm_requested_bytes() const override {
    return static_cast<std::int64_t>(index_->pool().allocator().stats().bytes_requested);
  }
  std::string verify() const override {
    const pmindex::Status s = index_->verify();
    return s.ok() ? "" : s.to_string();
  }
  std::string close() override {
    const pmindex::Status s = index_->close();
    return s.ok() ? "" : s.to_string();
  }
  pmindex::Index* native() override { return index_.get(); }

 private:
  std::unique_ptr<pmindex::Index> index_;
  TargetInfo info_;
};

}  // namespace

std::unique_ptr<Target> make_native_target(const Config& c, const std::string& pool_path,
                                           bool fresh, std::string* error, bool* usage_error) {
  pmindex::Options o;
  o.kind = c.target;
  o.path = pool_path;
  o.pool_size = c.pool_size;
  o.expected_records = c.expected_records();
  if (!pmindex::pm::parse_mode(c.persistence, &o.persistence)) {
    *error = "bad persistence mode";
    return nullptr;
  }
  o.node_size = c.node_size;
  o.pactree.updater = c.pactree_updater == "sync"         ? pmindex::PacTreeOptions::Updater::synchronous
                      : c.pactree_updater == "background" ? pmindex::PacTreeOptions::Updater::background
                                                          : pmindex::PacTreeOptions::Updater::automatic;
  o.pactree.stats = c.pactree_stats;
  o.dptree.stats = c.dptree_stats;  // printed by the index at close
  o.pactree.search_layer = c.pactree_search == "pm"     ? pmindex::PacTreeOptions::SearchLayer::pm
                           : c.pactree_search == "dram" ? pmindex::PacTreeOptions::SearchLayer::dram
                                                        : pmindex::PacTreeOptions::SearchLayer::automatic;
  o.key_type = c.key_kind() == KeyKind::f64   ? pmindex::KeyType::f64
               : c.key_kind() == KeyKind::bytes ? pmindex::KeyType::bytes
                                                : pmindex::KeyType::u64;
  o.max_key_size = static_cast<std::uint32_t>(c.key_size);
  o.max_value_size = static_cast<std::uint32_t>(c.value_size);
  o.open_mode = fresh ? pmindex::OpenMode::create : pmindex::OpenMode::open;
  o.overwrite = fresh;
  // As the originals' drivers, which map and touch their whole pools before a run: the file
  // starts at its full size (an initial size above pool_size is the pool size), every page
  // mapped, so the run grows nothing.
  o.prefault = c.prefault;
  if (c.prefault) o.initial_pool_size = std::numeric_limits<std::size_t>::max();
  auto index = pmindex::Index::open(o);
  if (!index.ok()) {
    *error = index.status().to_string();
    const pmindex::Code code = index.status().code();
    if (usage_error != nullptr &&
        (code == pmindex::Code::unsupported || code == pmindex::Code::invalid_argument ||
         code == pmindex::Code::key_too_large || code == pmindex::Code::value_too_large)) {
      *usage_error = true;
      *error = c.target + " refuses these options (--key_type " + c.key_type +
               (c.variable_keys ? ", variable-length keys up to " + std::to_string(c.key_size) + " B" : "") +
               "): " + *error;
    }
    return nullptr;
  }
  TargetInfo info;
  info.name = c.target;
  info.kind = "builtin";
  info.load_method = c.bulk_load ? "bulk_load" : "insert";
  const auto backing = (*index)->pool().backing();
  info.backing = std::string(pmindex::pm::to_string(backing));
  info.durability = std::string(pmindex::pm::durability_note(backing));
  info.emulated_pm = backing != pmindex::pm::Backing::dax;
  if (c.prefault) info.prefault = (*index)->pool().prefaulted() ? "on" : "refused by the kernel";
  info.pool_path = pool_path;
  return std::make_unique<NativeTarget>(std::move(index).value(), std::move(info));
}

}  // namespace pmbench

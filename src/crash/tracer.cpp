// The tracer's model of persistent memory (semantics in include/pmindex/crash/tracer.h and
// docs/crash-simulator.md).
#include "pmindex/crash/tracer.h"

#include "pmindex/crash/scheduler.h"

#include <algorithm>
#include <cstring>

namespace pmindex::crash {

namespace {

// splitmix64 finaliser: a cheap, well-mixed combiner for dedup keys.
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h + 0x9e3779b97f4a7c15ull + v;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

Tracer::Tracer(pm::Mode mode) : mode_(mode) {}

Tracer::~Tracer() { stop(); }

void Tracer::start() {
  thread_ = std::this_thread::get_id();
  started_ = true;
  // A tracer already installed (an outer exploration whose image check is running on this
  // thread) keeps the process sink and forwards the events of other threads to us.
  auto* outer = dynamic_cast<Tracer*>(pm::Runtime::trace_sink());
  if (outer != nullptr && outer != this) {
    outer_ = outer;
    outer->inner_ = this;
  } else {
    pm::Runtime::set_trace_sink(this);
  }
}

void Tracer::stop() {
  if (outer_ != nullptr) {
    if (outer_->inner_ == this) outer_->inner_ = nullptr;
    outer_ = nullptr;
  } else if (pm::Runtime::trace_sink() == this) {
    pm::Runtime::set_trace_sink(nullptr);
  }
  started_ = false;
}

void Tracer::bind(const char* base, std::size_t size, bool preloaded) {
  base_ = base;
  size_ = size;
  if (preloaded) {
    persisted_.assign(base, base + size);
    volatile_.assign(base, base + size);
  } else {
    persisted_.assign(size, 0);
    volatile_.assign(size, 0);
  }
  bound_ = true;
  std::vector<LoggedEvent> log;
  log.swap(log_);
  for (const LoggedEvent& e : log) {
    switch (e.kind) {
      case LoggedEvent::store:
        if (in_region(e.addr, e.n)) {
          record_store(e.addr - reinterpret_cast<std::uintptr_t>(base_), e.bytes.data(), e.n,
                       /*crash_points=*/false);
        }
        break;
      case LoggedEvent::flush:
        if (in_region(e.addr, e.n))
          record_flush(e.addr - reinterpret_cast<std::uintptr_t>(base_), e.n, 0);
        break;
      case LoggedEvent::fence:
        record_fence(/*crash_points=*/false, 0);
        break;
    }
  }
  if (mode_ == pm::Mode::eadr) commit_eadr_lane();
}

bool Tracer::mine() const {
  return std::this_thread::get_id() == thread_ ||
         (scheduler_ != nullptr && scheduler_->sim_index() >= 0);
}

std::size_t Tracer::thread_slot() const {
  const int sim = scheduler_ != nullptr ? scheduler_->sim_index() : -1;
  return sim < 0 ? 0 : static_cast<std::size_t>(sim) + 1;
}

// After an event of a simulated thread: a scheduling point.
void Tracer::maybe_yield() {
  if (scheduler_ != nullptr) scheduler_->yield();
}

bool Tracer::in_region(std::uintptr_t a, std::size_t n) const {
  const auto b = reinterpret_cast<std::uintptr_t>(base_);
  return a >= b && a - b <= size_ && n <= size_ - (a - b);
}

void Tracer::begin_op(std::size_t op) {
  op_ = op;
  op_points_ = 0;
}

void Tracer::end_op() {
  if (mode_ == pm::Mode::eadr) commit_eadr_lane();
  crash_point(/*completed=*/true);
}

// --- events -----------------------------------------------------------------------------------

void Tracer::on_store(const void* dst, std::size_t n) {
  if (!started_ || !mine()) {
    if (inner_ != nullptr) inner_->on_store(dst, n);
    return;
  }
  if (n == 0) return;
  const auto a = reinterpret_cast<std::uintptr_t>(dst);
  if (!bound_) {
    const char* p = static_cast<const char*>(dst);
    log_.push_back({LoggedEvent::store, a, n, std::vector<char>(p, p + n)});
    return;
  }
  if (in_region(a, n)) {
    record_store(a - reinterpret_cast<std::uintptr_t>(base_), static_cast<const char*>(dst), n,
                 /*crash_points=*/true);
  }
  maybe_yield();
}

void Tracer::on_flush(const void* p, std::size_t n) {
  if (!started_ || !mine()) {
    if (inner_ != nullptr) inner_->on_flush(p, n);
    return;
  }
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (!bound_) {
    log_.push_back({LoggedEvent::flush, a, n, {}});
    return;
  }
  if (in_region(a, n)) record_flush(a - reinterpret_cast<std::uintptr_t>(base_), n, thread_slot());
  maybe_yield();
}

void Tracer::on_fence() {
  if (!started_ || !mine()) {
    if (inner_ != nullptr) inner_->on_fence();
    return;
  }
  if (!bound_) {
    log_.push_back({LoggedEvent::fence, 0, 0, {}});
    return;
  }
  record_fence(/*crash_points=*/true, thread_slot());
  maybe_yield();
}

void Tracer::on_yield_point(std::string_view tag) {
  if (started_ && bound_ && mine()) maybe_yield();
  else if (inner_ != nullptr) inner_->on_yield_point(tag);
}

// --- the model --------------------------------------------------------------------------------

void Tracer::record_store(std::uint64_t off, const char* src, std::size_t n, bool crash_points) {
  std::memcpy(volatile_.data() + off, src, n);
  if (mode_ == pm::Mode::eadr) commit_eadr_lane();
  const std::uint64_t end = off + n;
  for (std::uint64_t pos = off; pos < end;) {
    const std::uint64_t stop = std::min<std::uint64_t>(end, (pos / 8 + 1) * 8);
    Unit u;
    u.seq = next_seq_++;
    u.offset = pos;
    u.len = static_cast<std::uint8_t>(stop - pos);
    std::memcpy(u.bytes, src + (pos - off), u.len);
    if (mode_ == pm::Mode::adr) {
      const std::uint64_t line = pos & ~std::uint64_t{pm::kCacheLine - 1};
      Lane& lane = adr_lanes_[line];
      lane.line = line;
      lane.units.push_back(u);
    } else {
      if (eadr_lane_.units.empty()) eadr_lane_.line = pos;
      eadr_lane_.units.push_back(u);
    }
    pos = stop;
  }
  // eadr: the store is performed, so a power failure now keeps it (or, for a multi-unit call,
  // a program-order prefix of it).
  if (mode_ == pm::Mode::eadr && crash_points) crash_point(/*completed=*/false);
}

void Tracer::record_flush(std::uint64_t off, std::size_t n, std::size_t slot) {
  if (mode_ != pm::Mode::adr) return;
  if (flush_marks_.size() <= slot) flush_marks_.resize(slot + 1);
  const std::uint64_t end = off + n;
  for (std::uint64_t line = off & ~std::uint64_t{pm::kCacheLine - 1}; line < end;
       line += pm::kCacheLine) {
    auto it = adr_lanes_.find(line);
    // clwb captures the line as it is now: those units become durable at the next fence.
    if (it != adr_lanes_.end()) flush_marks_[slot][line] = it->second.units.back().seq;
  }
}

void Tracer::record_fence(bool crash_points, std::size_t slot) {
  if (mode_ != pm::Mode::adr) return;
  // Just before the fence, the flushes issued since the last one are not yet guaranteed.
  if (crash_points) crash_point(/*completed=*/false);
  if (flush_marks_.size() <= slot) return;
  bool changed = false;
  for (const auto& [line, last] : flush_marks_[slot]) {
    auto it = adr_lanes_.find(line);
    if (it == adr_lanes_.end()) continue;  // another thread's fence already made it durable
    std::vector<Unit>& units = it->second.units;
    std::size_t k = 0;
    while (k < units.size() && units[k].seq <= last) apply(units[k++]);
    if (k > 0) {
      units.erase(units.begin(), units.begin() + static_cast<std::ptrdiff_t>(k));
      changed = true;
    }
    if (units.empty()) adr_lanes_.erase(it);
  }
  flush_marks_[slot].clear();
  if (changed) ++persisted_version_;
}

void Tracer::commit_eadr_lane() {
  if (eadr_lane_.units.empty()) return;
  for (const Unit& u : eadr_lane_.units) apply(u);
  persisted_last_seq_ = eadr_lane_.units.back().seq;
  eadr_lane_.units.clear();
  ++persisted_version_;
}

void Tracer::apply(const Unit& u) { std::memcpy(persisted_.data() + u.offset, u.bytes, u.len); }

void Tracer::rebuild_view() {
  lanes_view_.clear();
  if (mode_ == pm::Mode::adr) {
    for (const auto& [line, lane] : adr_lanes_) lanes_view_.push_back(&lane);
  } else if (!eadr_lane_.units.empty()) {
    lanes_view_.push_back(&eadr_lane_);
  }
}

void Tracer::crash_point(bool completed) {
  if (in_hook_) return;
  rebuild_view();
  const CrashPoint at{op_, op_points_++, global_points_++, completed};
  if (hook_) {
    in_hook_ = true;
    hook_(at);
    in_hook_ = false;
  }
}

// --- images -----------------------------------------------------------------------------------

std::vector<std::uint32_t> Tracer::lane_lengths() const {
  std::vector<std::uint32_t> out;
  out.reserve(lanes_view_.size());
  for (const Lane* l : lanes_view_) out.push_back(static_cast<std::uint32_t>(l->units.size()));
  return out;
}

bool Tracer::materialize(std::span<const std::uint32_t> choice, char* out) const {
  if (choice.size() != lanes_view_.size()) return false;
  for (std::size_t i = 0; i < choice.size(); ++i)
    if (choice[i] > lanes_view_[i]->units.size()) return false;
  std::memcpy(out, persisted_.data(), size_);
  for (std::size_t i = 0; i < choice.size(); ++i) {
    const Lane& lane = *lanes_view_[i];
    for (std::uint32_t k = 0; k < choice[i]; ++k) {
      const Unit& u = lane.units[k];
      std::memcpy(out + u.offset, u.bytes, u.len);
    }
  }
  return true;
}

std::uint64_t Tracer::image_key(std::span<const std::uint32_t> choice,
                                const CrashPoint& at) const {
  std::uint64_t h = mix(mix(0, at.op), at.completed ? 1 : 2);
  if (mode_ == pm::Mode::eadr) {
    // eadr images are prefixes of the unit trace: the last unit included names the image.
    std::uint64_t last = persisted_last_seq_;
    if (!choice.empty() && choice[0] > 0 && !lanes_view_.empty())
      last = lanes_view_[0]->units[choice[0] - 1].seq;
    return mix(h, last);
  }
  h = mix(h, persisted_version_);
  for (std::size_t i = 0; i < choice.size() && i < lanes_view_.size(); ++i)
    if (choice[i] > 0) h = mix(h, lanes_view_[i]->units[choice[i] - 1].seq);
  return h;
}

std::string Tracer::check_bypass() const {
  if (!bound_) return "";
  if (std::memcmp(base_, volatile_.data(), size_) == 0) return "";
  std::size_t first = size_, last = 0, count = 0;
  for (std::size_t i = 0; i < size_; ++i) {
    if (base_[i] != volatile_[i]) {
      first = std::min(first, i);
      last = i;
      ++count;
    }
  }
  return "pool offset " + std::to_string(first) + ": live memory differs from what was stored " +
         "through pm:: (" + std::to_string(count) + " byte(s) differ in [" +
         std::to_string(first) + ", " + std::to_string(last) +
         "]); a store bypassed the persistence API";
}

}  // namespace pmindex::crash

#include "workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

namespace pmbench {

std::atomic<int> TimedSection::active{0};
std::atomic<std::uint64_t> TimedSection::violations{0};

WorkloadSpec WorkloadSpec::from(const Config& c, std::uint64_t operations,
                                std::shared_ptr<const Dataset> dataset) {
  WorkloadSpec s;
  s.records = c.records;
  s.threads = c.threads;
  s.operations = operations;
  std::copy(c.ratio, c.ratio + kOpTypes, s.ratio.begin());
  s.distribution = c.distribution;
  s.skew = c.skew;
  s.seed = c.seed;
  s.keys = KeyFormat(c.key_size, c.key_prefix, c.key_kind(), std::move(dataset),
                     c.key_order == "pibench");
  s.values = ValueFormat(c.value_size, c.value_bits);
  s.latency_sampling = c.latency_sampling;
  s.owned = c.owned_ids();
  s.scan_size = c.scan_size;
  return s;
}

std::array<std::uint64_t, kOpTypes> exact_counts(std::uint64_t operations,
                                                 const std::array<double, kOpTypes>& ratio) {
  std::array<std::uint64_t, kOpTypes> counts{};
  std::array<double, kOpTypes> rest{};
  std::uint64_t assigned = 0;
  for (int k = 0; k < kOpTypes; ++k) {
    const long double exact = static_cast<long double>(ratio[k]) * operations;
    counts[k] = static_cast<std::uint64_t>(std::floor(exact));
    rest[k] = static_cast<double>(exact - counts[k]);
    assigned += counts[k];
  }
  // Hand the remaining operations to the largest remainders (ties: lower type first).
  while (assigned < operations) {
    int best = 0;
    for (int k = 1; k < kOpTypes; ++k)
      if (rest[k] > rest[best]) best = k;
    ++counts[best];
    rest[best] = -1;
    ++assigned;
  }
  return counts;
}

std::vector<std::array<std::uint64_t, kOpTypes>> deal_counts(
    const std::array<std::uint64_t, kOpTypes>& counts, unsigned threads) {
  std::vector<std::array<std::uint64_t, kOpTypes>> per(threads, std::array<std::uint64_t, kOpTypes>{});
  std::uint64_t cursor = 0;
  for (int k = 0; k < kOpTypes; ++k) {
    // counts[k] cards dealt starting at `cursor`: every thread gets floor(c/T), and the next
    // c mod T threads from the cursor one more.
    const std::uint64_t c = counts[k];
    for (unsigned t = 0; t < threads; ++t) per[t][k] = c / threads;
    for (std::uint64_t i = 0; i < c % threads; ++i) ++per[(cursor + i) % threads][k];
    cursor = (cursor + c) % threads;
  }
  return per;
}

std::vector<std::uint64_t> load_ids(std::uint64_t records, unsigned threads, unsigned t) {
  TimedSection::note_generation();
  std::vector<std::uint64_t> ids;
  ids.reserve(records / threads + 1);
  for (std::uint64_t id = t; id < records; id += threads) ids.push_back(id);
  return ids;
}

namespace {

Schedule build_one(const WorkloadSpec& s, unsigned t, const std::array<std::uint64_t, kOpTypes>& mine,
                   double base_zeta, std::uint64_t base_n) {
  TimedSection::note_generation();
  Schedule out;
  out.value_size = s.values.value_size();
  out.counts = mine;
  const std::uint64_t n = std::accumulate(mine.begin(), mine.end(), std::uint64_t{0});

  // The exact multiset, shuffled with this thread's stream.
  Xoshiro256ss rng(s.seed, t);
  out.types.reserve(n);
  for (int k = 0; k < kOpTypes; ++k) out.types.insert(out.types.end(), mine[k], static_cast<OpType>(k));
  for (std::uint64_t i = n; i > 1; --i) std::swap(out.types[i - 1], out.types[rng.below(i)]);

  // Ids: track the population this thread may touch.
  std::vector<std::uint64_t> owned;
  std::uint64_t inserted = 0, shared_n = s.records;
  if (s.owned) owned = load_ids(s.records, s.threads, t);
  const std::uint64_t start_n = s.owned ? owned.size() : shared_n;
  Distribution dist(s.distribution, s.skew, start_n,
                    (zipf_like(s.distribution) && start_n >= base_n)
                        ? zeta_extend(base_zeta, base_n, start_n, s.skew) : -1);
  out.ids.resize(n);
  const bool writes_values = mine[static_cast<int>(OpType::update)] + mine[static_cast<int>(OpType::rmw)] > 0;
  if (writes_values) out.versions.assign(n, 0);
  std::uint32_t next_version = 1;
  const bool latest = s.distribution == DistKind::latest;
  for (std::uint64_t i = 0; i < n; ++i) {
    const OpType type = out.types[i];
    std::uint64_t id;
    if (type == OpType::insert) {
      id = insert_id(s.records, s.threads, t, inserted++);
      if (s.owned) owned.push_back(id);
      dist.grow(s.owned ? owned.size() : shared_n + inserted);
    } else if (s.owned) {
      if (owned.empty()) {
        id = absent_id(t);
        ++out.expected_misses;
      } else {
        // latest: rank 0 is the newest owned id (owned ids are kept in load-then-insert
        // order; a remove moves the last one into the hole, which perturbs recency slightly).
        const std::uint64_t rank = dist.next(rng);
        const std::uint64_t pos = latest ? owned.size() - 1 - rank : rank;
        id = owned[pos];
        if (type == OpType::remove) {
          owned[pos] = owned.back();
          owned.pop_back();
          // The population shrank: a fresh distribution over the smaller set (uniform and
          // selfsimilar are stateless; zipfian's zeta is shrunk by subtracting the last term).
          dist = Distribution(s.distribution, s.skew, owned.size(),
                              zipf_like(s.distribution)
                                  ? dist.zeta() - std::pow(static_cast<double>(owned.size() + 1), -s.skew)
                                  : -1);
        }
      }
    } else if (shared_n + inserted == 0) {
      id = absent_id(t);  // nothing exists yet (no records loaded, no insert so far)
      ++out.expected_misses;
    } else {
      const std::uint64_t r = dist.next(rng);
      if (!latest) {
        id = r < shared_n ? r : insert_id(s.records, s.threads, t, r - shared_n);
      } else {
        // Newest first: this thread's inserts (latest first), then the loaded ids from the
        // highest down (YCSB loads ids in increasing order, so the last loaded is the newest).
        id = r < inserted ? insert_id(s.records, s.threads, t, inserted - 1 - r)
                          : shared_n - 1 - (r - inserted);
      }
    }
    out.ids[i] = id;
    if (type == OpType::update || type == OpType::rmw) out.versions[i] = next_version++;
  }

  // Keys: stored only for datasets (see Schedule); values are always computed.
  out.key_format = &s.keys;
  out.value_format = &s.values;
  if (s.keys.dataset() != nullptr) {
    out.key_offsets.resize(n + 1);
    out.key_offsets[0] = 0;
    for (std::uint64_t i = 0; i < n; ++i) out.key_offsets[i + 1] = out.key_offsets[i] + s.keys.length(out.ids[i]);
    out.keys.resize(out.key_offsets[n]);
    for (std::uint64_t i = 0; i < n; ++i) s.keys.write(out.ids[i], out.keys.data() + out.key_offsets[i]);
  }
  // Latency sampling from a separate stream, so the operations do not depend on the rate.
  Xoshiro256ss sampler(s.seed, 0x100000000ull + t);
  out.timed.resize(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    out.timed[i] = s.latency_sampling > 0 && sampler.uniform01() < s.latency_sampling;
    out.timed_count += out.timed[i];
  }
  return out;
}

}  // namespace

std::vector<Schedule> build_schedules(const WorkloadSpec& s) {
  TimedSection::note_generation();
  const auto per = deal_counts(exact_counts(s.operations, s.ratio), s.threads);
  // zipfian: the O(n) start of zeta once, shared by every thread (each extends it).
  const std::uint64_t base_n = s.owned ? s.records / s.threads : s.records;
  const double base_zeta =
      zipf_like(s.distribution) ? zeta_extend(0, 0, base_n, s.skew) : 0;
  std::vector<Schedule> out(s.threads);
  std::vector<std::thread> builders;
  for (unsigned t = 0; t < s.threads; ++t)
    builders.emplace_back([&, t] { out[t] = build_one(s, t, per[t], base_zeta, base_n); });
  for (auto& b : builders) b.join();
  return out;
}

}  // namespace pmbench

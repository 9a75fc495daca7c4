// pmbench's generators: key/value encodings, distributions, and one test per PiBench bug
// (issue 4) that fails on PiBench's behaviour.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_set>

#include "distribution.h"
#include "keys.h"
#include "workload.h"

namespace pmbench {
namespace {

WorkloadSpec spec_for(std::uint64_t records, std::uint64_t ops, unsigned threads,
                      std::array<double, kOpTypes> ratio) {
  WorkloadSpec s;
  s.records = records;
  s.operations = ops;
  s.threads = threads;
  s.ratio = ratio;
  s.keys = KeyFormat(8, "", KeyKind::u64);
  s.values = ValueFormat(8, 48);
  s.owned = ratio[3] > 0;
  return s;
}

TEST(Keys, IdZeroIsKeyZeroAndBigEndianOrderIsNumericOrder) {
  KeyFormat f(8, "", KeyKind::u64);
  EXPECT_EQ(f.make(0), std::string(8, '\0'));
  for (std::uint64_t a = 1; a < 2000; ++a) {
    const std::uint64_t b = a * 7919 + 13;
    const bool numeric = key_hash(a) < key_hash(b);
    const bool bytes = f.make(a) < f.make(b);  // memcmp order
    ASSERT_EQ(numeric, bytes) << a << " " << b;
  }
  // The multiplicative hash of PiBench.
  EXPECT_EQ(key_hash(1), 11400714819323198393ull);
  EXPECT_EQ(load_be64(f.make(1).data()), 11400714819323198393ull);
}

TEST(Keys, LongKeysArePrefixPaddingHashAndInvertible) {
  KeyFormat f(16, "ab", KeyKind::bytes);
  const std::string k = f.make(5);
  ASSERT_EQ(k.size(), 16u);
  EXPECT_EQ(k.substr(0, 2), "ab");
  EXPECT_EQ(k.substr(2, 6), std::string(6, '\0'));
  EXPECT_EQ(load_be64(k.data() + 8), key_hash(5));
  std::uint64_t id = 0;
  ASSERT_TRUE(f.id_of(k, &id));
  EXPECT_EQ(id, 5u);
  EXPECT_FALSE(f.id_of("xx" + k.substr(2), &id));  // wrong prefix: not one of ours
  KeyFormat d(8, "", KeyKind::f64);
  for (std::uint64_t i : {0ull, 1ull, 77ull, 123456789ull}) {
    ASSERT_TRUE(d.id_of(d.make(i), &id));
    EXPECT_EQ(id, i);
  }
}

TEST(Values, DefaultBelow2To48AndValueBits64UsesAllBits) {
  ValueFormat v48(8, 48), v64(8, 64);
  bool high = false;
  for (std::uint64_t id = 0; id < 1000; ++id) {
    EXPECT_LT(v48.word(id, 0), std::uint64_t{1} << 48);
    high = high || v64.word(id, 0) >= (std::uint64_t{1} << 48);
    EXPECT_NE(v64.word(id, 0), v64.word(id, 1));  // an update writes a different value
  }
  EXPECT_TRUE(high);
}

TEST(Distribution, ZetaExtendedIncrementallyEqualsDirect) {
  const double direct = zeta_extend(0, 0, 5000, 0.99);
  const double inc = zeta_extend(zeta_extend(0, 0, 1234, 0.99), 1234, 5000, 0.99);
  EXPECT_NEAR(direct, inc, 1e-9);
  Distribution d(DistKind::zipfian, 0.99, 1234);
  d.grow(5000);
  EXPECT_NEAR(d.zeta(), direct, 1e-9);
}

TEST(Distribution, CaseInsensitiveNames) {
  DistKind k;
  EXPECT_TRUE(parse_distribution("selfSimilar", &k));
  EXPECT_EQ(k, DistKind::selfsimilar);
  EXPECT_FALSE(parse_distribution("normal", &k));
}

// Bug 1: with parallel load and run-phase inserts, threads insert disjoint, never-loaded ids.
TEST(PiBenchBug1, InsertIdsDisjointAcrossThreadsAndNeverLoaded) {
  const auto s = spec_for(1000, 40000, 4, {0, 1, 0, 0, 0});
  const auto sch = build_schedules(s);
  std::unordered_set<std::uint64_t> seen;
  for (const auto& sc : sch)
    for (std::size_t i = 0; i < sc.size(); ++i) {
      ASSERT_EQ(sc.types[i], OpType::insert);
      ASSERT_GE(sc.ids[i], s.records) << "insert of a loaded id";
      ASSERT_TRUE(seen.insert(sc.ids[i]).second) << "two inserts of id " << sc.ids[i];
    }
  EXPECT_EQ(seen.size(), 40000u);
}

// Bug 2: the operation mix is exact (PiBench: 1% removes gave 0 removes, 5% updates 3.9%).
TEST(PiBenchBug2, ExactOperationMix) {
  const auto s = spec_for(100000, 100000, 3, {0.94, 0, 0.05, 0.01, 0});
  const auto sch = build_schedules(s);
  std::array<std::uint64_t, kOpTypes> total{};
  for (const auto& sc : sch) {
    std::array<std::uint64_t, kOpTypes> mine{};
    for (OpType t : sc.types) ++mine[static_cast<int>(t)];
    EXPECT_EQ(mine, sc.counts);
    for (int k = 0; k < kOpTypes; ++k) total[k] += mine[k];
  }
  EXPECT_EQ(total[0], 94000u);
  EXPECT_EQ(total[2], 5000u);
  EXPECT_EQ(total[3], 1000u);
  // Tiny counts still come out exact, and per-thread shares differ by at most one.
  const auto c = exact_counts(7, {0.5, 0.25, 0.25, 0, 0});
  EXPECT_EQ(c[0] + c[1] + c[2], 7u);
  const auto per = deal_counts({10, 1, 0, 0, 0}, 4);
  std::uint64_t ones = 0;
  for (const auto& p : per) {
    EXPECT_GE(p[0], 2u);
    EXPECT_LE(p[0], 3u);
    ones += p[1];
  }
  EXPECT_EQ(ones, 1u);
}

// Bug 3: reads, updates and removes target ids that exist at that moment.
TEST(PiBenchBug3, OperationsTargetExistingIds) {
  {  // shared mode, 50/50 read/insert on one thread (PiBench: 92% read hits)
    const auto s = spec_for(1000, 20000, 1, {0.5, 0.5, 0, 0, 0});
    const auto sc = build_schedules(s)[0];
    std::set<std::uint64_t> live;
    for (std::uint64_t i = 0; i < s.records; ++i) live.insert(i);
    for (std::size_t i = 0; i < sc.size(); ++i) {
      if (sc.types[i] == OpType::insert) live.insert(sc.ids[i]);
      else ASSERT_TRUE(live.count(sc.ids[i])) << "op " << i << " reads a not-yet-inserted id";
    }
  }
  {  // owned mode with removes, several threads: each thread only touches its own live ids
    const auto s = spec_for(999, 30000, 3, {0.4, 0.2, 0.2, 0.2, 0});
    const auto sch = build_schedules(s);
    for (unsigned t = 0; t < 3; ++t) {
      std::set<std::uint64_t> live;
      for (std::uint64_t id : load_ids(s.records, 3, t)) live.insert(id);
      const auto& sc = sch[t];
      for (std::size_t i = 0; i < sc.size(); ++i) {
        const std::uint64_t id = sc.ids[i];
        if (sc.types[i] == OpType::insert) ASSERT_TRUE(live.insert(id).second);
        else if (sc.types[i] == OpType::remove) ASSERT_EQ(live.erase(id), 1u);
        else ASSERT_TRUE(live.count(id)) << "thread " << t << " op " << i;
      }
    }
  }
}

// Bug 4: time mode keeps the distributions intact. pmbench's time mode pre-generates a long
// buffer with the same generator (no modulo wrap of ids): self-similar 0.2 keeps 80% of the
// accesses on 20% of the ids, and zipfian's hottest id gets 1/zeta(N) of them.
TEST(PiBenchBug4, TimeModeBufferKeepsSkew) {
  auto s = spec_for(10000, 400000, 2, {1, 0, 0, 0, 0});
  s.distribution = DistKind::selfsimilar;
  s.skew = 0.2;
  std::uint64_t hot = 0, all = 0;
  for (const auto& sc : build_schedules(s))
    for (std::uint64_t id : sc.ids) {
      hot += id < s.records / 5;
      ++all;
    }
  EXPECT_NEAR(static_cast<double>(hot) / all, 0.8, 0.01);

  s.distribution = DistKind::zipfian;
  s.skew = 0.99;
  std::uint64_t zero = 0;
  all = 0;
  for (const auto& sc : build_schedules(s))
    for (std::uint64_t id : sc.ids) {
      zero += id == 0;
      ++all;
    }
  const double expect = 1.0 / zeta_extend(0, 0, s.records, 0.99);
  EXPECT_NEAR(static_cast<double>(zero) / all, expect, 0.01);
}

// Bug 5: generation runs outside the timed section; the check itself must be able to fail.
TEST(PiBenchBug5, GenerationInsideTimedSectionIsCaught) {
  const auto before = TimedSection::violations.load();
  TimedSection::enter();
  (void)build_schedules(spec_for(10, 10, 1, {1, 0, 0, 0, 0}));
  TimedSection::leave();
  EXPECT_GT(TimedSection::violations.load(), before);
}

// Bug 6: each thread its own sequence; seeded, reproducible values and latency sampling.
TEST(PiBenchBug6, PerThreadSequencesSeededAndReproducible) {
  auto s = spec_for(10000, 20000, 2, {0.5, 0.25, 0.25, 0, 0});
  s.latency_sampling = 0.1;
  const auto a = build_schedules(s), b = build_schedules(s);
  EXPECT_NE(a[0].ids, a[1].ids);
  EXPECT_NE(a[0].types, a[1].types);
  EXPECT_NE(a[0].timed, a[1].timed);
  EXPECT_EQ(a[0].ids, b[0].ids);
  EXPECT_EQ(a[1].versions, b[1].versions);
  // Hash keys are computed from ids, never stored (issue 26: harness memory at 100M records).
  EXPECT_TRUE(a[1].keys.empty());
  std::string buf = a[1].key_buffer(), vbuf;
  for (std::size_t i = 0; i < a[1].size(); ++i) {
    ASSERT_EQ(a[1].key(i, buf), s.keys.make(a[1].ids[i]));
    ASSERT_EQ(a[1].value(i, vbuf), s.values.make(a[1].ids[i], a[1].version(i)));
  }
  EXPECT_EQ(a[0].timed, b[0].timed);
  const double rate = std::count(a[0].timed.begin(), a[0].timed.end(), 1) / double(a[0].size());
  EXPECT_NEAR(rate, 0.1, 0.02);
  s.seed = 42;
  EXPECT_NE(build_schedules(s)[0].ids, a[0].ids);
}

}  // namespace
}  // namespace pmbench

// --- datasets ---------------------------------------------------------------------------------
#include <unistd.h>

#include <fstream>

#include "dataset.h"
#include "synthetic.h"
#include <bit>

namespace pmbench {
namespace {

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = "/tmp/pmbench-test-" + std::to_string(::getpid()) + "-" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string sosd(const std::vector<std::uint64_t>& keys, std::uint64_t count) {
  std::string b(reinterpret_cast<const char*>(&count), 8);
  b.append(reinterpret_cast<const char*>(keys.data()), keys.size() * 8);
  return b;
}

TEST(Dataset, SosdLoadsDistinctShuffledKeysAndMapsBack) {
  const std::string p = write_file("ok.sosd", sosd({5, 1, 9, 9, 3}, 5));
  std::string err;
  auto d = load_sosd(p, 1729, &err);
  ASSERT_TRUE(d) << err;
  EXPECT_EQ(d->raw_count, 5u);
  auto sorted = d->keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<std::uint64_t>{1, 3, 5, 9}));
  KeyFormat f(8, "", KeyKind::u64, d);
  for (std::uint64_t id = 0; id < 4; ++id) {
    EXPECT_EQ(load_be64(f.make(id).data()), d->keys[id]);
    std::uint64_t back = 99;
    ASSERT_TRUE(f.id_of(f.make(id), &back));
    EXPECT_EQ(back, id);
  }
  ::unlink(p.c_str());
}

TEST(Dataset, SosdRefusesBadHeaderOrTruncation) {
  std::string err;
  const std::string a = write_file("short.sosd", sosd({1, 2}, 3));
  EXPECT_FALSE(load_sosd(a, 1, &err));
  EXPECT_NE(err.find("header says 3"), std::string::npos) << err;
  const std::string b = write_file("tiny.sosd", "abc");
  EXPECT_FALSE(load_sosd(b, 1, &err));
  EXPECT_FALSE(load_sosd("/nonexistent/x.sosd", 1, &err));
  ::unlink(a.c_str());
  ::unlink(b.c_str());
}

TEST(Dataset, TextKeysOnePerLineAnyBytes) {
  const std::string p = write_file("keys.txt", std::string("alice\nb\0b\n\nlast", 15));
  std::vector<std::string> keys;
  std::string err;
  ASSERT_TRUE(load_text_keys(p, &keys, &err)) << err;
  ASSERT_EQ(keys.size(), 4u);
  EXPECT_EQ(keys[1], std::string("b\0b", 3));
  EXPECT_EQ(keys[2], "");
  EXPECT_EQ(keys[3], "last");
  ::unlink(p.c_str());
}

TEST(Dataset, TextDatasetVariableLengthKeysMapBack) {
  // Keys of different lengths, a shared prefix, a NUL and a 0xff byte, a duplicate and an
  // empty line (skipped).
  const std::string p = write_file("var.txt", std::string("ab\na\nabc\nb\0z\n\xff\nab\n\nzzzzzzzzzzzz\n", 31));
  std::string err;
  auto d = load_text(p, 1729, &err);
  ASSERT_TRUE(d) << err;
  EXPECT_TRUE(d->variable_length());
  EXPECT_EQ(d->raw_count, 8u);
  ASSERT_EQ(d->size(), 6u);
  EXPECT_EQ(d->max_length, 12u);
  KeyFormat f(8, "", KeyKind::bytes, d);
  EXPECT_TRUE(f.variable());
  std::set<std::string> seen;
  for (std::uint64_t id = 0; id < d->size(); ++id) {
    const std::string k = f.make(id);
    EXPECT_EQ(k.size(), f.length(id));
    seen.insert(k);
    std::uint64_t back = 99;
    ASSERT_TRUE(f.id_of(k, &back)) << k;
    EXPECT_EQ(back, id);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"a", "ab", "abc", std::string("b\0z", 3), "\xff", "zzzzzzzzzzzz"}));
  std::uint64_t id = 0;
  EXPECT_FALSE(f.id_of("abcd", &id));
  // Ids beyond the dataset (absent_id) are keys no text line can be.
  const std::string absent = f.make(absent_id(0));
  EXPECT_EQ(absent[0], '\n');
  EXPECT_FALSE(f.id_of(absent, &id));
  ::unlink(p.c_str());
}

TEST(Dataset, FormatResolvesByName) {
  DatasetFormat f{};
  ASSERT_TRUE(resolve_dataset_format("auto", "x/names.txt", &f));
  EXPECT_EQ(f, DatasetFormat::text);
  ASSERT_TRUE(resolve_dataset_format("auto", "gen:lognormal", &f));
  EXPECT_EQ(f, DatasetFormat::generated);
  ASSERT_TRUE(resolve_dataset_format("auto", "books_200M_uint64", &f));
  EXPECT_EQ(f, DatasetFormat::sosd);
  ASSERT_TRUE(resolve_dataset_format("text", "a.bin", &f));
  EXPECT_EQ(f, DatasetFormat::text);
  EXPECT_FALSE(resolve_dataset_format("csv", "a.bin", &f));
}

// Variable-length keys reach the schedule with their own lengths.
TEST(Dataset, ScheduleKeepsVariableLengthKeys) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += std::string(1 + i % 37, static_cast<char>('a' + i % 26)) + std::to_string(i) + "\n";
  const std::string p = write_file("sched.txt", text);
  std::string err;
  auto d = load_text(p, 7, &err);
  ASSERT_TRUE(d) << err;
  WorkloadSpec s = spec_for(200, 2000, 2, {0.3, 0.1, 0.2, 0.1, 0.2, 0.1});
  s.keys = KeyFormat(8, "", KeyKind::bytes, d);
  s.owned = true;
  const auto scheds = build_schedules(s);
  std::set<std::size_t> lengths;
  std::string buf;
  for (const auto& sc : scheds)
    for (std::size_t i = 0; i < sc.size(); ++i) {
      ASSERT_EQ(sc.key(i, buf), s.keys.make(sc.ids[i]));
      lengths.insert(sc.key(i, buf).size());
    }
  EXPECT_GT(lengths.size(), 10u);
  ::unlink(p.c_str());
}

// --- synthetic generators (ALEX/APEX) ----------------------------------------------------------

TEST(Synthetic, LognormalIsDistinctSortedAndScaledLikeAlex) {
  const auto k = lognormal_keys(20000, 1729);
  ASSERT_EQ(k.size(), 20000u);
  EXPECT_TRUE(std::is_sorted(k.begin(), k.end()));
  EXPECT_EQ(std::adjacent_find(k.begin(), k.end()), k.end());
  // lognormal(0, 2) * 1e9: the median is e^0 * 1e9; 84% lie below e^2 * 1e9.
  EXPECT_NEAR(static_cast<double>(k[k.size() / 2]), 1e9, 0.1e9);
  const auto below = std::lower_bound(k.begin(), k.end(), static_cast<std::uint64_t>(std::exp(2.0) * 1e9)) - k.begin();
  EXPECT_NEAR(static_cast<double>(below) / k.size(), 0.8413, 0.02);
  EXPECT_EQ(lognormal_keys(20000, 1729), k);  // reproducible
  EXPECT_NE(lognormal_keys(20000, 1730), k);
}

TEST(Synthetic, LonglatIsAlexCompoundKeyOfDoubles) {
  const auto k = longlat_keys(20000, 1729);
  ASSERT_EQ(k.size(), 20000u);
  std::set<std::int64_t> cells;
  for (std::size_t i = 0; i < k.size(); ++i) {
    const double v = std::bit_cast<double>(k[i]);
    ASSERT_TRUE(std::isfinite(v));
    if (i > 0) {
      ASSERT_LT(std::bit_cast<double>(k[i - 1]), v);  // sorted, distinct as doubles
    }
    // 180 * floor(lon) + lat with lon in [-180, 180), lat in [-90, 90]
    ASSERT_GE(v, -180.0 * 180 - 90);
    ASSERT_LE(v, 179.0 * 180 + 90);
    cells.insert(static_cast<std::int64_t>(std::floor((v + 90) / 180)));
  }
  EXPECT_GT(cells.size(), 300u);  // many longitude cells are occupied
  std::vector<std::uint64_t> raw;
  bool doubles = false;
  ASSERT_TRUE(synthetic_keys("longlat", 100, 3, &raw, &doubles));
  EXPECT_TRUE(doubles);
  ASSERT_TRUE(synthetic_keys("lognormal", 100, 3, &raw, &doubles));
  EXPECT_FALSE(doubles);
  EXPECT_FALSE(synthetic_keys("zipf", 100, 3, &raw, &doubles));
}

// --- YCSB ---------------------------------------------------------------------------------------

// YCSB-D's "latest": reads favour the most recently inserted ids. Zipfian (what ycsb-d used
// before) favours ids 0, 1, 2... - the OLDEST records - and fails this test.
TEST(Ycsb, LatestReadsFavourRecentlyInsertedIds) {
  auto share_of_newest = [](DistKind kind) {
    WorkloadSpec s = spec_for(10000, 20000, 1, {0.95, 0.05, 0, 0, 0, 0});
    s.distribution = kind;
    s.skew = 0.99;
    const Schedule sc = build_schedules(s)[0];
    // Walk the schedule keeping the population in insertion order; a read is "recent" when
    // its id is among the 100 newest ids existing at that moment.
    std::uint64_t inserted = 0, recent = 0, reads = 0;
    for (std::size_t i = 0; i < sc.size(); ++i) {
      if (sc.types[i] == OpType::insert) {
        EXPECT_EQ(sc.ids[i], s.records + inserted);
        ++inserted;
        continue;
      }
      ++reads;
      const std::uint64_t id = sc.ids[i];
      const std::uint64_t age = id >= s.records ? inserted - 1 - (id - s.records)
                                                : inserted + (s.records - 1 - id);
      recent += age < 100 ? 1 : 0;
    }
    return static_cast<double>(recent) / static_cast<double>(reads);
  };
  const double latest = share_of_newest(DistKind::latest);
  const double zipf = share_of_newest(DistKind::zipfian);
  EXPECT_GT(latest, 0.4);  // zipfian(0.99) over ~10k ranks: ~half of all draws hit the top 100
  EXPECT_LT(zipf, 0.05);   // zipfian's hot ids are the oldest
}

// YCSB-F: rmw is its own operation with its own count, a new value version, and key bytes.
TEST(Ycsb, RmwIsItsOwnOperationWithANewVersion) {
  const auto s = spec_for(1000, 10000, 2, {0.5, 0, 0, 0, 0, 0.5});
  const auto scheds = build_schedules(s);
  std::uint64_t rmw = 0, updates = 0;
  for (const auto& sc : scheds) {
    for (std::size_t i = 0; i < sc.size(); ++i) {
      if (sc.types[i] == OpType::rmw) {
        ++rmw;
        EXPECT_GT(sc.version(i), 0u);
        std::string vbuf;
        EXPECT_EQ(sc.value(i, vbuf), s.values.make(sc.ids[i], sc.version(i)));
      }
      updates += sc.types[i] == OpType::update ? 1 : 0;
    }
    EXPECT_EQ(sc.counts[static_cast<int>(OpType::rmw)], sc.size() / 2);
  }
  EXPECT_EQ(rmw, 5000u);
  EXPECT_EQ(updates, 0u);
}

// Computed keys (no dataset) equal the stored form for every format: prefix and padding, the
// double encoding and PiBench's little-endian order (key() rewrites only the 8 ordering bytes).
TEST(Schedule, ComputedKeysMatchEveryFormat) {
  for (const KeyFormat& f : {KeyFormat(24, "pre", KeyKind::bytes), KeyFormat(8, "", KeyKind::f64),
                             KeyFormat(16, "", KeyKind::bytes, nullptr, /*pibench_order=*/true)}) {
    WorkloadSpec s = spec_for(1000, 5000, 2, {0.4, 0.2, 0.2, 0, 0.2});
    s.keys = f;
    const auto scheds = build_schedules(s);
    for (const auto& sc : scheds) {
      EXPECT_TRUE(sc.keys.empty());
      std::string buf = sc.key_buffer();
      for (std::size_t i = 0; i < sc.size(); ++i) ASSERT_EQ(sc.key(i, buf), f.make(sc.ids[i]));
    }
  }
}

}  // namespace
}  // namespace pmbench

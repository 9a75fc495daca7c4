// APEX never trusts PM, lazy recovery included (issue 18 item 2). An APEX pool of ~20k keys
// is built and closed once; each mutant is a copy of its file with one 8-byte word changed
// (targeted: child offsets, node sizes, models, stash chains, the pool's generation word;
// random: PMINDEX_MUTANTS words within the nodes, fixed seed). A forked child opens the
// mutant and finds every key, scans, inserts and verifies, under a timeout. Every answer must
// be the right one or Code::corrupted: a signal (segfault, sanitizer abort) is a crash, the
// timeout a hang, a wrong answer its own outcome. Targeted mutants must also be detected.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "index/apex/apex.h"
#include "pmindex/index.h"
#include "pmindex/pm/layout.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

constexpr unsigned kTimeoutSeconds = 20;  // generous for ASan; a normal child takes < 1 s
constexpr int kClean = 0;     // every answer right, nothing reported
constexpr int kDetected = 2;  // every answer right or Code::corrupted, and one corrupted
constexpr int kWrong = 3;     // a wrong answer (not found, wrong value, wrong scan)
constexpr int kVerifyOnly = 4;  // every answer right; only verify() reported the damage

Options options(const std::string& path) {
  Options o;
  o.kind = "apex";
  o.path = path;
  o.pool_size = 4 << 20;
  o.node_size = 1024;  // many small nodes: a deep tree with every SMO kind behind it
  return o;
}

std::string val(std::uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Node {
  std::uint64_t off;
  bool inner;
  std::size_t bytes;
  std::uint32_t depth;
  std::uint64_t parent;      // 0 for the root
  std::uint32_t first_slot;  // in the parent
};

// The pool built once: its bytes, the oracle, the nodes (parsed from the sound image).
struct Base {
  std::string image;
  std::map<std::string, std::string> oracle;
  std::vector<Node> nodes;
  std::uint64_t root_object = 0;
  std::uint64_t generation = 0;  // the pool generation of the session that built it
};

template <class T>
const T* at(const std::string& image, std::uint64_t off) {
  return reinterpret_cast<const T*>(image.data() + off);
}

void collect(const std::string& image, std::uint64_t off, std::uint32_t depth,
             std::uint64_t parent, std::uint32_t slot, std::vector<Node>& out) {
  const auto type = static_cast<apex::NodeType>(*at<std::uint64_t>(image, off) & apex::kTypeMask);
  if (type == apex::NodeType::inner) {
    const auto* in = at<apex::InnerNode>(image, off);
    out.push_back({off, true, apex::inner_bytes(in->fanout), depth, parent, slot});
    for (std::uint32_t i = 0; i < in->fanout; ++i)
      if (i == 0 || in->children()[i] != in->children()[i - 1])
        collect(image, in->children()[i], depth + 1, off, i, out);
    return;
  }
  out.push_back({off, false, at<apex::DataNode>(image, off)->bytes, depth, parent, slot});
}

const Base& base() {
  static const Base b = [] {
    Base r;
    TempDir dir;
    const std::string path = dir.file("base.pool");
    auto opened = Index::open(options(path));
    if (!opened.ok()) throw std::runtime_error(opened.status().to_string());
    auto idx = std::move(opened).value();
    // Clustered keys (a deep tree: inner nodes over inner nodes) plus uniform ones.
    std::mt19937_64 rng(18);
    while (r.oracle.size() < 20000) {
      const std::uint64_t cluster = rng() % 6;
      const std::uint64_t k = r.oracle.size() % 4 == 0
                                  ? rng()
                                  : (cluster << 58) + (rng() % (std::uint64_t{1} << (12 + 6 * cluster)));
      const std::string key = encode_u64(k);
      if (r.oracle.count(key) != 0) continue;
      if (idx->insert(key, val(k ^ 0x5a5a)) != Code::ok) throw std::runtime_error("insert");
      r.oracle[key] = val(k ^ 0x5a5a);
    }
    if (!idx->verify().ok()) throw std::runtime_error(idx->verify().to_string());
    std::string got;
    for (const auto& [k, v] : r.oracle)  // every node touched: L and `dram` set in PM
      if (idx->find(k, &got) != Code::ok) throw std::runtime_error("find");
    r.root_object = idx->pool().root();
    r.generation = idx->pool().generation();
    if (!idx->close().ok()) throw std::runtime_error("close");
    idx.reset();
    r.image = read_file(path);
    const auto* root = at<apex::Root>(r.image, r.root_object);
    collect(r.image, root->root_node, 0, 0, 0, r.nodes);
    return r;
  }();
  return b;
}

// Runs in the forked child: opens the mutant and exercises it. Returns kClean, kDetected or
// kWrong; a crash or hang never returns.
int exercise(const std::string& path, const std::map<std::string, std::string>& oracle) {
  Options o = options(path);
  o.private_mapping = true;  // the mutant file stays as written, for the next mutant
  auto opened = Index::open(o);
  if (!opened.ok()) return kDetected;  // refused at open: a clean error
  auto idx = std::move(opened).value();
  const auto scope = idx->attach_thread();
  bool damage = false, scan_empty = false;
  std::string got;
  for (const auto& [k, v] : oracle) {
    const Code c = idx->find(k, &got);
    if (c == Code::corrupted) {
      damage = true;
    } else if (c != Code::ok || got != v) {
      return kWrong;
    }
  }
  std::vector<std::pair<std::string, std::string>> sorted(oracle.begin(), oracle.end());
  ScanBuffer buf;
  for (std::size_t s = 0; s < 20; ++s) {
    const std::size_t from = s * sorted.size() / 20;
    const std::size_t n = idx->scan(sorted[from].first, 100, buf);
    if (n == 0) {  // scan has no code: it answers nothing when it meets damage
      scan_empty = true;
      continue;
    }
    if (n != std::min<std::size_t>(100, sorted.size() - from)) return kWrong;
    for (std::size_t j = 0; j < n; ++j)
      if (buf.key(j) != sorted[from + j].first || buf.value(j) != sorted[from + j].second)
        return kWrong;
  }
  const std::string fresh = encode_u64(0x3ff0000000000001ull);  // not in the oracle
  const Code ins = idx->insert(fresh, val(7));
  if (ins == Code::ok) {
    const Code f = idx->find(fresh, &got);
    if (f == Code::corrupted) damage = true;
    else if (f != Code::ok || got != val(7)) return kWrong;
  } else if (ins == Code::corrupted) {
    damage = true;
  } else {
    return kWrong;
  }
  const bool verify_failed = !idx->verify().ok();
  if (scan_empty && !damage && !verify_failed) return kWrong;  // must come with reported damage
  (void)idx->close();
  return damage ? kDetected : verify_failed ? kVerifyOnly : kClean;
}

enum class Outcome { clean, detected, verify_only, wrong, crash, hang };

const char* name(Outcome o) {
  switch (o) {
    case Outcome::clean: return "clean";
    case Outcome::detected: return "detected";
    case Outcome::verify_only: return "verify only";
    case Outcome::wrong: return "wrong answer";
    case Outcome::crash: return "crash";
    case Outcome::hang: return "hang";
  }
  return "?";
}

void write_word(const std::string& path, std::uint64_t off, std::uint64_t word) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(off));
  f.write(reinterpret_cast<const char*>(&word), 8);
}

std::uint64_t word_at(std::uint64_t off);

// The base image with `word` at `off`; exercise() runs on it in a child under a timeout.
// The child maps the pool privately, so the file holds the base image again once the word is
// put back.
// `extra`: more words for the few mutants one word cannot make (an extended stash cycle).
Outcome run_mutant(const TempDir& dir, std::uint64_t off, std::uint64_t word,
                   std::string* detail,
                   const std::vector<std::pair<std::uint64_t, std::uint64_t>>& extra = {}) {
  const Base& b = base();
  const std::string path = dir.file("mutant.pool");
  if (!std::filesystem::exists(path)) write_file(path, b.image);
  auto words = extra;
  words.emplace_back(off, word);
  for (const auto& [o, w] : words) write_word(path, o, w);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(kTimeoutSeconds);
    _exit(exercise(path, b.oracle));  // _exit: no gtest or static teardown in the child
  }
  int status = 0;
  waitpid(pid, &status, 0);
  for (const auto& [o, w] : words) write_word(path, o, word_at(o));  // the base image again
  std::ostringstream why;
  why << "word at offset " << off << " := 0x" << std::hex << word << std::dec << ": ";
  Outcome o = Outcome::crash;
  if (WIFSIGNALED(status)) {
    o = WTERMSIG(status) == SIGALRM ? Outcome::hang : Outcome::crash;
    why << "signal " << WTERMSIG(status);
  } else if (WEXITSTATUS(status) == kClean) {
    o = Outcome::clean;
  } else if (WEXITSTATUS(status) == kDetected) {
    o = Outcome::detected;
  } else if (WEXITSTATUS(status) == kVerifyOnly) {
    o = Outcome::verify_only;
  } else if (WEXITSTATUS(status) == kWrong) {
    o = Outcome::wrong;
  } else {
    why << "exit code " << WEXITSTATUS(status) << " (a sanitizer report)";
  }
  why << " -> " << name(o);
  *detail = why.str();
  return o;
}

// The first oracle key in the node's range [lo, hi] (same header offsets in both node kinds),
// or none.
std::optional<std::uint64_t> key_in(const Node& n) {
  const auto* in = at<apex::InnerNode>(base().image, n.off);
  auto it = base().oracle.lower_bound(encode_u64(in->lo));
  if (it == base().oracle.end() || decode_u64(it->first) > in->hi) return std::nullopt;
  return decode_u64(it->first);
}

// A node at `min_depth` or deeper whose range holds an oracle key (so finds go through it).
const Node& find_node(bool inner, std::uint32_t min_depth) {
  for (const Node& n : base().nodes)
    if (n.inner == inner && n.depth >= min_depth && key_in(n)) return n;
  throw std::runtime_error("the base tree has no such node");
}

std::uint64_t word_at(std::uint64_t off) {
  std::uint64_t w = 0;
  std::memcpy(&w, base().image.data() + off, 8);
  return w;
}

std::uint64_t grandparent(const Node& n) {
  for (const Node& p : base().nodes)
    if (p.off == n.parent && p.parent != 0) return p.parent;
  throw std::runtime_error("the node has no grandparent");
}

// Offset of the parent's child slot that an oracle key of `n` is routed through (a child
// covering several slots may have slots no oracle key reaches).
std::uint64_t child_slot(const Node& n) {
  const auto* p = at<apex::InnerNode>(base().image, n.parent);
  const std::uint32_t slot = apex::predict_slot(
      {p->slope, p->intercept}, apex::model_input(KeyType::u64, *key_in(n), p->lo), p->fanout);
  if (p->children()[slot] != n.off) throw std::runtime_error("routing mismatch");
  return n.parent + sizeof(apex::InnerNode) + 8ull * slot;
}

std::uint64_t f64_bits(double d) {
  std::uint64_t w = 0;
  std::memcpy(&w, &d, 8);
  return w;
}

TEST(ApexCorrupt, BaseTreeIsDeep) {
  const Base& b = base();
  std::uint32_t depth = 0;
  for (const Node& n : b.nodes) depth = std::max(depth, n.depth);
  std::cout << "[ info     ] " << b.nodes.size() << " nodes, depth " << depth << "\n";
  ASSERT_GE(depth, 3u) << "targeted mutants need an inner node below an inner node";
  TempDir dir;
  std::string detail;
  EXPECT_EQ(run_mutant(dir, b.root_object, word_at(b.root_object), &detail), Outcome::clean)
      << detail;  // the unmutated pool
}

// One word of a node on the path of an oracle key changed: every answer right or
// Code::corrupted, and an operation (not only verify()) answers Code::corrupted.
TEST(ApexCorrupt, TargetedMutantsAreDetected) {
  const Base& b = base();
  const Node& data = find_node(false, 2);   // a data node below an inner node below the root
  const Node& mid = find_node(true, 1);     // an inner node below the root
  const Node& deep = find_node(true, 2);    // an inner node two levels down
  const Node& other = [&]() -> const Node& {  // another data node (not `data`)
    for (const Node& n : b.nodes)
      if (!n.inner && n.off != data.off && n.parent != data.parent) return n;
    throw std::runtime_error("no second data node");
  }();
  const std::uint64_t slot = child_slot(data);
  const auto* dn = at<apex::DataNode>(b.image, data.off);
  const auto* in = at<apex::InnerNode>(b.image, mid.off);
  struct Case {
    const char* what;
    std::uint64_t off, word;
  };
  const std::vector<Case> cases = {
      {"child offset 0xdeadbeefdeadbeef", slot, 0xdeadbeefdeadbeefull},
      {"child offset 2^62", slot, std::uint64_t{1} << 62},
      {"child offset misaligned", slot, data.off + 8},
      {"child offset 0", slot, 0},
      {"child offset = the node itself (self-cycle)", child_slot(deep), deep.parent},
      {"child offset = the root (ancestor cycle)", child_slot(deep),
       at<apex::Root>(b.image, b.root_object)->root_node},
      {"child offset = the node's grandparent (ancestor cycle)", slot, grandparent(data)},
      {"child offset = another data node", slot, other.off},
      {"root node offset misaligned", b.root_object + offsetof(apex::Root, root_node),
       at<apex::Root>(b.image, b.root_object)->root_node + 8},
      {"inner fanout 2^30", mid.off + offsetof(apex::InnerNode, fanout),
       (word_at(mid.off + 40) & ~0xffffffffull) | (std::uint64_t{1} << 30)},
      {"inner slope NaN", mid.off + offsetof(apex::InnerNode, slope), f64_bits(std::nan(""))},
      {"inner slope -1", mid.off + offsetof(apex::InnerNode, slope), f64_bits(-1.0)},
      {"data PA slots 2^20 (lock index out of bounds)", data.off + 40,
       (word_at(data.off + 40) & ~0xffffffffull) | (std::uint64_t{1} << 20)},
      {"data SA slots 60000 (stash size)", data.off + 40,
       (word_at(data.off + 40) & 0xffffffffull) | (std::uint64_t{60000} << 32)},
      {"data PA slots 17 (not whole groups)", data.off + 40,
       (word_at(data.off + 40) & ~0xffffffffull) | 17},
      {"data bytes 2^40", data.off + offsetof(apex::DataNode, bytes), std::uint64_t{1} << 40},
      {"data slope 1e300", data.off + offsetof(apex::DataNode, slope), f64_bits(1e300)},
      {"data intercept -inf", data.off + offsetof(apex::DataNode, intercept),
       f64_bits(-HUGE_VAL)},
      {"data range lo := hi + 1", data.off + offsetof(apex::DataNode, lo),
       at<apex::DataNode>(b.image, data.off)->hi + 1},
      {"extended stash head misaligned", data.off + offsetof(apex::DataNode, ext_head),
       other.off + 16},
      {"extended stash head 0xdeadbeefdeadbeef", data.off + offsetof(apex::DataNode, ext_head),
       0xdeadbeefdeadbeefull},
      {"extended stash head = the node itself", data.off + offsetof(apex::DataNode, ext_head),
       data.off},
      {"a PA key moved out of the node's range", data.off + sizeof(apex::DataNode),
       dn->hi + 2},
      {"an SA key moved out of the node's range", data.off + sizeof(apex::DataNode) +
       16ull * dn->pa_slots, dn->hi + 2},
      {"data invalid key changed", data.off + offsetof(apex::DataNode, invalid_key),
       dn->invalid_key + 1},
      {"child offset = a data node + 64 (not 256 B aligned)", slot, other.off + 64},
      {"inner range lo > hi", mid.off + offsetof(apex::InnerNode, lo),
       in->hi != ~std::uint64_t{0} ? in->hi + 1 : ~std::uint64_t{0}},
  };
  TempDir dir;
  for (const Case& c : cases) {
    std::string detail;
    const Outcome o = run_mutant(dir, c.off, c.word, &detail);
    EXPECT_EQ(o, Outcome::detected) << c.what << ": " << detail;
  }
  // An extended stash chain that loops: ext_head -> an unused 256 B block past the heap's
  // high-water mark whose `next` is itself and whose slots are free (the invalid key).
  const std::uint64_t blk = b.image.size() - 4096;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> loop = {{blk, blk}};
  for (std::uint32_t j = 0; j < apex::kExtRecords; ++j)
    loop.emplace_back(blk + offsetof(apex::ExtStash, rec) + 16ull * j, dn->invalid_key);
  std::string detail;
  EXPECT_EQ(run_mutant(dir, data.off + offsetof(apex::DataNode, ext_head), blk, &detail, loop),
            Outcome::detected)
      << "extended stash cycle: " << detail;
}

// The generation word set back to the value the building session started from: the next
// session's G equals that session's, and nodes still carry its L and DRAM addresses in PM
// (issue 18 item 3). Those must never be followed.
TEST(ApexCorrupt, GenerationSetBackIsHarmless) {
  const Base& b = base();
  TempDir dir;
  // Format v2 checksums the word in two copies; a forger rewrites both with valid checksums.
  pm::HeaderState st{};
  ASSERT_TRUE(pm::image_state(b.image.data(), &st));
  st.generation = b.generation - 1;
  std::string header = b.image.substr(0, pm::kHeaderSize);
  pm::set_image_state(header.data(), st);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> words;
  for (std::uint64_t off = offsetof(pm::PoolHeader, state);
       off < offsetof(pm::PoolHeader, state) + sizeof(pm::PoolHeader::state); off += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, header.data() + off, 8);
    words.emplace_back(off, w);
  }
  const auto [last_off, last_word] = words.back();
  words.pop_back();
  std::string detail;
  const Outcome o = run_mutant(dir, last_off, last_word, &detail, words);
  EXPECT_TRUE(o == Outcome::clean || o == Outcome::detected) << detail;
}

// Random single-word mutations inside the nodes (headers and child slots favoured): no crash
// and no hang; wrong answers are counted (a changed payload cannot be seen).
TEST(ApexCorrupt, RandomMutantsNeverCrashOrHang) {
  const Base& b = base();
  const char* env = std::getenv("PMINDEX_MUTANTS");
  const int mutants = env != nullptr ? std::atoi(env) : 200;
  std::mt19937_64 rng(0x18a2);
  std::map<Outcome, int> counts;
  TempDir dir;
  for (int i = 0; i < mutants; ++i) {
    const Node& n = b.nodes[rng() % b.nodes.size()];
    // Half in the header line(s) or the first child slots, half anywhere in the node.
    const std::size_t span = rng() % 2 == 0 ? std::min<std::size_t>(n.bytes, 192) : n.bytes;
    const std::uint64_t off = n.off + (rng() % (span / 8)) * 8;
    const std::uint64_t old = word_at(off);
    std::uint64_t word = 0;
    switch (rng() % 8) {
      case 0: word = rng(); break;
      case 1: word = 0; break;
      case 2: word = 0xdeadbeefdeadbeefull; break;
      case 3: word = std::uint64_t{1} << 62; break;
      case 4: word = b.nodes[rng() % b.nodes.size()].off; break;
      case 5: word = old + (rng() % 2 == 0 ? 8 : -8); break;
      case 6: word = old ^ (std::uint64_t{1} << (rng() % 64)); break;
      default: word = rng() % 70000; break;
    }
    std::string detail;
    const Outcome o = run_mutant(dir, off, word, &detail);
    ++counts[o];
    EXPECT_NE(o, Outcome::crash) << detail;
    EXPECT_NE(o, Outcome::hang) << detail;
  }
  std::cout << "[ info     ] " << mutants << " mutants:";
  for (const auto& [o, c] : counts) std::cout << " " << name(o) << " " << c;
  std::cout << "\n";
}

}  // namespace
}  // namespace pmindex

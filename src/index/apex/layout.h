// APEX persistent layout: root object, SMO log lines, inner nodes, data nodes, extended stash
// blocks. Every persistent struct is drawn here and asserted below it. Persistence steps that
// write these bytes are numbered in PROTOCOL.md.
//
// Keys inside APEX are 64-bit "ordered keys": the big-endian 8 key bytes read as an unsigned
// integer (decode_u64). For KeyType::u64 that is the integer itself; for KeyType::f64 it is the
// order-preserving encoding of the double (f64_to_ordered), so comparing ordered keys as
// integers is memcmp order. Models never see ordered keys of doubles: model.h decodes them
// to IEEE values first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "index/common/root_stamp.h"

namespace pmindex::apex {

// Root magic "PMXAPEX<n>" (little-endian), n = the format:
//   1  first layout                    2  data node `dram` word in line 0, SmoKind::merge
//   3  every data node keeps S = SA / (PA + SA) in [0.05, 0.3] (stash_ratio_ok; verify()
//      checks it), which format-2 pools may violate
// Older formats are refused with Code::unsupported and a message naming the format, never
// misread and never reported as corrupted.
inline constexpr std::uint64_t kRootMagicBase = 0x0058455041584d50ull;  // "PMXAPEX" + byte 7
inline constexpr std::uint64_t kFormat = 3;
inline constexpr std::uint64_t kRootMagic = kRootMagicBase | ('0' + kFormat) << 56;
static_assert(kRootMagic == 0x3358455041584d50ull);  // "PMXAPEX3"
// The format of an APEX root magic, 0 if it is not one.
inline constexpr std::uint64_t format_of_magic(std::uint64_t magic) {
  const std::uint64_t digit = magic >> 56;
  return (magic & ~(std::uint64_t{0xff} << 56)) == kRootMagicBase && digit >= '1' && digit <= '9'
             ? digit - '0'
             : 0;
}
inline constexpr std::size_t kMaxLogs = 64;
// Recovery and verify refuse deeper trees (a cycle); real trees stay far shallower.
inline constexpr std::uint32_t kMaxDepth = 2048;       // per-thread SMO log lines
inline constexpr std::uint32_t kProbeDistance = 16;  // D: PA slots probed from the prediction
inline constexpr std::uint32_t kGroup = 16;          // PA records per DRAM accelerator
inline constexpr std::size_t kDefaultDataMax = 256 * 1024;
inline constexpr std::size_t kInnerMaxCap = std::size_t{16} << 20;
inline constexpr double kDensityLower = 0.5;
inline constexpr double kDensityUpper = 0.9;
inline constexpr double kDensityInit = 0.6;     // density of a node built by an SMO/bulk load
inline constexpr double kStashMin = 0.05;
inline constexpr double kStashMax = 0.3;
inline constexpr double kStashCoefficient = 1.5;
// Cost model (PROTOCOL.md "SMO policy"): a data node whose simulated probe-and-stash cost
// 1 + 2·O exceeds kDataCostLimit is split, not built / expanded (bulk load and SMOs alike);
// an SMO is also triggered when the empirical cost of the inserts since a node was built
// exceeds kCostDeviation x its cost when built (after at least kDriftMinInserts inserts).
inline constexpr double kDataCostLimit = 1.5;
inline constexpr double kCostDeviation = 1.5;
inline constexpr std::uint64_t kDriftMinInserts = 64;
// ... and only once that cost also exceeds kDriftCostFloor (half the inserts going to the
// stash): a well-fitted node's inserts reach ~1.5 just from filling up towards the density
// bound, and splitting those early cost 25-30 % of uniform-key insert throughput.
inline constexpr double kDriftCostFloor = 2.0;
// Every data node's stash ratio S = SA / (PA + SA) lies in [kStashMin, kStashMax] exactly
// (verify() checks it). In integers: 19·SA >= PA (S >= 1/20) and 7·SA <= 3·PA (S <= 3/10).
// PA is a multiple of kGroup (>= 16), so SA in [ceil(PA/19), floor(3·PA/7)] is never empty
// (PA = 16: SA in [1, 6]).
static_assert(kStashMin == 1.0 / 20 && kStashMax == 3.0 / 10, "stash_sa_min/max use 1/20, 3/10");
inline constexpr std::uint64_t stash_sa_min(std::uint64_t pa) { return (pa + 18) / 19; }
inline constexpr std::uint64_t stash_sa_max(std::uint64_t pa) { return 3 * pa / 7; }
inline constexpr bool stash_ratio_ok(std::uint64_t pa, std::uint64_t sa) {
  return sa >= stash_sa_min(pa) && sa <= stash_sa_max(pa);
}
static_assert(stash_ratio_ok(16, 1) && stash_ratio_ok(16, 6) && !stash_ratio_ok(16, 7) &&
              !stash_ratio_ok(16, 0) && !stash_ratio_ok(16, 16) && stash_ratio_ok(19, 1) &&
              !stash_ratio_ok(20, 1) && stash_ratio_ok(70, 30) && !stash_ratio_ok(69, 30));

// SMO log line (64 B, one cache line), one per thread slot, in an array the root points at.
//   [ 0, 8) stage_kind: bits 0-7 stage (0 none, 1 UNDO, 2 REDO) | bits 8-15 SmoKind | 16-63 0
//   [ 8,16) old        node being replaced
//   [16,24) new_a      first new node (expansion: the new node; downward split: new inner)
//   [24,32) new_b      second new node (sideways split: right half), else 0
//   [32,40) parent     inner node whose child slots switch; 0 = the root object's root word
//   [40,48) key        the insert that triggered the SMO (diagnostics; parent is explicit)
//   [48,52) slot_begin [52,56) slot_end (inclusive)   [56,60) slot_mid   [60,64) reserved
// stage_kind is written last in program order within the line, so a persisted stage implies
// the rest of the line is persisted too (x86 keeps stores to one line in order).
enum class SmoStage : std::uint8_t { none = 0, undo = 1, redo = 2 };
enum class SmoKind : std::uint8_t {
  none = 0, expand_data = 1, split_sideways = 2, split_downward = 3, expand_inner = 4,
  merge = 5,  // two sparse neighbouring data nodes -> one over slots [slot_begin, slot_end]
  // a merge whose two nodes fill a non-root inner node: the merged node replaces that inner
  // node (old_node) in its parent (parent), slots [slot_begin, slot_end] (PROTOCOL.md A16c)
  collapse = 6
};
struct SmoLog {
  std::uint64_t stage_kind;
  std::uint64_t old_node;
  std::uint64_t new_a;
  std::uint64_t new_b;
  std::uint64_t parent;
  std::uint64_t key;
  std::uint32_t slot_begin;
  std::uint32_t slot_end;
  std::uint32_t slot_mid;
  std::uint32_t reserved;
};
static_assert(sizeof(SmoLog) == 64);
static_assert(offsetof(SmoLog, stage_kind) == 0 && offsetof(SmoLog, slot_begin) == 48);
static_assert(std::is_standard_layout_v<SmoLog> && std::is_trivially_copyable_v<SmoLog>);
inline constexpr std::uint64_t kStageMask = 0xff;
inline constexpr unsigned kKindShift = 8;
inline std::uint64_t stage_word(SmoStage s, SmoKind k) {
  return static_cast<std::uint64_t>(s) | (static_cast<std::uint64_t>(k) << kKindShift);
}
inline SmoStage stage_of(std::uint64_t w) { return static_cast<SmoStage>(w & kStageMask); }
inline SmoKind kind_of(std::uint64_t w) { return static_cast<SmoKind>((w >> kKindShift) & 0xff); }

// Root object (128 B, two lines).
//   line 0 [ 0, 8) magic kRootMagic     [ 8,16) root_node: offset of the root inner node
//          [16,20) key_type (KeyMode)   [20,24) reserved
//          [24,32) data_max bytes       [32,40) inner_max bytes
//          [40,48) logs: offset of kMaxLogs SmoLog lines (4096 B block)
//          [48,64) stamp: index_common::RootStamp (layout id at creation)
//   line 1 [64,128) reserved
struct Root {
  std::uint64_t magic;
  std::uint64_t root_node;
  std::uint32_t key_type;
  std::uint32_t reserved0;
  std::uint64_t data_max;
  std::uint64_t inner_max;
  std::uint64_t logs;
  index_common::RootStamp stamp;  // layout id at creation, checked against the header at open
  std::uint8_t reserved[64];
};
static_assert(sizeof(Root) == 128);
static_assert(offsetof(Root, root_node) == 8 && offsetof(Root, logs) == 40);
static_assert(offsetof(Root, stamp) == 48, "the layout stamp sits in the old reserved tail");
static_assert(std::is_standard_layout_v<Root> && std::is_trivially_copyable_v<Root>);

// Common node header words. type_version: bits 0-7 NodeType | bits 8-63 local version L: the
// session tag (pool generation G + 1 in its low 16 bits and 40 random bits above, never 0, so
// a freshly built node's L = 0 never matches) of the session that built this node's DRAM
// state, whose address is in the header's `dram` word; L == tag also means the node passed
// its first-touch check in this session (PROTOCOL.md R4).
// Both words are written with release stores under the index's meta mutex, `dram` first, and
// never flushed: after a restart G has moved on, so L != tag and the state is rebuilt.
enum class NodeType : std::uint8_t { inner = 1, data = 2 };
inline constexpr std::uint64_t kTypeMask = 0xff;
inline constexpr unsigned kVersionShift = 8;

// Inner node: 64 B header + fanout child offsets (8 B each). Up to inner_max bytes.
//   [ 0, 8) type_version       [ 8,16) slope (double)   [16,24) intercept (double)
//   [24,32) lo (ordered key)   [32,40) hi (inclusive)
//   [40,44) fanout (power of 2) [44,48) reserved
//   [48,56) dram: address of this node's DRAM state (InnerMeta), meaningful only when the
//           header's L equals the session tag (never flushed; stale after a restart)
//   [56,64) reserved
//   [64, 64+8*fanout) child[i]: offset of an inner or data node; a child covering several
//                     slots appears in consecutive slots
// Routing: slot = clamp(floor(slope * x + intercept), 0, fanout-1) with x = model input
// (model.h). Routing is monotone, so each child's keys are one contiguous interval, and the
// child's own [lo, hi] equals exactly the keys routed to its slots.
struct InnerNode {
  std::uint64_t type_version;
  double slope;
  double intercept;
  std::uint64_t lo;
  std::uint64_t hi;
  std::uint32_t fanout;
  std::uint32_t reserved0;
  std::uint64_t dram;
  std::uint64_t reserved;
  std::uint64_t* children() { return reinterpret_cast<std::uint64_t*>(this + 1); }
  const std::uint64_t* children() const { return reinterpret_cast<const std::uint64_t*>(this + 1); }
};
static_assert(sizeof(InnerNode) == 64);
static_assert(offsetof(InnerNode, lo) == 24 && offsetof(InnerNode, fanout) == 40 &&
              offsetof(InnerNode, dram) == 48);
static_assert(std::is_standard_layout_v<InnerNode> && std::is_trivially_copyable_v<InnerNode>);
inline std::size_t inner_bytes(std::uint32_t fanout) { return sizeof(InnerNode) + 8ull * fanout; }

// Record: 16 B, key then payload. A slot is free when key == the node's invalid key.
struct Record {
  std::uint64_t key;
  std::uint64_t payload;
};
static_assert(sizeof(Record) == 16);
static_assert(std::is_standard_layout_v<Record> && std::is_trivially_copyable_v<Record>);

// Data node: 128 B header, then PA (pa_slots records), then SA (sa_slots records).
// The block is 256 B aligned, so every 16 B record sits inside one 64 B line.
//   line 0 [ 0, 8) type_version     [ 8,16) slope   [16,24) intercept
//          [24,32) lo               [32,40) hi (inclusive; lo <= hi, never [0, 2^64-1])
//          [40,44) pa_slots (multiple of 16)        [44,48) sa_slots
//          [48,56) ext_head: offset of the first extended stash block, 0 if none
//          [56,64) dram: address of this node's DRAM state (DataMeta), meaningful only when
//                  the header's L equals the session tag (never flushed; stale after restart).
//                  In line 0 with the model: a lookup touches one header line.
//   line 1 [64,72) invalid_key: hi + 1, or lo - 1 when hi == 2^64-1 (outside [lo, hi])
//          [72,80) bytes: size requested from the allocator
//          [80,128) reserved
//   [128, 128+16*pa_slots) PA   [.., +16*sa_slots) SA
struct DataNode {
  std::uint64_t type_version;
  double slope;
  double intercept;
  std::uint64_t lo;
  std::uint64_t hi;
  std::uint32_t pa_slots;
  std::uint32_t sa_slots;
  std::uint64_t ext_head;
  std::uint64_t dram;
  std::uint64_t invalid_key;
  std::uint64_t bytes;
  std::uint64_t reserved[6];
  Record* pa() { return reinterpret_cast<Record*>(this + 1); }
  const Record* pa() const { return reinterpret_cast<const Record*>(this + 1); }
  Record* sa() { return pa() + pa_slots; }
  const Record* sa() const { return pa() + pa_slots; }
};
static_assert(sizeof(DataNode) == 128);
static_assert(offsetof(DataNode, pa_slots) == 40 && offsetof(DataNode, dram) == 56 &&
              offsetof(DataNode, invalid_key) == 64 && offsetof(DataNode, bytes) == 72);
static_assert(std::is_standard_layout_v<DataNode> && std::is_trivially_copyable_v<DataNode>);
inline std::size_t data_bytes(std::uint32_t pa, std::uint32_t sa) {
  return sizeof(DataNode) + 16ull * (pa + sa);
}

// Extended stash block: 256 B (one XPLine). [0,8) next block offset, [8,16) reserved,
// [16,256) 15 records.
inline constexpr std::uint32_t kExtRecords = 15;
struct ExtStash {
  std::uint64_t next;
  std::uint64_t reserved;
  Record rec[kExtRecords];
};
static_assert(sizeof(ExtStash) == 256);
static_assert(offsetof(ExtStash, rec) == 16);
static_assert(std::is_standard_layout_v<ExtStash> && std::is_trivially_copyable_v<ExtStash>);

inline std::uint64_t invalid_key_for(std::uint64_t lo, std::uint64_t hi) {
  return hi != ~std::uint64_t{0} ? hi + 1 : lo - 1;
}

}  // namespace pmindex::apex

// Tagged links of a PM leaf chain (docs/pool-format.md, "Unclean shutdown: tagged links"):
// every leaf carries its own 16-bit tag, written with the rest of the leaf before the leaf is
// linked, and every link to a leaf repeats that tag beside the offset. Recovery checks each
// link against the leaf it reaches, after any end, so a link zeroed or redirected to another
// valid leaf by damage is refused, with no extra line and no extra store: offsets are below
// 2^48, so one 8-byte NAW still publishes a link.
//
//   link word: bits 0-47 the leaf's pool offset, bits 48-63 its tag (1..kEndTag-1)
//   kChainEnd: offset 0, tag kEndTag; the last leaf's link. A link of 0 is always damage.
//
// Used by fptree (Leaf::next), nbtree (BlockHeader::next and Root::head), pactree (the data
// nodes' next links) and dptree (leaf and log page links, the chain heads); lbtree packs an
// 8-bit form into its sibling words (lbtree/layout.h) and uses TagSource. utree and reflist
// keep 24-bit tags in their own layouts (offsets there are below 2^40).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pmindex::index_common {

inline constexpr unsigned kTagShift = 48;
inline constexpr std::uint64_t kEndTag = 0xffff;
inline constexpr std::uint64_t kChainEnd = kEndTag << kTagShift;

constexpr std::uint64_t link_off(std::uint64_t link) {
  return link & ((std::uint64_t{1} << kTagShift) - 1);
}
constexpr std::uint64_t link_tag(std::uint64_t link) { return link >> kTagShift; }
constexpr std::uint64_t make_link(std::uint64_t off, std::uint64_t tag) {
  return off | tag << kTagShift;
}
constexpr bool valid_tag(std::uint64_t tag) { return tag != 0 && tag < kEndTag; }
static_assert(link_off(make_link(0x123456789abcull, 7)) == 0x123456789abcull &&
              link_tag(make_link(0x123456789abcull, 7)) == 7 && link_off(kChainEnd) == 0);

// Fresh leaf tags 1..end-1: a counter from a random start each session, so a link damaged into
// naming another leaf fails its check but for 1 in end-1 (65,534 for the 16-bit tags above;
// lbtree's 8-bit tags pass end 0xff).
class TagSource {
 public:
  explicit TagSource(std::uint64_t end = kEndTag) : end_(end) {}
  std::uint64_t next() {
    // relaxed: a counter; a tag is published with its leaf (persisted before the link's NAW).
    return 1 + counter_.fetch_add(1, std::memory_order_relaxed) % (end_ - 1);
  }

 private:
  const std::uint64_t end_;
  std::atomic<std::uint64_t> counter_{std::random_device{}()};
};

// A leaf's link as check_chain_tags reads it: the offset it names and the tag it carries.
struct ChainLink {
  std::uint64_t off;
  std::uint64_t tag;
};

// The one tag check of a recovered leaf chain (recovery and verify() of lbtree and fptree):
// `leaves` is the chain in order, as walk_leaf_chain found it by following the links' offsets.
// Every leaf's own tag (`own_tag(off)`) must be a valid tag below `end_tag`, every leaf's link
// (`link_of(off)`, a ChainLink) must carry the own tag of the next leaf, and the last leaf's
// link must carry `end_tag`: a link zeroed or redirected by damage fails after any end (but
// for 1 in end_tag - 1 redirects). Returns "" if the chain passes, else what is wrong, naming
// the leaf offsets, for the caller to refuse with (`link` names the link word in the message:
// "link", "sibling word").
template <class OwnTag, class LinkOf>
std::string check_chain_tags(const std::vector<std::uint64_t>& leaves, std::uint64_t end_tag,
                             const char* link, OwnTag own_tag, LinkOf link_of) {
  const auto valid = [end_tag](std::uint64_t tag) { return tag != 0 && tag < end_tag; };
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const ChainLink l = link_of(leaves[i]);
    // The message is built only for a refusal: recovery runs this once per leaf.
    const auto at = [&] {
      return "the " + std::string(link) + " of the leaf at offset " + std::to_string(leaves[i]) +
             " (to offset " + std::to_string(l.off) + ", tag " + std::to_string(l.tag) + ")";
    };
    if (i + 1 == leaves.size()) {
      if (l.tag != end_tag) return at() + " ends the chain without its end mark";
    } else if (const std::uint64_t want = own_tag(leaves[i + 1]); !valid(want) || l.tag != want) {
      return at() + " does not carry the tag of the leaf it names (that leaf's own tag is " +
             std::to_string(want) + ")";
    }
    if (const std::uint64_t own = own_tag(leaves[i]); !valid(own))
      return "the leaf at offset " + std::to_string(leaves[i]) + " has no valid own tag (" +
             std::to_string(own) + ")";
  }
  return {};
}

}  // namespace pmindex::index_common

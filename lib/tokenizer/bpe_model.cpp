#include "tokenizer/bpe_model.hpp"

#include <algorithm>
#include <limits>
#include <mutex>
#include <queue>

#include "core/error.hpp"

namespace xserv::tokenizer {

namespace {

constexpr std::int32_t kNoRank = std::numeric_limits<std::int32_t>::max();

std::uint64_t pair_key(std::int32_t left, std::int32_t right) noexcept {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
         static_cast<std::uint32_t>(right);
}

std::uint64_t mix(std::uint64_t key) noexcept {
  key ^= key >> 29;
  key *= 0xBF58476D1CE4E5B9ull;
  key ^= key >> 32;
  return key;
}

// Words up to this many bytes merge with a linear scan (cheaper than a heap when short).
constexpr std::size_t kShortWord = 48;

}  // namespace

BpeModel::BpeModel(const std::int32_t (&byte_ids)[256], const std::vector<Merge>& merges,
                   const std::vector<std::int32_t>& merged_ids, bool ignore_merges,
                   std::unordered_map<std::string, std::int32_t> word_ids)
    : ignore_merges_(ignore_merges), word_ids_(std::move(word_ids)) {
  std::copy(std::begin(byte_ids), std::end(byte_ids), byte_ids_);
  XSERV_CHECK(merges.size() == merged_ids.size(), ErrorCode::internal, "BPE: merge tables differ in size");
  XSERV_CHECK(merges.size() < static_cast<std::size_t>(kNoRank), ErrorCode::format, "BPE: too many merges");
  std::size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    std::uint64_t key = pair_key(merges[i].left, merges[i].right);
    std::uint64_t h = mix(key) & mask_;
    while (slots_[h].key != kEmpty && slots_[h].key != key) h = (h + 1) & mask_;
    // A pair listed twice keeps its last rank, as HF's HashMap collect does.
    slots_[h] = Slot{key, static_cast<std::int32_t>(i), merged_ids[i]};
  }
}

const BpeModel::Slot* BpeModel::find_pair(std::int32_t left, std::int32_t right) const noexcept {
  std::uint64_t key = pair_key(left, right);
  std::uint64_t h = mix(key) & mask_;
  for (;;) {
    const Slot& s = slots_[h];
    if (s.key == key) return &s;
    if (s.key == kEmpty) return nullptr;
    h = (h + 1) & mask_;
  }
}

// Repeatedly merges the adjacent pair of lowest rank, leftmost first: the same order as HF's
// heap, whose entries are (rank, position) and which pops the smallest.
void BpeModel::merge_short(std::vector<std::int32_t>& ids) const {
  std::int32_t ranks[kShortWord];
  std::int32_t merged[kShortWord];
  std::size_t n = ids.size();
  auto set_rank = [&](std::size_t i) {
    const Slot* s = find_pair(ids[i], ids[i + 1]);
    ranks[i] = s ? s->rank : kNoRank;
    merged[i] = s ? s->merged : -1;
  };
  for (std::size_t i = 0; i + 1 < n; ++i) set_rank(i);
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == kNoRank) break;
    ids[best] = merged[best];
    // Remove symbol best+1 and pair slot best (now recomputed).
    for (std::size_t i = best + 1; i + 1 < n; ++i) ids[i] = ids[i + 1];
    for (std::size_t i = best + 1; i + 2 < n; ++i) {
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) set_rank(best - 1);
    if (best + 1 < n) set_rank(best);
  }
  ids.resize(n);
}

// O(n log n): a min-heap of candidate merges over a doubly linked list of symbols. Entries go
// stale when a neighbour merges; a popped entry is applied only if its pair still exists.
void BpeModel::merge_long(std::vector<std::int32_t>& ids) const {
  const auto n = static_cast<std::int32_t>(ids.size());
  std::vector<std::int32_t> prev(n), next(n);
  for (std::int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    std::int32_t rank, pos, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Cand> storage;
  storage.reserve(static_cast<std::size_t>(n));
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap(std::greater<Cand>{}, std::move(storage));
  auto push = [&](std::int32_t pos) {
    std::int32_t nx = next[pos];
    if (nx < 0) return;
    if (const Slot* s = find_pair(ids[pos], ids[nx])) heap.push(Cand{s->rank, pos, s->merged});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(static_cast<std::size_t>(n), true);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos]) continue;
    std::int32_t nx = next[c.pos];
    if (nx < 0) continue;
    const Slot* s = find_pair(ids[c.pos], ids[nx]);
    if (!s || s->merged != c.merged) continue;  // stale: a neighbour changed
    ids[c.pos] = c.merged;
    alive[nx] = false;
    next[c.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  std::size_t out = 0;
  for (std::int32_t i = 0; i >= 0; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    std::int32_t id = byte_ids_[static_cast<unsigned char>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (ignore_merges_) {
    auto it = word_ids_.find(std::string(word));
    if (it != word_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::int32_t> ids;
  ids.reserve(word.size());
  for (char c : word) {
    std::int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) ids.push_back(id);
  }
  if (ids.size() <= kShortWord) {
    merge_short(ids);
  } else {
    merge_long(ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::unique_lock lock(cache_mutex_);
  if (cache_.size() >= kCacheCapacity) cache_.clear();
  cache_.emplace(std::string(word), std::move(ids));
}

std::size_t BpeModel::cache_size() const {
  std::shared_lock lock(cache_mutex_);
  return cache_.size();
}

}  // namespace xserv::tokenizer

#include "tokenizer/bpe_model.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <queue>
#include <thread>

#include "core/error.hpp"

namespace xserv::tokenizer {

namespace {

constexpr std::int32_t no_rank = std::numeric_limits<std::int32_t>::max();

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

// A fast hash for short byte strings: 8 bytes at a time through a multiply-xorshift mix.
std::uint64_t hash_word(std::string_view s) noexcept {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (i < s.size()) {
    std::uint64_t v = 0;
    std::memcpy(&v, s.data() + i, s.size() - i);
    h = (h ^ v) * 0x94D049BB133111EBull;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

// Spin lock over one stripe of cache slots; critical sections are a compare and a copy.
class StripeLock {
 public:
  explicit StripeLock(std::atomic<bool>& flag) : flag_(flag) {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  ~StripeLock() { flag_.store(false, std::memory_order_release); }
  StripeLock(const StripeLock&) = delete;
  StripeLock& operator=(const StripeLock&) = delete;

 private:
  std::atomic<bool>& flag_;
};

// Words up to this many bytes merge with a linear scan (cheaper than a heap when short).
constexpr std::size_t short_word_bytes = 32;

}  // namespace

BpeModel::BpeModel(const std::int32_t (&byte_ids)[256], const std::vector<Merge>& merges,
                   const std::vector<std::int32_t>& merged_ids, bool ignore_merges,
                   std::unordered_map<std::string, std::int32_t> word_ids)
    : ignore_merges_(ignore_merges),
      word_ids_(std::move(word_ids)),
      cache_(new CacheSlot[cache_slots]),
      cache_locks_(new std::atomic<bool>[cache_lock_count]) {
  for (std::size_t i = 0; i < cache_lock_count; ++i) cache_locks_[i].store(false);
  std::copy(std::begin(byte_ids), std::end(byte_ids), byte_ids_);
  XSERV_CHECK(merges.size() == merged_ids.size(), ErrorCode::internal,
              "BPE: merge tables differ in size");
  XSERV_CHECK(merges.size() < static_cast<std::size_t>(no_rank), ErrorCode::format,
              "BPE: too many merges");
  // Load factor at most 2/3: linear probes stay short while the table stays small enough to
  // sit mostly in the last-level cache (a probe is a likely cache miss; it is the hot path).
  std::size_t cap = 16;
  while (cap * 2 < merges.size() * 3) cap <<= 1;
  slots_.assign(cap, Slot{empty_key, 0, 0});
  mask_ = cap - 1;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    std::uint64_t key = pair_key(merges[i].left, merges[i].right);
    std::uint64_t h = mix(key) & mask_;
    while (slots_[h].key != empty_key && slots_[h].key != key) h = (h + 1) & mask_;
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
    if (s.key == empty_key) return nullptr;
    h = (h + 1) & mask_;
  }
}

// Repeatedly merges the adjacent pair of lowest rank, leftmost first: the same order as HF's
// heap, whose entries are (rank, position) and which pops the smallest.
void BpeModel::merge_short(std::vector<std::int32_t>& ids) const {
  std::int32_t ranks[short_word_bytes];
  std::int32_t merged[short_word_bytes];
  std::size_t n = ids.size();
  auto set_rank = [&](std::size_t i) {
    const Slot* s = find_pair(ids[i], ids[i + 1]);
    ranks[i] = s ? s->rank : no_rank;
    merged[i] = s ? s->merged : -1;
  };
  // The first lookups are independent: prefetch their slots so their cache misses overlap.
  for (std::size_t i = 0; i + 1 < n; ++i)
    __builtin_prefetch(&slots_[mix(pair_key(ids[i], ids[i + 1])) & mask_]);
  for (std::size_t i = 0; i + 1 < n; ++i) set_rank(i);
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == no_rank) break;
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
  // Scratch reused across calls on this thread: long words are common in CJK text (a run of
  // ideographs is one pre-token) and allocation would cost as much as the merging.
  struct Cand {
    std::int32_t rank, pos, merged;
  };
  struct Scratch {
    std::vector<std::int32_t> prev, next;
    std::vector<Cand> heap;
  };
  thread_local Scratch scratch;
  auto& prev = scratch.prev;
  auto& next = scratch.next;
  auto& heap = scratch.heap;
  prev.resize(static_cast<std::size_t>(n));
  next.resize(static_cast<std::size_t>(n));
  heap.clear();
  for (std::int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // Min-heap on (rank, pos): std::push_heap/pop_heap with "greater" ordering.
  auto after = [](const Cand& a, const Cand& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto push = [&](std::int32_t pos) {
    std::int32_t nx = next[pos];
    if (nx < 0) return;
    if (const Slot* s = find_pair(ids[pos], ids[nx])) {
      heap.push_back(Cand{s->rank, pos, s->merged});
      std::push_heap(heap.begin(), heap.end(), after);
    }
  };
  for (std::int32_t i = 0; i + 1 < n; ++i)
    __builtin_prefetch(&slots_[mix(pair_key(ids[i], ids[i + 1])) & mask_]);
  for (std::int32_t i = 0; i + 1 < n; ++i) {
    if (const Slot* s = find_pair(ids[i], ids[i + 1])) heap.push_back(Cand{s->rank, i, s->merged});
  }
  std::make_heap(heap.begin(), heap.end(), after);
  // A merged-away symbol is marked by prev == -2.
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    Cand c = heap.back();
    heap.pop_back();
    if (prev[c.pos] == -2) continue;
    std::int32_t nx = next[c.pos];
    if (nx < 0) continue;
    const Slot* s = find_pair(ids[c.pos], ids[nx]);
    if (!s || s->merged != c.merged) continue;  // stale: a neighbour changed
    ids[c.pos] = c.merged;
    prev[nx] = -2;
    next[c.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  std::size_t out = 0;
  for (std::int32_t i = 0; i >= 0; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

void BpeModel::encode_words(std::span<const std::string_view> words,
                            std::vector<std::int32_t>& out) const {
  // Cache slots are likely cache misses; prefetching a few words ahead overlaps them.
  constexpr std::size_t prefetch_ahead = 6;
  const std::size_t n = words.size();
  for (std::size_t i = 0; i < n && i < prefetch_ahead; ++i)
    __builtin_prefetch(&cache_[hash_word(words[i]) & (cache_slots - 1)]);
  for (std::size_t i = 0; i < n; ++i) {
    if (i + prefetch_ahead < n)
      __builtin_prefetch(&cache_[hash_word(words[i + prefetch_ahead]) & (cache_slots - 1)]);
    encode_word(words[i], out);
  }
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
  const std::uint64_t hash = hash_word(word);
  if (cache_lookup(hash, word, out)) return;
  std::vector<std::int32_t> ids;
  ids.reserve(word.size());
  for (char c : word) {
    std::int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) ids.push_back(id);
  }
  if (ids.size() <= short_word_bytes) {
    merge_short(ids);
  } else {
    merge_long(ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_store(hash, word, ids);
}

bool BpeModel::cache_lookup(std::uint64_t hash, std::string_view word,
                            std::vector<std::int32_t>& out) const {
  const std::size_t slot = hash & (cache_slots - 1);
  StripeLock lock(cache_locks_[slot % cache_lock_count]);
  const CacheSlot& s = cache_[slot];
  if (s.hash != hash || s.word != word) return false;
  out.insert(out.end(), s.ids.begin(), s.ids.end());
  return true;
}

void BpeModel::cache_store(std::uint64_t hash, std::string_view word,
                           const std::vector<std::int32_t>& ids) const {
  const std::size_t slot = hash & (cache_slots - 1);
  StripeLock lock(cache_locks_[slot % cache_lock_count]);
  CacheSlot& s = cache_[slot];
  s.hash = hash;
  s.word.assign(word);
  s.ids.assign(ids.begin(), ids.end());
}

std::size_t BpeModel::cache_size() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < cache_slots; ++i) {
    StripeLock lock(cache_locks_[i % cache_lock_count]);
    n += cache_[i].word.empty() ? 0 : 1;
  }
  return n;
}

}  // namespace xserv::tokenizer

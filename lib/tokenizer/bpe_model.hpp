// The BPE model of byte-level tokenizers: turns one pre-token (raw bytes) into token ids by
// applying the merges in rank order, exactly as Hugging Face `tokenizers` does.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xserv::tokenizer {

class BpeModel {
 public:
  struct Merge {
    std::int32_t left, right;  // token ids of the pair
  };

  // byte_ids[b]: the id of the one-byte token for byte b (-1 when the vocabulary has none: such
  // bytes are dropped, as HF does without an unk token). merges: in rank order (rank = index);
  // merged_ids[i]: the id of the concatenation of merges[i]. word_ids: raw bytes -> id of every
  // vocabulary token, used only with ignore_merges (a pre-token that is itself a token is taken
  // whole, as Llama 3 does).
  BpeModel(const std::int32_t (&byte_ids)[256], const std::vector<Merge>& merges,
           const std::vector<std::int32_t>& merged_ids, bool ignore_merges,
           std::unordered_map<std::string, std::int32_t> word_ids);
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-token. Thread-safe (the word cache is locked).
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;
  // The same for consecutive pre-tokens (prefetches their cache slots ahead).
  void encode_words(std::span<const std::string_view> words, std::vector<std::int32_t>& out) const;

  // Number of cached words (for tests).
  std::size_t cache_size() const;

 private:
  // Open-addressing map (left, right) -> (rank, merged id); merges are looked up once per
  // adjacent pair per merge step, so this is the hot table of encoding.
  struct Slot {
    std::uint64_t key;
    std::int32_t rank;
    std::int32_t merged;
  };
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};
  const Slot* find_pair(std::int32_t left, std::int32_t right) const noexcept;
  void merge_short(std::vector<std::int32_t>& ids) const;
  void merge_long(std::vector<std::int32_t>& ids) const;

  std::int32_t byte_ids_[256] = {};
  std::vector<Slot> slots_;
  std::uint64_t mask_ = 0;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, std::int32_t> word_ids_;

  // Cache of recent words (most pre-tokens of real text repeat): direct-mapped, a word lives in
  // the slot its hash picks and a newer word with the same slot replaces it, so the cache never
  // grows, never rehashes and keeps adapting to the traffic of a long-running server. Slots are
  // guarded by striped spin locks, held only to compare a key and copy a few ids.
  struct CacheSlot {
    std::uint64_t hash = 0;
    std::string word;
    std::vector<std::int32_t> ids;
  };
  static constexpr std::size_t cache_slots = 1 << 16;
  static constexpr std::size_t cache_lock_count = 256;
  bool cache_lookup(std::uint64_t hash, std::string_view word,
                    std::vector<std::int32_t>& out) const;
  void cache_store(std::uint64_t hash, std::string_view word,
                   const std::vector<std::int32_t>& ids) const;
  mutable std::unique_ptr<CacheSlot[]> cache_;
  mutable std::unique_ptr<std::atomic<bool>[]> cache_locks_;
};

}  // namespace xserv::tokenizer

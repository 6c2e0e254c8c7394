#include "engine/scheduler.hpp"

#include <algorithm>
#include <span>

#include "core/error.hpp"

namespace xserv {

bool SchedulerOutput::decode_only() const noexcept {
  if (chunks.empty()) return false;
  for (const auto& c : chunks)
    if (c.num_tokens != 1 || !c.sample) return false;
  return true;
}

Scheduler::Scheduler(kv::BlockPool& pool, const SchedulerConfig& config)
    : pool_(pool), config_(config) {
  XSERV_CHECK(config.max_seqs > 0 && config.max_batch_tokens > 0, ErrorCode::invalid_argument,
              "scheduler: max_seqs {} and max_batch_tokens {} must be positive", config.max_seqs,
              config.max_batch_tokens);
}

std::int32_t Scheduler::blocks_for(std::int32_t tokens) const noexcept {
  return (tokens + pool_.block_size() - 1) / pool_.block_size();
}

bool Scheduler::can_never_fit(const Sequence& s) const noexcept {
  return blocks_for(s.num_tokens() + 1) > pool_.num_blocks() - 1;
}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::waiting;
  waiting_.push_back(seq);
}

void Scheduler::release_blocks(Sequence& s) noexcept {
  // Last block first: the free queue then reuses a sequence's tail before its head, and heads
  // (shared prompts) stay cached longest.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) {
    try {
      pool_.release(*it);
    } catch (const Error&) {
      // A table only holds references it took from this pool.
    }
  }
  s.blocks.clear();
  s.block_hashes.clear();
  s.num_computed = 0;
}

void Scheduler::remove(Sequence* seq) {
  if (seq->status == SeqStatus::running) {
    running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  } else if (seq->status == SeqStatus::waiting) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  }
  release_blocks(*seq);
  seq->status = SeqStatus::finished;
}

void Scheduler::preempt(Sequence& s, SchedulerOutput& out) {
  running_.erase(std::remove(running_.begin(), running_.end(), &s), running_.end());
  release_blocks(s);
  s.status = SeqStatus::waiting;
  waiting_.push_front(&s);  // preempted in newest-first order: the oldest ends up in front
  out.preempted.push_back(&s);
  ++preemptions_;
}

void Scheduler::fail(Sequence& s, SchedulerOutput& out) {
  s.error = fmt::format(
      "the request needs {} KV blocks of {} tokens for its {} tokens and the next one, but the "
      "whole pool holds {}",
      blocks_for(s.num_tokens() + 1), pool_.block_size(), s.num_tokens(), pool_.num_blocks() - 1);
  release_blocks(s);
  s.status = SeqStatus::finished;
  out.failed.push_back(&s);
}

bool Scheduler::grow_running(Sequence& s, std::int32_t tokens, SchedulerOutput& out) {
  while (static_cast<std::int32_t>(s.blocks.size()) < blocks_for(tokens)) {
    if (pool_.num_free() > 0) {
      s.blocks.push_back(pool_.allocate());
      continue;
    }
    Sequence* victim = running_.back();  // the newest
    preempt(*victim, out);
    if (victim == &s) return false;
  }
  return true;
}

void Scheduler::take_cached_prefix(Sequence& s) {
  const std::int32_t bs = pool_.block_size();
  // Full blocks before the last token: the last token is always computed again.
  const std::int32_t usable = (s.num_tokens() - 1) / bs;
  const Sequence* leader = s.leader;
  if (leader && leader->status == SeqStatus::running && leader->num_computed >= s.prompt_len) {
    // Sample i > 0: the leader's prompt blocks hold the same prompt's K/V.
    const std::int32_t shared = std::min<std::int32_t>(
        {usable, (s.prompt_len - 1) / bs, static_cast<std::int32_t>(leader->blocks.size())});
    for (std::int32_t i = 0; i < shared; ++i) {
      const std::int32_t b = leader->blocks[static_cast<std::size_t>(i)];
      pool_.ref(b);
      s.blocks.push_back(b);
    }
    s.num_computed = shared * bs;
  }
  std::uint64_t parent = kv::BlockPool::root_hash;
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(s.blocks.size()); ++i) {
    // Hashes of the shared blocks, so that update() commits from the right parent.
    parent = kv::BlockPool::hash_block(
        parent, std::span<const std::int32_t>(s.tokens).subspan(static_cast<std::size_t>(i * bs),
                                                                 static_cast<std::size_t>(bs)));
    s.block_hashes.push_back(parent);
  }
  for (std::int32_t i = static_cast<std::int32_t>(s.blocks.size()); i < usable; ++i) {
    const auto tokens = std::span<const std::int32_t>(s.tokens).subspan(
        static_cast<std::size_t>(i * bs), static_cast<std::size_t>(bs));
    const std::uint64_t h = kv::BlockPool::hash_block(parent, tokens);
    const std::int32_t b = pool_.lookup(h, tokens);
    if (b < 0) break;
    s.blocks.push_back(b);
    s.block_hashes.push_back(h);
    parent = h;
    s.num_computed = (i + 1) * bs;
  }
}

std::int32_t Scheduler::chunk_size(const Sequence& s, std::int32_t budget,
                                   std::int32_t prefill_left) {
  const std::int32_t n = std::min(s.pending(), budget);
  return n > 1 ? std::min(n, prefill_left) : n;  // a single token (a decode) is never capped
}

bool Scheduler::admit(Sequence& s, std::int32_t budget, std::int32_t prefill_left,
                      ScheduledChunk& chunk) {
  take_cached_prefix(s);
  const std::int32_t n = chunk_size(s, budget, prefill_left);
  if (n <= 0) {
    release_blocks(s);
    return false;
  }
  const std::int32_t need = blocks_for(s.num_computed + n) - static_cast<std::int32_t>(s.blocks.size());
  if (need > pool_.num_free()) {
    release_blocks(s);  // the hits stay cached; they are found again next time
    return false;
  }
  for (std::int32_t i = 0; i < need; ++i) s.blocks.push_back(pool_.allocate());
  chunk = ScheduledChunk{&s, s.num_computed, n, s.num_computed + n == s.num_tokens()};
  return true;
}

bool Scheduler::next_is_plain_decode() const noexcept {
  if (!waiting_.empty() || running_.empty() || num_running() > config_.max_batch_tokens) return false;
  std::int32_t need = 0;
  for (const Sequence* s : running_) {
    if (s->pending() != 1) return false;
    need += std::max(0, blocks_for(s->num_computed + 1) - static_cast<std::int32_t>(s->blocks.size()));
  }
  return need <= pool_.num_free();
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  std::int32_t budget = config_.max_batch_tokens;
  std::int32_t prefill_left =
      config_.max_prefill_tokens > 0 ? config_.max_prefill_tokens : config_.max_batch_tokens;

  // 1. Running sequences, oldest first. A preemption takes the newest (the back), which this
  //    loop has not reached yet, or the current sequence itself.
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const std::int32_t n = chunk_size(s, budget, prefill_left);
    if (n <= 0) {
      ++i;  // its prompt chunk waits for the next step's prefill budget
      continue;
    }
    if (!grow_running(s, s.num_computed + n, out)) break;  // s was the newest: preempted
    out.chunks.push_back({&s, s.num_computed, n, s.num_computed + n == s.num_tokens()});
    budget -= n;
    if (n > 1) prefill_left -= n;
    ++i;
  }

  // 2. Waiting sequences, first come first served (a sample waiting for its leader's prompt is
  //    stepped over), unless this step had to preempt.
  if (out.preempted.empty()) {
    for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 &&
                                     num_running() < config_.max_seqs;) {
      Sequence& s = **it;
      if (can_never_fit(s)) {
        it = waiting_.erase(it);
        fail(s, out);
        continue;
      }
      if (s.leader && s.leader->status != SeqStatus::finished &&
          !(s.leader->status == SeqStatus::running && s.leader->num_computed >= s.prompt_len)) {
        ++it;  // the leader's prompt is not computed yet: share it once it is
        continue;
      }
      ScheduledChunk chunk;
      // No blocks (or no prefill budget) now: keep the order, try next step.
      if (!admit(s, budget, prefill_left, chunk)) break;
      it = waiting_.erase(it);
      if (!s.admitted_once) {
        s.cached_tokens = std::min(s.num_computed, s.prompt_len);
        s.admitted_once = true;
      }
      out.num_cached_tokens += s.num_computed;
      s.status = SeqStatus::running;
      running_.insert(std::upper_bound(running_.begin(), running_.end(), &s,
                                       [](const Sequence* a, const Sequence* b) {
                                         return a->arrival < b->arrival;
                                       }),
                      &s);
      out.chunks.push_back(chunk);
      budget -= chunk.num_tokens;
      if (chunk.num_tokens > 1) prefill_left -= chunk.num_tokens;
    }
  }

  for (const auto& c : out.chunks) {
    out.num_tokens += c.num_tokens;
    out.num_prompt_tokens += std::max(0, std::min(c.start + c.num_tokens, c.seq->prompt_len) - c.start);
  }
  return out;
}

void Scheduler::update(const SchedulerOutput& out) {
  const std::int32_t bs = pool_.block_size();
  for (const auto& c : out.chunks) {
    Sequence& s = *c.seq;
    if (s.status != SeqStatus::running) continue;
    s.num_computed = c.start + c.num_tokens;
    // Blocks that just became full (and whose tokens are now fixed) enter the prefix cache.
    while (static_cast<std::int32_t>(s.block_hashes.size() + 1) * bs <= s.num_computed) {
      const std::size_t i = s.block_hashes.size();
      const auto tokens = std::span<const std::int32_t>(s.tokens).subspan(
          i * static_cast<std::size_t>(bs), static_cast<std::size_t>(bs));
      const std::uint64_t parent = i == 0 ? kv::BlockPool::root_hash : s.block_hashes.back();
      const std::uint64_t h = kv::BlockPool::hash_block(parent, tokens);
      pool_.commit(s.blocks[i], h, tokens);
      s.block_hashes.push_back(h);
    }
  }
}

}  // namespace xserv

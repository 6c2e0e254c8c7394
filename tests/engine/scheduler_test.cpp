// Scheduler on plain data: no model, no backend. A "step" here is schedule(), update(), then one
// appended token per sampling chunk, as the engine does.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "engine/scheduler.hpp"

using namespace xserv;

namespace {

struct Harness {
  kv::BlockPool pool;
  Scheduler sched;
  std::deque<Sequence> seqs;  // stable addresses
  std::uint64_t next_arrival = 0;

  Harness(std::int32_t blocks, std::int32_t block_size, std::int32_t budget,
          std::int32_t max_seqs = 16)
      : pool(blocks, block_size), sched(pool, {max_seqs, budget}) {}

  Sequence& add(std::int32_t prompt_len, std::int32_t first_token = 1, std::int32_t max_new = 100) {
    Sequence& s = seqs.emplace_back();
    s.request = seqs.size();
    s.arrival = next_arrival++;
    for (std::int32_t i = 0; i < prompt_len; ++i) s.tokens.push_back(first_token + i);
    s.prompt_len = prompt_len;
    s.max_len = prompt_len + max_new;
    sched.add(&s);
    return s;
  }

  // One step; sampled tokens are 1000 + position (deterministic, like seeded sampling).
  SchedulerOutput step() {
    SchedulerOutput out = sched.schedule();
    sched.update(out);
    for (const auto& c : out.chunks)
      if (c.sample) c.seq->tokens.push_back(1000 + c.seq->num_tokens());
    return out;
  }

  std::int32_t used_blocks() const { return pool.num_used(); }
};

const ScheduledChunk* find(const SchedulerOutput& out, const Sequence& s) {
  for (const auto& c : out.chunks)
    if (c.seq == &s) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("Scheduler: chunked prefill under the token budget, decodes first", "[engine]") {
  Harness h(64, 4, 8);
  Sequence& a = h.add(3);
  Sequence& b = h.add(13);
  auto out = h.step();
  REQUIRE(out.chunks.size() == 2);
  CHECK(find(out, a)->num_tokens == 3);
  CHECK(find(out, a)->sample);
  CHECK(find(out, b)->num_tokens == 5);  // the rest of the budget
  CHECK_FALSE(find(out, b)->sample);
  CHECK(out.num_tokens == 8);
  CHECK(out.num_prompt_tokens == 8);
  CHECK(b.num_computed == 5);
  CHECK(b.blocks.size() == 2);  // blocks only for what is computed, not the whole run

  out = h.step();  // a decodes (1), b gets 7 more of its prompt
  CHECK(find(out, a)->num_tokens == 1);
  CHECK(find(out, b)->num_tokens == 7);
  CHECK(find(out, b)->start == 5);
  out = h.step();
  CHECK(find(out, b)->num_tokens == 1);  // the last prompt token: it samples
  CHECK(find(out, b)->sample);
  out = h.step();
  CHECK(out.decode_only());
  CHECK(out.num_tokens == 2);
  CHECK(out.num_prompt_tokens == 0);
}

TEST_CASE("Scheduler: max_seqs caps the batch, the rest wait in order", "[engine]") {
  Harness h(64, 4, 64, 2);
  Sequence& a = h.add(2);
  Sequence& b = h.add(2);
  Sequence& c = h.add(2);
  auto out = h.step();
  CHECK(out.chunks.size() == 2);
  CHECK(find(out, c) == nullptr);
  CHECK(h.sched.num_waiting() == 1);
  h.sched.remove(&a);
  out = h.step();
  CHECK(find(out, c) != nullptr);
  CHECK(find(out, b) != nullptr);
}

TEST_CASE("Scheduler: preemption of the newest when blocks run out, and resume", "[engine]") {
  // 6 usable blocks of 2 tokens: two sequences of 4 prompt tokens fit, then grow past the pool.
  Harness h(7, 2, 64);
  Sequence& old = h.add(4, 1);
  Sequence& young = h.add(4, 50);
  h.step();
  CHECK(h.used_blocks() == 4);
  // Each decode step adds a token; a new block every 2 tokens.
  std::vector<std::int32_t> young_tokens_at_preemption;
  bool preempted = false;
  for (int i = 0; i < 6 && !preempted; ++i) {
    auto out = h.step();
    if (!out.preempted.empty()) {
      preempted = true;
      REQUIRE(out.preempted.size() == 1);
      CHECK(out.preempted[0] == &young);  // the newest goes
      CHECK(young.status == SeqStatus::waiting);
      CHECK(young.blocks.empty());
      CHECK(young.num_computed == 0);
      CHECK(find(out, young) == nullptr);
      CHECK(find(out, old) != nullptr);
      young_tokens_at_preemption = young.tokens;
    }
  }
  REQUIRE(preempted);
  CHECK(h.sched.preemptions() == 1);
  // The old one runs alone until it ends; then the young one is recomputed: its whole context
  // (prompt and generated tokens) in one chunk, and it samples the next token.
  h.sched.remove(&old);
  auto out = h.step();
  const auto* c = find(out, young);
  REQUIRE(c != nullptr);
  CHECK(c->start + c->num_tokens == static_cast<std::int32_t>(young_tokens_at_preemption.size()));
  CHECK(c->sample);
  CHECK(young.tokens.size() == young_tokens_at_preemption.size() + 1);
}

TEST_CASE("Scheduler: remove frees the blocks of a running or waiting sequence", "[engine]") {
  Harness h(16, 4, 64);
  Sequence& a = h.add(10);
  Sequence& b = h.add(5);
  h.step();
  CHECK(h.used_blocks() == 3 + 2);
  h.sched.remove(&a);
  CHECK(a.status == SeqStatus::finished);
  CHECK(a.blocks.empty());
  CHECK(h.used_blocks() == 2);
  h.sched.remove(&b);
  CHECK(h.used_blocks() == 0);
  Sequence& w = h.add(3);
  h.sched.remove(&w);  // never ran
  CHECK(h.sched.num_waiting() == 0);
  CHECK(h.sched.schedule().empty());
}

TEST_CASE("Scheduler: a sequence that can never fit fails alone", "[engine]") {
  Harness h(5, 4, 64);  // 4 usable blocks: 16 tokens
  Sequence& big = h.add(16);  // 16 + 1 tokens need 5 blocks
  Sequence& small = h.add(3);
  auto out = h.step();
  REQUIRE(out.failed.size() == 1);
  CHECK(out.failed[0] == &big);
  CHECK(big.status == SeqStatus::finished);
  CHECK_THAT(big.error, Catch::Contains("5 KV blocks") && Catch::Contains("holds 4"));
  CHECK(find(out, small) != nullptr);
  CHECK(h.used_blocks() == 1);
}

TEST_CASE("Scheduler: prefix-cache hits at admission, the last token recomputed", "[engine]") {
  Harness h(32, 4, 64);
  Sequence& a = h.add(10, 7);
  h.step();
  h.sched.remove(&a);  // its 2 full prompt blocks stay cached
  Sequence& b = h.add(10, 7);  // the same prompt
  auto out = h.step();
  const auto* c = find(out, b);
  REQUIRE(c != nullptr);
  CHECK(c->start == 8);
  CHECK(c->num_tokens == 2);
  CHECK(b.cached_tokens == 8);
  CHECK(out.num_cached_tokens == 8);
  CHECK(h.pool.hits() == 2);

  // A prompt of exactly two blocks: the second block holds the last token, so only one hits.
  Sequence& d = h.add(8, 7);
  out = h.step();
  CHECK(find(out, d)->start == 4);
  // Another prompt shares nothing.
  Sequence& e = h.add(8, 500);
  out = h.step();
  CHECK(find(out, e)->start == 0);
}

TEST_CASE("Scheduler: sample i > 0 shares the leader's prompt blocks", "[engine]") {
  kv::BlockPool pool(32, 4, /*prefix_cache=*/false);
  Scheduler sched(pool, {16, 64});
  std::deque<Sequence> seqs(3);
  for (std::int32_t i = 0; i < 3; ++i) {
    Sequence& s = seqs[static_cast<std::size_t>(i)];
    s.request = 1;
    s.index = i;
    s.arrival = 0;
    s.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    s.prompt_len = 9;
    s.max_len = 20;
    if (i > 0) s.leader = &seqs[0];
    sched.add(&s);
  }
  auto out = sched.schedule();
  REQUIRE(out.chunks.size() == 1);  // the others wait for the leader's prompt
  CHECK(out.chunks[0].seq == &seqs[0]);
  sched.update(out);
  seqs[0].tokens.push_back(100);
  out = sched.schedule();
  REQUIRE(out.chunks.size() == 3);
  for (std::size_t i = 1; i < 3; ++i) {
    CHECK(seqs[i].blocks[0] == seqs[0].blocks[0]);
    CHECK(seqs[i].blocks[1] == seqs[0].blocks[1]);
    CHECK(seqs[i].blocks[2] != seqs[0].blocks[2]);  // the last prompt token's block is its own
    CHECK(out.chunks[i].start == 8);
  }
  CHECK(pool.ref_count(seqs[0].blocks[0]) == 3);
  for (auto& s : seqs) sched.remove(&s);
  CHECK(pool.num_used() == 0);
}

TEST_CASE("Scheduler: max_prefill_tokens caps prompt chunks, decodes still run", "[engine]") {
  kv::BlockPool pool(64, 4);
  Scheduler sched(pool, {16, 64, 6});
  std::deque<Sequence> seqs(3);
  auto add = [&](Sequence& s, std::int32_t n, std::uint64_t arrival) {
    for (std::int32_t i = 0; i < n; ++i) s.tokens.push_back(10 * static_cast<std::int32_t>(arrival) + i);
    s.prompt_len = n;
    s.max_len = n + 50;
    s.arrival = arrival;
    sched.add(&s);
  };
  add(seqs[0], 1, 0);   // a one-token prompt: never capped
  add(seqs[1], 10, 1);  // 10 prompt tokens: 6 this step, 4 the next
  add(seqs[2], 3, 2);   // waits: the prefill budget is spent
  auto step = [&] {
    auto out = sched.schedule();
    sched.update(out);
    for (const auto& c : out.chunks)
      if (c.sample) c.seq->tokens.push_back(7);
    return out;
  };
  auto out = step();
  REQUIRE(out.chunks.size() == 2);
  CHECK(out.chunks[0].num_tokens == 1);
  CHECK(out.chunks[1].num_tokens == 6);
  out = step();
  REQUIRE(out.chunks.size() == 3);  // a decode, the rest of seqs[1], then seqs[2] (4 + 3 > 6: 2)
  CHECK(out.chunks[0].num_tokens == 1);
  CHECK(out.chunks[1].num_tokens == 4);
  CHECK(out.chunks[2].num_tokens == 2);
  for (auto& s : seqs) sched.remove(&s);
}

/* The engine's C API as a C host sees it: defaults, NULLs and bad requests, callbacks and the
 * poll queue, n > 1, logprobs, cancel, an impossible request, stats, the background thread, the
 * growing-structs rule, and xserv_generate's final event when nothing is generated.
 * C99, run under ASan/LSan in CI. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xserv.h"

#include "c_check.h"

#define CHECK_STATUS(call, want)                                                            \
  do {                                                                                      \
    xserv_status got_ = (call);                                                             \
    ++g_checks;                                                                             \
    if (got_ != (want)) {                                                                   \
      ++g_failures;                                                                         \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s; last error: '%s'\n", __FILE__,  \
              __LINE__, #call, xserv_status_string(got_), xserv_status_string(want),        \
              xserv_last_error());                                                          \
    }                                                                                       \
  } while (0)

static const char* const kModel = XSERV_SOURCE_DIR "/examples/models/shakespeare";

/* What one (request, sample) produced. */
typedef struct Stream {
  xserv_request_id id;
  int index;
  char text[4096];
  size_t len;
  int tokens[256];
  int n_tokens;
  xserv_finish_reason finish;
  xserv_status status;
  int events;
  int with_logprobs;
  int completion_tokens;
} Stream;

#define MAX_STREAMS 16
static Stream g_streams[MAX_STREAMS];
static int g_n_streams = 0;

static Stream* stream_of(xserv_request_id id, int index) {
  int i;
  for (i = 0; i < g_n_streams; ++i)
    if (g_streams[i].id == id && g_streams[i].index == index) return &g_streams[i];
  if (g_n_streams == MAX_STREAMS) return NULL;
  memset(&g_streams[g_n_streams], 0, sizeof g_streams[0]);
  g_streams[g_n_streams].id = id;
  g_streams[g_n_streams].index = index;
  return &g_streams[g_n_streams++];
}

static void record(const xserv_event* e) {
  Stream* s = stream_of(e->request, e->index);
  size_t k;
  if (s == NULL) return;
  ++s->events;
  CHECK(e->text != NULL && strlen(e->text) == e->text_len);
  CHECK(e->error != NULL);
  if (s->len + e->text_len < sizeof s->text) {
    memcpy(s->text + s->len, e->text, e->text_len);
    s->len += e->text_len;
    s->text[s->len] = '\0';
  }
  if (e->type == XSERV_EVENT_TOKEN && s->n_tokens < 256) s->tokens[s->n_tokens++] = e->token;
  if (e->n_top_logprobs > 0) {
    ++s->with_logprobs;
    CHECK(e->top_logprobs != NULL);
    CHECK(e->logprob <= 0.0f);
    for (k = 1; k < e->n_top_logprobs; ++k)
      CHECK(e->top_logprobs[k].logprob <= e->top_logprobs[k - 1].logprob);
  }
  if (e->finish != XSERV_FINISH_NONE) {
    s->finish = e->finish;
    s->status = e->status;
    s->completion_tokens = e->completion_tokens;
    CHECK(e->prompt_tokens > 0);
  }
}

static void on_event(const xserv_event* e, void* user_data) {
  CHECK(user_data == (void*)&g_streams);
  record(e);
}

static void drain(xserv_engine* engine) {
  xserv_event e;
  bool got = false;
  while (xserv_engine_poll(engine, &e, &got) == XSERV_OK && got) record(&e);
}

static void run(xserv_engine* engine) {
  int guard = 0;
  while (xserv_engine_has_work(engine) && guard++ < 100000) {
    size_t n = 0;
    CHECK_STATUS(xserv_engine_step(engine, &n), XSERV_OK);
    drain(engine);
  }
  drain(engine);
}

static void test_defaults_and_nulls(xserv_model* model) {
  xserv_engine_params ep = xserv_engine_default_params();
  xserv_request r;
  xserv_engine* engine = (xserv_engine*)&ep; /* must be reset to NULL on failure */
  xserv_request_id id = 7;
  xserv_event e;
  bool got = true;
  xserv_engine_stats st;
  xserv_model_params mp = xserv_model_default_params();
  xserv_generate_params gp = xserv_generate_default_params();
  CHECK(ep.struct_size == sizeof ep && mp.struct_size == sizeof mp && gp.struct_size == sizeof gp);
  CHECK(ep.max_seqs == 256 && ep.block_size == 16 && ep.prefix_cache && !ep.background_thread);
  CHECK(ep.gpu_memory_fraction > 0.89f && ep.gpu_memory_fraction < 0.91f);
  xserv_request_init(&r);
  CHECK(r.struct_size == sizeof r && r.n == 1 && r.logprobs == 0 && r.prompt == NULL);
  xserv_request_init(NULL);

  CHECK_STATUS(xserv_engine_create(NULL, &ep, &engine), XSERV_ERR_INVALID_ARGUMENT);
  CHECK(engine == NULL);
  CHECK_STATUS(xserv_engine_create(model, &ep, NULL), XSERV_ERR_INVALID_ARGUMENT);
  CHECK(ep.max_prefill_tokens == 0 && ep.async_steps == -1);
  ep.async_steps = 2;
  CHECK_STATUS(xserv_engine_create(model, &ep, &engine), XSERV_ERR_INVALID_ARGUMENT);
  CHECK(engine == NULL);
  ep = xserv_engine_default_params();
  ep.block_size = 0;
  CHECK_STATUS(xserv_engine_create(model, &ep, &engine), XSERV_ERR_INVALID_ARGUMENT);
  ep = xserv_engine_default_params();
  ep.max_prefill_tokens = -1;
  CHECK_STATUS(xserv_engine_create(model, &ep, &engine), XSERV_ERR_INVALID_ARGUMENT);
  ep = xserv_engine_default_params();
  ep.struct_size = 0;
  CHECK_STATUS(xserv_engine_create(model, &ep, &engine), XSERV_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(xserv_engine_submit(NULL, &r, &id), XSERV_ERR_INVALID_ARGUMENT);
  CHECK(id == 0);
  CHECK_STATUS(xserv_engine_cancel(NULL, 1), XSERV_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(xserv_engine_step(NULL, NULL), XSERV_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(xserv_engine_poll(NULL, &e, &got), XSERV_ERR_INVALID_ARGUMENT);
  CHECK(!got);
  CHECK(!xserv_engine_has_work(NULL));
  st.struct_size = sizeof st;
  CHECK_STATUS(xserv_engine_get_stats(NULL, &st), XSERV_ERR_INVALID_ARGUMENT);
  xserv_engine_free(NULL);
}

/* Run with async_steps 0 and 1 (on the CPU the default is off): the overlapped steps give the
 * same texts, cancel, n > 1 and logprobs (those steps fall back to the synchronous step). */
static void test_requests(xserv_model* model, int32_t async_steps) {
  xserv_engine_params ep = xserv_engine_default_params();
  xserv_engine* engine = NULL;
  xserv_generate_params gp = xserv_generate_default_params();
  xserv_request r;
  xserv_request_id greedy_id = 0, sampled_id = 0, polled_id = 0, cancel_id = 0, bad = 0;
  int32_t ids[16];
  size_t n_ids = 0;
  xserv_chat_message msg = {"user", "hi"};
  xserv_engine_stats st;
  char* alone = NULL;
  const char* invalid_utf8 = "\xff\xfe";
  int i;

  g_n_streams = 0; /* request ids start again in a new engine */
  ep.kv_cache_tokens = 4096;
  ep.max_prefill_tokens = 8; /* prompts in chunks of 8 beside the decodes: same ids */
  ep.async_steps = async_steps;
  CHECK_STATUS(xserv_engine_create(model, &ep, &engine), XSERV_OK);
  if (engine == NULL) return;

  gp.max_tokens = 24;
  gp.temperature = 0.0f;
  gp.ignore_eos = true;
  CHECK_STATUS(xserv_generate(model, "ROMEO:", &gp, NULL, NULL, &alone), XSERV_OK);

  /* Greedy with a callback; equals xserv_generate's text. */
  xserv_request_init(&r);
  r.prompt = "ROMEO:";
  r.params = &gp;
  r.on_event = on_event;
  r.user_data = &g_streams;
  CHECK_STATUS(xserv_engine_submit(engine, &r, &greedy_id), XSERV_OK);
  CHECK(greedy_id != 0);

  /* Two seeded samples with logprobs, from token ids, events to the poll queue. */
  CHECK_STATUS(xserv_tokenize(model, "JULIET:", false, ids, 16, &n_ids), XSERV_OK);
  {
    xserv_generate_params sp = xserv_generate_default_params();
    sp.max_tokens = 10;
    sp.seed = 5;
    sp.ignore_eos = true;
    xserv_request_init(&r);
    r.prompt_tokens = ids;
    r.n_prompt_tokens = n_ids;
    r.params = &sp;
    r.n = 2;
    r.logprobs = 3;
    CHECK_STATUS(xserv_engine_submit(engine, &r, &sampled_id), XSERV_OK);
  }
  /* A polled one that is cancelled mid-run. */
  {
    xserv_generate_params cp = xserv_generate_default_params();
    cp.max_tokens = 100;
    cp.seed = 1;
    cp.ignore_eos = true;
    xserv_request_init(&r);
    r.prompt = "KING:";
    r.params = &cp;
    CHECK_STATUS(xserv_engine_submit(engine, &r, &cancel_id), XSERV_OK);
  }
  /* A truncated struct (an older host): fields past struct_size take their defaults. */
  xserv_request_init(&r);
  r.prompt = "HAMLET:";
  r.params = &gp;
  r.n = 3;                        /* past the truncated size: ignored, n stays 1 */
  r.struct_size = offsetof(xserv_request, n);
  CHECK_STATUS(xserv_engine_submit(engine, &r, &polled_id), XSERV_OK);

  /* Bad requests fail at submit with INVALID_ARGUMENT (or UNSUPPORTED), nothing queued. */
  xserv_request_init(&r);
  CHECK_STATUS(xserv_engine_submit(engine, &r, &bad), XSERV_ERR_INVALID_ARGUMENT); /* no prompt */
  r.prompt = "a";
  r.prompt_tokens = ids;
  r.n_prompt_tokens = 1;
  CHECK_STATUS(xserv_engine_submit(engine, &r, &bad), XSERV_ERR_INVALID_ARGUMENT); /* two */
  xserv_request_init(&r);
  r.prompt = invalid_utf8;
  CHECK_STATUS(xserv_engine_submit(engine, &r, &bad), XSERV_ERR_INVALID_ARGUMENT);
  r.prompt = "a";
  r.logprobs = 21;
  CHECK_STATUS(xserv_engine_submit(engine, &r, &bad), XSERV_ERR_INVALID_ARGUMENT);
  r.logprobs = 0;
  r.n = 0;
  CHECK_STATUS(xserv_engine_submit(engine, &r, &bad), XSERV_ERR_INVALID_ARGUMENT);
  xserv_request_init(&r);
  r.messages = &msg;
  r.n_messages = 1;
  CHECK_STATUS(xserv_engine_submit(engine, &r, &bad), XSERV_ERR_UNSUPPORTED); /* no template */
  CHECK(bad == 0);

  for (i = 0; i < 4; ++i) {
    CHECK_STATUS(xserv_engine_step(engine, NULL), XSERV_OK);
    drain(engine);
  }
  CHECK_STATUS(xserv_engine_cancel(engine, cancel_id), XSERV_OK);
  CHECK_STATUS(xserv_engine_cancel(engine, 999999), XSERV_OK); /* unknown: ignored */
  run(engine);

  {
    Stream* g = stream_of(greedy_id, 0);
    Stream* s0 = stream_of(sampled_id, 0);
    Stream* s1 = stream_of(sampled_id, 1);
    Stream* c = stream_of(cancel_id, 0);
    Stream* p = stream_of(polled_id, 0);
    CHECK(alone != NULL && strcmp(g->text, alone) == 0);
    CHECK(g->n_tokens == 24 && g->finish == XSERV_FINISH_LENGTH && g->completion_tokens == 24);
    CHECK(s0->n_tokens == 10 && s1->n_tokens == 10);
    CHECK(s0->with_logprobs == 10 && s1->with_logprobs == 10);
    CHECK(memcmp(s0->tokens, s1->tokens, sizeof s0->tokens) != 0); /* seeds 5 and 6 */
    CHECK(c->finish == XSERV_FINISH_CANCELLED && c->n_tokens >= 3 && c->n_tokens < 100);
    CHECK(p->finish == XSERV_FINISH_LENGTH && p->n_tokens == 24);
    CHECK(stream_of(polled_id, 1)->events == 0); /* n = 3 was past struct_size */
  }
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK_STATUS(xserv_engine_get_stats(engine, &st), XSERV_OK);
  CHECK(st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0);
  CHECK(st.kv_blocks_total == 4096 / 16 && st.block_size == 16);
  CHECK(st.steps > 0 && st.generated_tokens >= 24 + 20 + 24);
  CHECK(!xserv_engine_has_work(engine));
  xserv_string_free(alone);
  xserv_engine_free(engine);
}

static void test_impossible_and_background(xserv_model* model) {
  xserv_engine_params ep = xserv_engine_default_params();
  xserv_engine* engine = NULL;
  xserv_request r;
  xserv_request_id big = 0, small = 0;
  xserv_generate_params gp = xserv_generate_default_params();
  char prompt[1024];
  int i;
  const time_t start = time(NULL);
  gp.max_tokens = 4;
  gp.temperature = 0.0f;
  gp.ignore_eos = true;
  for (i = 0; i < 60; ++i) memcpy(prompt + 4 * i, "la, ", 4); /* ~120 tokens: fits the context */
  prompt[240] = '\0';

  g_n_streams = 0; /* request ids start again at 1 in a new engine */
  ep.kv_cache_tokens = 64;
  ep.block_size = 16;
  ep.background_thread = true;
  CHECK_STATUS(xserv_engine_create(model, &ep, &engine), XSERV_OK);
  if (engine == NULL) return;
  CHECK_STATUS(xserv_engine_step(engine, NULL), XSERV_ERR_INVALID_ARGUMENT);
  xserv_request_init(&r);
  r.prompt = prompt; /* more than the 64 tokens of KV */
  r.params = &gp;
  CHECK_STATUS(xserv_engine_submit(engine, &r, &big), XSERV_OK);
  r.prompt = "ROMEO:";
  CHECK_STATUS(xserv_engine_submit(engine, &r, &small), XSERV_OK);
  /* The engine thread steps; this one polls (a busy wait, bounded by two minutes). */
  while ((stream_of(big, 0)->finish == XSERV_FINISH_NONE ||
          stream_of(small, 0)->finish == XSERV_FINISH_NONE) && time(NULL) - start < 120)
    drain(engine);
  CHECK(stream_of(big, 0)->finish == XSERV_FINISH_ERROR);
  CHECK(stream_of(big, 0)->status == XSERV_ERR_RESOURCE_EXHAUSTED);
  CHECK(stream_of(small, 0)->finish == XSERV_FINISH_LENGTH);
  CHECK(stream_of(small, 0)->n_tokens == 4);
  xserv_engine_free(engine);
}

static int g_final_events = 0;
static int g_last_token = 0;
static xserv_finish_reason g_last_finish = XSERV_FINISH_NONE;
static bool on_token(const xserv_token_event* e, void* user_data) {
  (void)user_data;
  ++g_final_events;
  g_last_token = e->token;
  g_last_finish = e->finish;
  return true;
}

static void test_generate_nothing(xserv_model* model) {
  xserv_generate_params gp = xserv_generate_default_params();
  char* text = NULL;
  gp.max_tokens = 0;
  CHECK_STATUS(xserv_generate(model, "ROMEO:", &gp, on_token, NULL, &text), XSERV_OK);
  CHECK(g_final_events == 1);
  CHECK(g_last_token == -1);
  CHECK(g_last_finish == XSERV_FINISH_LENGTH);
  CHECK(text != NULL && text[0] == '\0');
  xserv_string_free(text);
  gp.struct_size = 3;
  CHECK_STATUS(xserv_generate(model, "ROMEO:", &gp, NULL, NULL, NULL), XSERV_ERR_INVALID_ARGUMENT);
}

int main(void) {
  xserv_model* model = NULL;
  xserv_model_params mp = xserv_model_default_params();
  mp.device = XSERV_DEVICE_CPU;
  mp.n_threads = 2;
  if (xserv_model_load(kModel, &mp, &model) != XSERV_OK) {
    fprintf(stderr, "cannot load %s: %s\n", kModel, xserv_last_error());
    return 1;
  }
  test_defaults_and_nulls(model);
  test_requests(model, 0);
  test_requests(model, 1);
  test_impossible_and_background(model);
  test_generate_nothing(model);
  xserv_model_free(model);
  printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

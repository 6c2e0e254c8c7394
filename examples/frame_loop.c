/* A game's frame loop over one xserv engine: several characters talk at once, and the game
 * advances the engine by one step per frame within a frame-time budget.
 *
 *   example_frame_loop [-m DIR] [--frames N] [--frame-ms MS] [-n TOKENS]
 *
 * -m DIR        the model (default: examples/models/shakespeare of the source tree, compiled in
 *               as XSERV_EXAMPLE_MODEL_DIR)
 * --frames N    frames at most (default 2000); requests still running then are cancelled
 * --frame-ms MS the frame budget in milliseconds (default 16)
 * -n TOKENS     tokens per character at most (default 48)
 *
 * Each frame: one xserv_engine_step (one batched forward over every character's request),
 * timed; the rest of the frame is slept; a step longer than the budget is an overrun. Events of
 * half the characters go to a per-request callback (run inside xserv_engine_step, on this
 * thread), those of the other half to the engine's queue, drained with xserv_engine_poll after
 * the step. Each character's text is printed as whole lines prefixed with its name ("ROMEO| ")
 * as they complete, and the rest when it finishes; a summary goes to stdout at the end.
 *
 * Thread-safety (capi/xserv.h, "engine"): xserv_engine_step from one thread (here: the frame
 * loop); xserv_engine_submit, _cancel, _poll, _get_stats from any thread at any time, so a game
 * may submit from its AI or network threads while the render thread steps.
 *
 * C99 plus POSIX clock_gettime/nanosleep for the frame timing. Links libxserv alone. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xserv.h>

#ifndef XSERV_EXAMPLE_MODEL_DIR
#define XSERV_EXAMPLE_MODEL_DIR NULL
#endif

/* One character of the game: its conversation's request and what it has said so far. */
typedef struct character {
  const char* name;
  const char* prompt;
  float temperature;
  int32_t top_k;
  uint64_t seed;
  int use_callback; /* 1: events through on_event; 0: through xserv_engine_poll */
  xserv_request_id id;
  char line[4096]; /* text of the current line not yet printed */
  size_t line_len;
  int32_t tokens;
  xserv_finish_reason finish;
  xserv_status status;
  int done;
} character;

#define N_CHARACTERS 4

static character g_cast[N_CHARACTERS] = {
    {"ROMEO", "ROMEO:\nBut soft, what light", 0.8f, 40, 1, 1, 0, {0}, 0, 0, XSERV_FINISH_NONE, XSERV_OK, 0},
    {"JULIET", "JULIET:\nO Romeo, Romeo", 0.7f, 20, 2, 0, 0, {0}, 0, 0, XSERV_FINISH_NONE, XSERV_OK, 0},
    {"MERCUTIO", "MERCUTIO:\nA plague on", 1.0f, 0, 3, 1, 0, {0}, 0, 0, XSERV_FINISH_NONE, XSERV_OK, 0},
    {"NURSE", "NURSE:\nFaith, I can tell", 0.0f, 0, 4, 0, 0, {0}, 0, 0, XSERV_FINISH_NONE, XSERV_OK, 0},
};

static const char* finish_name(xserv_finish_reason f) {
  switch (f) {
    case XSERV_FINISH_NONE: return "running";
    case XSERV_FINISH_STOP: return "stop";
    case XSERV_FINISH_LENGTH: return "length";
    case XSERV_FINISH_CANCELLED: return "cancelled";
    case XSERV_FINISH_ERROR: return "error";
  }
  return "?";
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void sleep_ms(double ms) {
  struct timespec t;
  if (ms <= 0) return;
  t.tv_sec = (time_t)(ms / 1e3);
  t.tv_nsec = (long)((ms - (double)t.tv_sec * 1e3) * 1e6);
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

/* Prints the character's pending text as one prefixed line and empties it. */
static void print_line(character* c) {
  printf("%s| %.*s\n", c->name, (int)c->line_len, c->line);
  fflush(stdout);
  c->line_len = 0;
}

/* Appends text to what the character says; each completed line is printed at once. */
static void append_text(character* c, const char* text, size_t len) {
  size_t i;
  for (i = 0; i < len; ++i) {
    if (text[i] == '\n') print_line(c);
    else if (c->line_len < sizeof c->line) c->line[c->line_len++] = text[i];
  }
}

/* One event of a character's request, from the callback or the queue: append its text, record
 * the end. */
static void on_character_event(character* c, const xserv_event* ev) {
  append_text(c, ev->text, ev->text_len);
  if (ev->type == XSERV_EVENT_TOKEN) c->tokens++;
  if (ev->finish == XSERV_FINISH_NONE) return;
  if (c->line_len > 0) print_line(c);
  if (ev->status != XSERV_OK) fprintf(stderr, "%s failed: %s\n", c->name, ev->error);
  c->finish = ev->finish;
  c->status = ev->status;
  c->done = 1;
}

/* The callback of the characters submitted with use_callback (runs inside xserv_engine_step). */
static void event_callback(const xserv_event* ev, void* user_data) {
  on_character_event((character*)user_data, ev);
}

/* Drains the engine's queue: events of the characters submitted without a callback. */
static int drain_queue(xserv_engine* engine) {
  xserv_event ev;
  bool got = false;
  int i;
  for (;;) {
    if (xserv_engine_poll(engine, &ev, &got) != XSERV_OK) {
      fprintf(stderr, "poll failed: %s\n", xserv_last_error());
      return 0;
    }
    if (!got) return 1;
    for (i = 0; i < N_CHARACTERS; ++i)
      if (g_cast[i].id == ev.request) on_character_event(&g_cast[i], &ev);
  }
}

static int submit_all(xserv_engine* engine, int32_t max_tokens) {
  int i;
  for (i = 0; i < N_CHARACTERS; ++i) {
    character* c = &g_cast[i];
    xserv_generate_params gp = xserv_generate_default_params();
    xserv_request req;
    gp.max_tokens = max_tokens;
    gp.temperature = c->temperature;
    gp.top_k = c->top_k;
    gp.seed = c->seed;
    xserv_request_init(&req);
    req.prompt = c->prompt;
    req.params = &gp; /* read during submit only */
    if (c->use_callback) {
      req.on_event = event_callback;
      req.user_data = c;
    }
    if (xserv_engine_submit(engine, &req, &c->id) != XSERV_OK) {
      fprintf(stderr, "submit %s failed: %s\n", c->name, xserv_last_error());
      return 0;
    }
    append_text(c, c->prompt, strlen(c->prompt)); /* the stream continues the prompt */
  }
  return 1;
}

typedef struct options {
  const char* model;
  long frames;
  double frame_ms;
  long max_tokens;
} options;

/* Parses a whole number in [lo, hi]; 0 on failure. */
static int parse_long(const char* flag, const char* text, long lo, long hi, long* out) {
  char* end = NULL;
  long v;
  errno = 0;
  v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "%s: '%s' must be a whole number in [%ld, %ld]\n", flag, text, lo, hi);
    return 0;
  }
  *out = v;
  return 1;
}

static int parse_options(int argc, char** argv, options* o) {
  int i;
  long v;
  o->model = XSERV_EXAMPLE_MODEL_DIR;
  o->frames = 2000;
  o->frame_ms = 16;
  o->max_tokens = 48;
  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "usage: %s [-m DIR] [--frames N] [--frame-ms MS] [-n TOKENS]\n", argv[0]);
      return 0;
    }
    if (strcmp(a, "-m") == 0) o->model = argv[++i];
    else if (strcmp(a, "--frames") == 0) {
      if (!parse_long(a, argv[++i], 1, 10000000, &o->frames)) return 0;
    } else if (strcmp(a, "--frame-ms") == 0) {
      if (!parse_long(a, argv[++i], 1, 10000, &v)) return 0;
      o->frame_ms = (double)v;
    } else if (strcmp(a, "-n") == 0) {
      if (!parse_long(a, argv[++i], 1, 100000, &o->max_tokens)) return 0;
    } else {
      fprintf(stderr, "unknown option '%s'\n", a);
      return 0;
    }
  }
  if (o->model == NULL) {
    fprintf(stderr, "-m DIR is required (this build has no default model)\n");
    return 0;
  }
  return 1;
}

static void print_summary(xserv_engine* engine, long frames, long overruns, double worst_ms) {
  xserv_engine_stats st;
  int i;
  printf("== summary: %ld frames, %ld over budget (worst step %.1f ms)\n", frames, overruns, worst_ms);
  for (i = 0; i < N_CHARACTERS; ++i)
    printf("== %-9s %3d tokens, finish: %s (%s)\n", g_cast[i].name, (int)g_cast[i].tokens,
           finish_name(g_cast[i].finish), g_cast[i].use_callback ? "callback" : "poll");
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  if (xserv_engine_get_stats(engine, &st) != XSERV_OK) {
    fprintf(stderr, "get_stats failed: %s\n", xserv_last_error());
    return;
  }
  printf("== engine: %llu steps, %llu prompt tokens, %llu generated, %d/%d KV blocks used, "
         "%llu preemptions\n",
         (unsigned long long)st.steps, (unsigned long long)st.prompt_tokens,
         (unsigned long long)st.generated_tokens, (int)st.kv_blocks_used, (int)st.kv_blocks_total,
         (unsigned long long)st.preemptions);
}

/* The frame loop: one step per frame, the rest of the frame slept. Returns 0 on a failed step. */
static int run_frames(xserv_engine* engine, const options* o) {
  long frame = 0, overruns = 0;
  double worst = 0;
  int i, ok = 1;
  for (; frame < o->frames && xserv_engine_has_work(engine); ++frame) {
    const double start = now_ms();
    double took;
    if (xserv_engine_step(engine, NULL) != XSERV_OK) { /* callbacks ran inside */
      fprintf(stderr, "step failed: %s\n", xserv_last_error());
      ok = 0;
      break;
    }
    took = now_ms() - start;
    if (took > worst) worst = took;
    if (!drain_queue(engine)) { ok = 0; break; }
    if (took > o->frame_ms) ++overruns; /* a real game would shed work here */
    else sleep_ms(o->frame_ms - (now_ms() - start));
  }
  /* Out of frames: cancel whoever is still talking; the next steps deliver their ends. */
  for (i = 0; i < N_CHARACTERS; ++i)
    if (!g_cast[i].done && xserv_engine_cancel(engine, g_cast[i].id) != XSERV_OK)
      fprintf(stderr, "cancel failed: %s\n", xserv_last_error());
  while (ok && xserv_engine_has_work(engine)) {
    if (xserv_engine_step(engine, NULL) != XSERV_OK) {
      fprintf(stderr, "step failed: %s\n", xserv_last_error());
      ok = 0;
    }
  }
  if (ok) ok = drain_queue(engine);
  print_summary(engine, frame, overruns, worst);
  return ok;
}

int main(int argc, char** argv) {
  options o;
  xserv_model* model = NULL;
  xserv_engine* engine = NULL;
  xserv_model_params mp = xserv_model_default_params();
  xserv_engine_params ep = xserv_engine_default_params();
  int ok;

  if (!parse_options(argc, argv, &o)) return 2;
  if (xserv_model_load(o.model, &mp, &model) != XSERV_OK) {
    fprintf(stderr, "cannot load %s: %s\n", o.model, xserv_last_error());
    return 1;
  }
  ep.max_seqs = N_CHARACTERS; /* the whole cast in one batch; the KV pool sized for them */
  if (xserv_engine_create(model, &ep, &engine) != XSERV_OK) {
    fprintf(stderr, "cannot create the engine: %s\n", xserv_last_error());
    xserv_model_free(model);
    return 1;
  }
  ok = submit_all(engine, (int32_t)o.max_tokens) && run_frames(engine, &o);
  xserv_engine_free(engine);
  xserv_model_free(model);
  return ok ? 0 : 1;
}

/* The C API from several threads at once on one model: worker threads tokenize, detokenize,
 * apply the chat template and read the model's facts while the main thread generates. Every
 * result must equal the one computed before the threads started (greedy generation, so the
 * generated text is fixed too). xserv.h promises these functions are thread-safe; the
 * ThreadSanitizer stage of scripts/test.sh (label "threads") runs this to prove it.
 *
 * The model: a small random Qwen3 with the real Qwen3 tokenizer (it has a chat template) when
 * the shared tokenizers are there (qwen3_chat_model.h), else the shipped GPT-2 example (the chat
 * template is then UNSUPPORTED, the same answer on every thread). */
#define _XOPEN_SOURCE 700 /* mkdtemp, symlink */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qwen3_chat_model.h"
#include "xserv.h"

enum { kWorkers = 4, kRounds = 40, kGenerations = 3, kMaxIds = 256, kMaxText = 4096 };

static const char kText[] = "The quick brown fox \xe2\x9c\xa8 jumps over 12345 lazy dogs.\n"
                            "<|im_start|>user\nCaf\xc3\xa9?<|im_end|>";
static const xserv_chat_message kMessages[2] = {{"system", "Be brief."},
                                                {"user", "Hello, \xe4\xb8\x96\xe7\x95\x8c!"}};

/* What every thread must see, computed once before they start. */
typedef struct Expected {
  int32_t ids[kMaxIds];
  size_t n_ids;
  char text[kMaxText];
  xserv_status chat_status;
  char chat[kMaxText];
  int32_t n_vocab;
  char generated[kMaxText];
} Expected;

typedef struct Worker {
  xserv_model* model;
  const Expected* expected;
  int failures;
  char first_error[512];
} Worker;

static void worker_fail(Worker* w, const char* what) {
  if (w->failures++ == 0)
    snprintf(w->first_error, sizeof w->first_error, "%s (last error: %s)", what,
             xserv_last_error());
}

static void* worker_main(void* arg) {
  Worker* w = (Worker*)arg;
  const Expected* e = w->expected;
  int32_t ids[kMaxIds];
  char text[kMaxText];
  size_t n = 0, len = 0;
  int round;
  for (round = 0; round < kRounds; ++round) {
    xserv_status s;
    if (xserv_tokenize(w->model, kText, true, ids, kMaxIds, &n) != XSERV_OK || n != e->n_ids ||
        memcmp(ids, e->ids, n * sizeof ids[0]) != 0)
      worker_fail(w, "tokenize gave other ids");
    if (xserv_detokenize(w->model, e->ids, e->n_ids, false, text, sizeof text, &len) !=
            XSERV_OK ||
        strcmp(text, e->text) != 0)
      worker_fail(w, "detokenize gave another text");
    s = xserv_apply_chat_template(w->model, kMessages, 2, true, false, text, sizeof text, &len);
    if (s != e->chat_status || (s == XSERV_OK && strcmp(text, e->chat) != 0))
      worker_fail(w, "the chat template gave another prompt");
    if (xserv_model_n_vocab(w->model) != e->n_vocab || xserv_model_desc(w->model) == NULL)
      worker_fail(w, "model facts changed");
    /* An error on this thread leaves its own message, whatever the others do. */
    if (xserv_tokenize(w->model, "\xff", true, ids, kMaxIds, &n) != XSERV_ERR_INVALID_ARGUMENT ||
        strstr(xserv_last_error(), "UTF-8") == NULL)
      worker_fail(w, "an invalid text was not refused with its own message");
  }
  return NULL;
}

static int generate(xserv_model* model, char* out, size_t cap) {
  xserv_generate_params gp = xserv_generate_default_params();
  char* text = NULL;
  gp.temperature = 0.0f;
  gp.max_tokens = 12;
  gp.ignore_eos = true;
  if (xserv_generate(model, "Hello", &gp, NULL, NULL, &text) != XSERV_OK) return 0;
  snprintf(out, cap, "%s", text);
  xserv_string_free(text);
  return 1;
}

int main(void) {
  char qwen3_dir[] = "/tmp/xserv-threads-XXXXXX";
  const int have_qwen3 = mkdtemp(qwen3_dir) != NULL && write_qwen3_chat_model(qwen3_dir);
  const char* path = have_qwen3 ? qwen3_dir : XSERV_SOURCE_DIR "/examples/models/shakespeare";
  xserv_model* model = NULL;
  xserv_model_params mp = xserv_model_default_params();
  Expected* e = (Expected*)calloc(1, sizeof(Expected));
  Worker workers[kWorkers];
  pthread_t threads[kWorkers];
  char generated[kMaxText];
  size_t len = 0;
  int i, failures = 0, started = 0;

  mp.device = XSERV_DEVICE_CPU;
  mp.n_threads = 2;
  if (xserv_model_load(path, &mp, &model) != XSERV_OK) {
    fprintf(stderr, "capi_threads_test: cannot load %s: %s\n", path, xserv_last_error());
    return 1;
  }
  printf("capi_threads_test: %s\n", xserv_model_desc(model));
  if (xserv_tokenize(model, kText, true, e->ids, kMaxIds, &e->n_ids) != XSERV_OK ||
      xserv_detokenize(model, e->ids, e->n_ids, false, e->text, sizeof e->text, &len) !=
          XSERV_OK ||
      !generate(model, e->generated, sizeof e->generated)) {
    fprintf(stderr, "capi_threads_test: reference failed: %s\n", xserv_last_error());
    return 1;
  }
  e->chat_status = xserv_apply_chat_template(model, kMessages, 2, true, false, e->chat,
                                             sizeof e->chat, &len);
  e->n_vocab = xserv_model_n_vocab(model);
  if (have_qwen3 && e->chat_status != XSERV_OK) {
    fprintf(stderr, "capi_threads_test: chat template failed: %s\n", xserv_last_error());
    return 1;
  }

  for (i = 0; i < kWorkers; ++i) {
    workers[i].model = model;
    workers[i].expected = e;
    workers[i].failures = 0;
    workers[i].first_error[0] = '\0';
    if (pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0) ++started;
  }
  for (i = 0; i < kGenerations; ++i) {
    if (!generate(model, generated, sizeof generated)) {
      fprintf(stderr, "capi_threads_test: generate failed: %s\n", xserv_last_error());
      ++failures;
    } else if (strcmp(generated, e->generated) != 0) {
      fprintf(stderr, "capi_threads_test: generated '%s', alone '%s'\n", generated, e->generated);
      ++failures;
    }
  }
  for (i = 0; i < started; ++i) {
    pthread_join(threads[i], NULL);
    if (workers[i].failures > 0) {
      fprintf(stderr, "capi_threads_test: worker %d: %d failures, first: %s\n", i,
              workers[i].failures, workers[i].first_error);
      failures += workers[i].failures;
    }
  }
  if (started != kWorkers) {
    fprintf(stderr, "capi_threads_test: only %d of %d threads started\n", started, kWorkers);
    ++failures;
  }
  xserv_model_free(model);
  free(e);
  remove_qwen3_chat_model(qwen3_dir);
  printf("capi_threads_test: %d workers x %d rounds beside %d generations, %d failures\n",
         kWorkers, kRounds, kGenerations, failures);
  return failures == 0 ? 0 : 1;
}

/* Hostile model directories through the C API: every file a host may be handed broken in a
 * different way, written by this test (no committed binaries), each expected to fail with one
 * specific status and a message naming the cause, without crashing, hanging or allocating from
 * an unchecked size. Also the status codes xserv.h promises for resources: a thread count past
 * its cap, threads the system refuses, a tokenizer pattern past its match budget.
 *
 * The baseline is a tiny GPT-2 (8 wide, 2 layers) written here, with the GPT-2 tokenizer of the
 * shipped example model; it must load, and each case changes one thing. alarm() turns a hang
 * (a FIFO that blocks a read) into a failure. Run under ASan/LSan in CI: every failure path
 * must also be leak-free inside the library. */
#define _XOPEN_SOURCE 700 /* mkdtemp, symlink, mkfifo, truncate, fork */

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "xserv.h"

#include "c_check.h"

static const char* const kTokenizer = XSERV_SOURCE_DIR "/examples/models/shakespeare/tokenizer.json";

enum { kVocab = 50257, kEmbd = 8, kLayers = 2, kPositions = 16, kMaxTensors = 64 };

/* ---- files ------------------------------------------------------------------------------- */

static char g_dir[64];

static void path_of(char* out, size_t cap, const char* name) {
  snprintf(out, cap, "%s/%s", g_dir, name);
}

static int write_bytes(const char* name, const void* data, size_t size) {
  char path[256];
  FILE* f;
  path_of(path, sizeof path, name);
  unlink(path); /* a FIFO or link left by an earlier case */
  f = fopen(path, "wb");
  if (f == NULL) return 0;
  if (size > 0 && fwrite(data, 1, size, f) != size) {
    fclose(f);
    return 0;
  }
  return fclose(f) == 0;
}

static int write_text(const char* name, const char* text) {
  return write_bytes(name, text, strlen(text));
}

static void remove_file(const char* name) {
  char path[256];
  path_of(path, sizeof path, name);
  unlink(path);
}

static int make_fifo(const char* name) {
  char path[256];
  path_of(path, sizeof path, name);
  unlink(path);
  return mkfifo(path, 0600) == 0;
}

static int make_link(const char* target, const char* name) {
  char path[256];
  path_of(path, sizeof path, name);
  unlink(path);
  return symlink(target, path) == 0;
}

/* Reads a whole file into a malloc'd NUL-terminated buffer (NULL when it cannot). */
static char* slurp(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  char* buf;
  long n;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = (char*)malloc((size_t)n + 1);
  if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf != NULL) {
    buf[n] = '\0';
    if (size != NULL) *size = (size_t)n;
  }
  return buf;
}

/* ---- the tiny GPT-2, as a list of tensors that a case may edit before writing ------------ */

typedef struct Tensor {
  char name[96];
  char dtype[8];
  int64_t shape[2];
  int rank;
  int64_t begin, end; /* data_offsets; filled by layout() */
} Tensor;

typedef struct Checkpoint {
  Tensor t[kMaxTensors];
  int n;
} Checkpoint;

static void add(Checkpoint* c, const char* name, int64_t d0, int64_t d1) {
  Tensor* t = &c->t[c->n++];
  snprintf(t->name, sizeof t->name, "transformer.%s", name);
  strcpy(t->dtype, "F32");
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->rank = d1 > 0 ? 2 : 1;
}

static void add_layer(Checkpoint* c, int i, int64_t d) {
  char n[64];
#define LAYER(suffix, d0, d1)                       \
  snprintf(n, sizeof n, "h.%d.%s", i, suffix);      \
  add(c, n, d0, d1)
  LAYER("ln_1.weight", d, 0);
  LAYER("ln_1.bias", d, 0);
  LAYER("attn.c_attn.weight", d, 3 * d);
  LAYER("attn.c_attn.bias", 3 * d, 0);
  LAYER("attn.c_proj.weight", d, d);
  LAYER("attn.c_proj.bias", d, 0);
  LAYER("ln_2.weight", d, 0);
  LAYER("ln_2.bias", d, 0);
  LAYER("mlp.c_fc.weight", d, 4 * d);
  LAYER("mlp.c_fc.bias", 4 * d, 0);
  LAYER("mlp.c_proj.weight", 4 * d, d);
  LAYER("mlp.c_proj.bias", d, 0);
#undef LAYER
}

static Checkpoint* tiny_gpt2_of(int64_t vocab, int64_t d) {
  Checkpoint* c = (Checkpoint*)calloc(1, sizeof(Checkpoint));
  int i;
  add(c, "wte.weight", vocab, d);
  add(c, "wpe.weight", kPositions, d);
  for (i = 0; i < kLayers; ++i) add_layer(c, i, d);
  add(c, "ln_f.weight", d, 0);
  add(c, "ln_f.bias", d, 0);
  return c;
}

static Checkpoint* tiny_gpt2(int64_t vocab) { return tiny_gpt2_of(vocab, kEmbd); }

static Tensor* find(Checkpoint* c, const char* short_name) {
  char name[96];
  int i;
  snprintf(name, sizeof name, "transformer.%s", short_name);
  for (i = 0; i < c->n; ++i)
    if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
  return NULL;
}

/* Contiguous data_offsets from the shapes (4-byte elements); returns the data size. */
static int64_t layout(Checkpoint* c) {
  int64_t offset = 0;
  int i;
  for (i = 0; i < c->n; ++i) {
    Tensor* t = &c->t[i];
    t->begin = offset;
    t->end = offset + 4 * t->shape[0] * (t->rank == 2 ? t->shape[1] : 1);
    offset = t->end;
  }
  return offset;
}

/* Writes the checkpoint as `name` with `data_size` zero bytes of data (a sparse extension of
 * the file: a 512 GiB checkpoint takes no disk). header_len_override (when not 0) replaces the
 * header length written in the first 8 bytes. */
static int write_checkpoint(const char* name, const Checkpoint* c, int64_t data_size,
                            uint64_t header_len_override) {
  char* header = (char*)malloc(64 * 256);
  size_t len = 0;
  unsigned char prefix[8];
  char path[256];
  FILE* f;
  uint64_t n;
  int i, ok = 1;
  len += (size_t)sprintf(header + len, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (i = 0; i < c->n; ++i) {
    const Tensor* t = &c->t[i];
    if (t->rank == 2)
      len += (size_t)sprintf(header + len,
                             ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                             "\"data_offsets\":[%lld,%lld]}",
                             t->name, t->dtype, (long long)t->shape[0], (long long)t->shape[1],
                             (long long)t->begin, (long long)t->end);
    else
      len += (size_t)sprintf(header + len,
                             ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],"
                             "\"data_offsets\":[%lld,%lld]}",
                             t->name, t->dtype, (long long)t->shape[0], (long long)t->begin,
                             (long long)t->end);
  }
  header[len++] = '}';
  while (len % 8 != 0) header[len++] = ' ';
  n = header_len_override != 0 ? header_len_override : (uint64_t)len;
  for (i = 0; i < 8; ++i) prefix[i] = (unsigned char)(n >> (8 * i));
  path_of(path, sizeof path, name);
  unlink(path);
  f = fopen(path, "wb");
  if (f == NULL) {
    free(header);
    return 0;
  }
  ok = fwrite(prefix, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len && fflush(f) == 0;
  ok = ok && ftruncate(fileno(f), (off_t)(8 + len) + (off_t)data_size) == 0;
  free(header);
  return (fclose(f) == 0) && ok;
}

static int write_model(Checkpoint* c) {
  return write_checkpoint("model.safetensors", c, layout(c), 0);
}

static void write_config_eos(const char* vocab, const char* n_embd, const char* n_layer,
                             const char* n_head, const char* eos) {
  char text[1024];
  snprintf(text, sizeof text,
           "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"],\n"
           " \"vocab_size\": %s, \"n_embd\": %s, \"n_layer\": %s, \"n_head\": %s,\n"
           " \"n_positions\": %d, \"n_inner\": null, \"layer_norm_epsilon\": 1e-5,\n"
           " \"eos_token_id\": %s, \"torch_dtype\": \"float32\"}\n",
           vocab, n_embd, n_layer, n_head, kPositions, eos);
  CHECK(write_text("config.json", text));
}

static void write_config(const char* vocab, const char* n_embd, const char* n_layer,
                         const char* n_head) {
  write_config_eos(vocab, n_embd, n_layer, n_head, "50256");
}

static void write_good_config(void) { write_config("50257", "8", "2", "2"); }

static void write_good_model(void) {
  Checkpoint* c = tiny_gpt2(kVocab);
  CHECK(write_model(c));
  free(c);
}

/* ---- expectations ------------------------------------------------------------------------ */

static xserv_model_params cpu_params(void) {
  xserv_model_params mp = xserv_model_default_params();
  mp.device = XSERV_DEVICE_CPU;
  mp.n_threads = 1;
  return mp;
}

/* Loading g_dir with `params` fails with `want`, and the message mentions every needle. */
static void expect_load_with(const xserv_model_params* params, const char* what,
                             xserv_status want, const char* needle1, const char* needle2) {
  xserv_model* model = (xserv_model*)(void*)&model;
  xserv_status got = xserv_model_load(g_dir, params, &model);
  const char* msg = xserv_last_error();
  ++g_checks;
  if (got != want || model != NULL || (want != XSERV_OK && strstr(msg, needle1) == NULL) ||
      (want != XSERV_OK && needle2 != NULL && strstr(msg, needle2) == NULL)) {
    ++g_failures;
    fprintf(stderr, "%s: got %s (want %s), message '%s' (want '%s'%s%s)\n", what,
            xserv_status_string(got), xserv_status_string(want), msg, needle1,
            needle2 ? " and " : "", needle2 ? needle2 : "");
  }
  if (got == XSERV_OK) xserv_model_free(model);
}

/* The same on the CPU with one thread. */
static void expect_load(const char* what, xserv_status want, const char* needle1,
                        const char* needle2) {
  xserv_model_params mp = cpu_params();
  expect_load_with(&mp, what, want, needle1, needle2);
}

static void expect_loads(const char* what) {
  xserv_model* model = NULL;
  xserv_model_params mp = cpu_params();
  xserv_status got = xserv_model_load(g_dir, &mp, &model);
  ++g_checks;
  if (got != XSERV_OK || model == NULL) {
    ++g_failures;
    fprintf(stderr, "%s: got %s: '%s'\n", what, xserv_status_string(got), xserv_last_error());
  }
  xserv_model_free(model);
}

/* ---- safetensors ------------------------------------------------------------------------- */

static void test_safetensors(void) {
  Checkpoint* c;
  int64_t size;
  char path[256];

  CHECK(write_bytes("model.safetensors", "", 0));
  expect_load("empty safetensors", XSERV_ERR_FORMAT, "model.safetensors", "too short");

  CHECK(write_bytes("model.safetensors", "\x10\x00\x00", 3));
  expect_load("3-byte safetensors", XSERV_ERR_FORMAT, "too short", NULL);

  c = tiny_gpt2(kVocab);
  size = layout(c);
  CHECK(write_checkpoint("model.safetensors", c, size, 1ull << 40));
  expect_load("header length past the end", XSERV_ERR_FORMAT, "header length", NULL);
  CHECK(write_checkpoint("model.safetensors", c, size, UINT64_MAX));
  expect_load("header length 2^64-1", XSERV_ERR_FORMAT, "header length", NULL);
  CHECK(write_checkpoint("model.safetensors", c, size, 4));
  expect_load("header length inside the JSON", XSERV_ERR_FORMAT, "invalid JSON", NULL);

  /* Truncated: the data stops half-way. */
  CHECK(write_checkpoint("model.safetensors", c, size / 2, 0));
  expect_load("truncated data", XSERV_ERR_FORMAT, "outside the", NULL);
  /* Oversized: trailing bytes past the last tensor are harmless and ignored. */
  CHECK(write_checkpoint("model.safetensors", c, size + 4096, 0));
  expect_loads("trailing bytes");

  /* Offsets: overlapping ranges, a range past the data, a range reversed, unaligned. */
  find(c, "ln_f.bias")->begin = find(c, "ln_f.weight")->begin;
  find(c, "ln_f.bias")->end = find(c, "ln_f.weight")->end;
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("overlapping tensors", XSERV_ERR_FORMAT, "overlap", NULL);
  layout(c);
  find(c, "ln_f.bias")->begin = size;
  find(c, "ln_f.bias")->end = size + 4 * kEmbd;
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("offsets past the data", XSERV_ERR_FORMAT, "outside the", "ln_f.bias");
  layout(c);
  find(c, "ln_f.bias")->begin = find(c, "ln_f.bias")->end;
  find(c, "ln_f.bias")->end -= 4 * kEmbd;
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("reversed offsets", XSERV_ERR_FORMAT, "ln_f.bias", NULL);
  layout(c);
  find(c, "ln_f.bias")->begin += 2;
  find(c, "ln_f.bias")->end += 2;
  CHECK(write_checkpoint("model.safetensors", c, size + 2, 0));
  expect_load("unaligned tensor", XSERV_ERR_FORMAT, "ln_f.bias", NULL);
  layout(c);

  /* dtype and shape lies. */
  strcpy(find(c, "wpe.weight")->dtype, "F16");
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("dtype whose size disagrees with the range", XSERV_ERR_FORMAT, "wpe.weight",
              "expected");
  strcpy(find(c, "wpe.weight")->dtype, "I32");
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("integer weights", XSERV_ERR_FORMAT, "wpe.weight", "float");
  strcpy(find(c, "wpe.weight")->dtype, "Q4_K");
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("unknown dtype", XSERV_ERR_FORMAT, "Q4_K", NULL);
  strcpy(find(c, "wpe.weight")->dtype, "F32");
  find(c, "wpe.weight")->shape[0] = kEmbd;
  find(c, "wpe.weight")->shape[1] = kPositions; /* same bytes, transposed */
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("transposed shape", XSERV_ERR_FORMAT, "wpe.weight", "expected");
  find(c, "wpe.weight")->shape[0] = kPositions * 2;
  find(c, "wpe.weight")->shape[1] = kEmbd;
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("shape larger than its range", XSERV_ERR_FORMAT, "wpe.weight", NULL);
  find(c, "wpe.weight")->shape[0] = 1ll << 40;
  CHECK(write_checkpoint("model.safetensors", c, size, 0));
  expect_load("shape of 2^43 elements", XSERV_ERR_FORMAT, "wpe.weight", NULL);
  free(c);

  /* Missing and extra tensors. */
  c = tiny_gpt2(kVocab);
  c->n -= 1; /* ln_f.bias */
  CHECK(write_model(c));
  expect_load("missing tensor", XSERV_ERR_FORMAT, "ln_f.bias", "missing");
  free(c);
  c = tiny_gpt2(kVocab);
  add_layer(c, 2, kEmbd);
  CHECK(write_model(c));
  expect_load("a third layer the config does not have", XSERV_ERR_FORMAT, "3 layers", NULL);
  free(c);
  c = tiny_gpt2(kVocab);
  add(c, "h.0.attn.c_attn.weight", 1, 0); /* the same name twice */
  CHECK(write_model(c));
  expect_load("duplicate tensor", XSERV_ERR_FORMAT, "twice", NULL);
  free(c);

  /* Not JSON at all, and a header that is JSON but not an object. */
  CHECK(write_bytes("model.safetensors", "\x08\0\0\0\0\0\0\0[1,2,3] ", 16));
  expect_load("header is an array", XSERV_ERR_FORMAT, "not a JSON object", NULL);
  CHECK(write_bytes("model.safetensors", "\x08\0\0\0\0\0\0\0{\"a\":{}}", 16));
  expect_load("tensor without dtype", XSERV_ERR_FORMAT, "'a'", NULL);

  /* A sharded checkpoint whose index names a shard that is not there: NOT_FOUND. */
  remove_file("model.safetensors");
  c = tiny_gpt2(kVocab);
  CHECK(write_checkpoint("model-00001-of-00002.safetensors", c, layout(c), 0));
  free(c);
  CHECK(write_text("model.safetensors.index.json",
                   "{\"metadata\": {}, \"weight_map\": {"
                   "\"transformer.wte.weight\": \"model-00001-of-00002.safetensors\","
                   "\"transformer.ln_f.bias\": \"model-00002-of-00002.safetensors\"}}"));
  expect_load("index names a missing shard", XSERV_ERR_NOT_FOUND,
              "model-00002-of-00002.safetensors", "missing");
  remove_file("model.safetensors.index.json");
  /* No index: shard 2 of 2 missing by its name alone. */
  expect_load("shard 2 of 2 missing", XSERV_ERR_NOT_FOUND, "shard 2 of 2", NULL);
  remove_file("model-00001-of-00002.safetensors");

  /* A FIFO where the weights should be: refused at once, not a blocked load. */
  CHECK(make_fifo("model.safetensors"));
  expect_load("FIFO safetensors", XSERV_ERR_IO, "model.safetensors", "FIFO");
  path_of(path, sizeof path, "model.safetensors");
  unlink(path);
  write_good_model();
}

/* ---- config.json ------------------------------------------------------------------------- */

static void test_config(void) {
  char path[256];
  write_config("50257", "8", "1000000", "2");
  expect_load("n_layer 1e6", XSERV_ERR_FORMAT, "1000000 layers", "2 layers");
  write_config("50257", "8", "4000000000", "2");
  expect_load("n_layer 4e9", XSERV_ERR_FORMAT, "n_layer", "out of range");
  write_config("50257", "8", "0", "2");
  expect_load("n_layer 0", XSERV_ERR_FORMAT, "layer count", NULL);
  write_config("50257", "-8", "2", "2");
  expect_load("negative n_embd", XSERV_ERR_FORMAT, "n_embd", NULL);
  write_config("50257", "8", "2", "0");
  expect_load("n_head 0", XSERV_ERR_FORMAT, "head count", NULL);
  write_config("50257", "8", "2", "3");
  expect_load("n_head not dividing n_embd", XSERV_ERR_FORMAT, "divisible", NULL);
  write_config("1e300", "8", "2", "2");
  expect_load("vocab_size 1e300", XSERV_ERR_FORMAT, "vocab_size", NULL);
  write_config("50257", "\"eight\"", "2", "2");
  expect_load("n_embd a string", XSERV_ERR_FORMAT, "n_embd", NULL);
  write_config("50257", "16", "2", "2");
  expect_load("n_embd that the tensors do not have", XSERV_ERR_FORMAT, "shape", NULL);
  write_config("60000", "8", "2", "2");
  expect_load("vocab_size that the embedding does not have", XSERV_ERR_FORMAT, "wte", NULL);

  CHECK(write_text("config.json", ""));
  expect_load("empty config.json", XSERV_ERR_FORMAT, "config.json", NULL);
  CHECK(write_text("config.json", "[]"));
  expect_load("config.json not an object", XSERV_ERR_FORMAT, "config.json", NULL);

  /* 17 MiB (sparse): refused by its size before it is read. */
  CHECK(write_text("config.json", "{"));
  path_of(path, sizeof path, "config.json");
  CHECK(truncate(path, 17 << 20) == 0);
  expect_load("17 MiB config.json", XSERV_ERR_FORMAT, "config.json", "more than");

  CHECK(make_fifo("config.json"));
  expect_load("FIFO config.json", XSERV_ERR_IO, "config.json", "FIFO");
  CHECK(make_link("/dev/urandom", "config.json"));
  expect_load("config.json linked to /dev/urandom", XSERV_ERR_IO, "config.json",
              "character device");
  CHECK(make_link("/nonexistent/config.json", "config.json"));
  expect_load("dangling config.json link", XSERV_ERR_NOT_FOUND, "config.json", NULL);
  remove_file("config.json");
  write_good_config();

  /* generation_config.json (its end ids) is read at load, not at the first generate. */
  CHECK(write_text("generation_config.json", "{\"eos_token_id\": 50256,\x01}"));
  expect_load("generation_config.json not JSON", XSERV_ERR_FORMAT, "generation_config.json", NULL);
  CHECK(write_text("generation_config.json", "{\"eos_token_id\": \"x\"}"));
  expect_load("generation_config.json eos id a string", XSERV_ERR_FORMAT, "eos_token_id", NULL);
  CHECK(write_text("generation_config.json", "{\"eos_token_id\": [0, 7]}"));
  expect_loads("generation_config.json with two eos ids");
  remove_file("generation_config.json");
}

/* ---- tokenizer --------------------------------------------------------------------------- */

/* The example's tokenizer.json with its pre-tokenizer replaced by `pre_tokenizer` (JSON). */
static int write_tokenizer_with(const char* pre_tokenizer) {
  size_t size = 0;
  char* text = slurp(kTokenizer, &size);
  char* key;
  char* end;
  int depth = 0, ok = 0;
  FILE* f;
  char path[256];
  if (text == NULL) return 0;
  key = strstr(text, "\"pre_tokenizer\":");
  end = key ? strchr(key, '{') : NULL;
  for (; end != NULL && *end != '\0'; ++end) { /* the object's closing brace */
    if (*end == '{') ++depth;
    if (*end == '}' && --depth == 0) break;
  }
  path_of(path, sizeof path, "tokenizer.json");
  unlink(path);
  if (end != NULL && *end == '}' && (f = fopen(path, "wb")) != NULL) {
    const size_t head = (size_t)(key - text);
    ok = fwrite(text, 1, head, f) == head;
    ok = ok && fprintf(f, "\"pre_tokenizer\": %s", pre_tokenizer) > 0;
    ok = ok && fwrite(end + 1, 1, size - (size_t)(end + 1 - text), f) ==
                   size - (size_t)(end + 1 - text);
    ok = (fclose(f) == 0) && ok;
  }
  free(text);
  return ok;
}

/* ... with a Split pre-tokenizer of `regex` (no JSON escapes needed) before ByteLevel. */
static int write_tokenizer_with_split(const char* regex) {
  char pre[512];
  snprintf(pre, sizeof pre,
           "{\"type\": \"Sequence\", \"pretokenizers\": ["
           "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, "
           "\"behavior\": \"Isolated\", \"invert\": false},"
           "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}",
           regex);
  return write_tokenizer_with(pre);
}

static void test_tokenizer(void) {
  xserv_model* model = NULL;
  xserv_model_params mp = cpu_params();
  Checkpoint* c;
  char text[64];
  int32_t ids[64];
  size_t n = 0;

  remove_file("tokenizer.json");
  expect_load("no tokenizer", XSERV_ERR_NOT_FOUND, "tokenizer", NULL);
  CHECK(write_text("tokenizer.json", ""));
  expect_load("empty tokenizer.json", XSERV_ERR_FORMAT, "tokenizer.json", NULL);
  CHECK(write_text("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0"));
  expect_load("cut tokenizer.json", XSERV_ERR_FORMAT, "tokenizer.json", "JSON");
  CHECK(write_text("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, "
                                     "\"merges\": []}}"));
  expect_load("negative token id", XSERV_ERR_FORMAT, "tokenizer.json", "id");
  CHECK(write_text("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, "
                                     "\"b\": 2000000000}, \"merges\": []}, "
                                     "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}"));
  expect_load("token id far past the vocabulary", XSERV_ERR_FORMAT, "tokenizer.json", "2000000000");
  CHECK(write_text("tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}"));
  expect_load("unsupported tokenizer model", XSERV_ERR_UNSUPPORTED, "Unigram", NULL);
  CHECK(write_tokenizer_with_split("("));
  expect_load("pattern that does not compile", XSERV_ERR_FORMAT, "pattern", NULL);
  CHECK(make_fifo("tokenizer.json"));
  expect_load("FIFO tokenizer.json", XSERV_ERR_IO, "tokenizer.json", "FIFO");
  CHECK(make_link("/dev/zero", "tokenizer.json"));
  expect_load("tokenizer.json linked to /dev/zero", XSERV_ERR_IO, "tokenizer.json",
              "character device");

  /* The tokenizer's 50257 ids against an embedding of 50000 rows: ids past the table. */
  CHECK(make_link(kTokenizer, "tokenizer.json"));
  write_config_eos("50000", "8", "2", "2", "0");
  c = tiny_gpt2(50000);
  CHECK(write_model(c));
  free(c);
  expect_load("tokenizer ids past the embedding", XSERV_ERR_FORMAT, "50000 rows", "50256");
  write_good_config();
  write_good_model();

  /* A pattern that backtracks exponentially: the model loads, encoding such text stops at
   * the match budget with RESOURCE_EXHAUSTED, and ordinary text still encodes. */
  CHECK(write_tokenizer_with_split("(a|aa)+$"));
  CHECK(xserv_model_load(g_dir, &mp, &model) == XSERV_OK);
  if (model != NULL) {
    memset(text, 'a', 60);
    text[60] = '!';
    text[61] = '\0';
    CHECK(xserv_tokenize(model, text, true, ids, 64, &n) == XSERV_ERR_RESOURCE_EXHAUSTED);
    CHECK(strstr(xserv_last_error(), "pattern") != NULL);
    CHECK(xserv_tokenize(model, "bbb ccc", true, ids, 64, &n) == XSERV_OK && n > 0);
    xserv_model_free(model);
  }
  CHECK(make_link(kTokenizer, "tokenizer.json"));
}

/* ---- threads ----------------------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

static void test_threads(void) {
  xserv_model* model = NULL;
  xserv_model_params mp = cpu_params();
  mp.n_threads = 100000; /* exhausted a machine's process table for minutes once */
  CHECK(xserv_model_load(g_dir, &mp, &model) == XSERV_ERR_INVALID_ARGUMENT);
  CHECK(strstr(xserv_last_error(), "100000") != NULL);
  CHECK(model == NULL);
  mp.n_threads = 1025; /* past the absolute ceiling on any machine */
  CHECK(xserv_model_load(g_dir, &mp, &model) == XSERV_ERR_INVALID_ARGUMENT);

#ifndef UNDER_SANITIZER
  {
    /* The system refuses threads part-way (a child whose address space has room for a few
     * stacks): RESOURCE_EXHAUSTED, no deadlock, nothing left running. A sanitizer runtime
     * cannot live under RLIMIT_AS, so this part runs in the plain builds only. */
    pid_t pid = fork();
    int status = 0;
    CHECK(pid >= 0);
    if (pid == 0) {
      FILE* statm = fopen("/proc/self/statm", "r");
      unsigned long pages = 0;
      struct rlimit limit;
      pthread_attr_t attr;
      size_t stack = 0;
      xserv_status got;
      alarm(60);
      if (statm == NULL || fscanf(statm, "%lu", &pages) != 1) _exit(5);
      fclose(statm);
      pthread_attr_init(&attr); /* a new thread's default stack size */
      pthread_attr_getstacksize(&attr, &stack);
      pthread_attr_destroy(&attr);
      /* Room for one worker's stack and a half: the second worker cannot start. */
      limit.rlim_cur = limit.rlim_max =
          (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (rlim_t)(stack * 3 / 2);
      if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(6);
      mp.n_threads = 4; /* under the cap (4 per hardware thread) on any machine */
      got = xserv_model_load(g_dir, &mp, &model);
      if (got == XSERV_OK) _exit(2);
      if (got != XSERV_ERR_RESOURCE_EXHAUSTED || model != NULL) {
        fprintf(stderr, "thread failure: %s: %s\n", xserv_status_string(got), xserv_last_error());
        _exit(3);
      }
      _exit(strstr(xserv_last_error(), "thread") != NULL ? 0 : 4);
    }
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      fprintf(stderr, "thread failure child: status %d\n", status);
  }
#endif
}

/* ---- device memory ----------------------------------------------------------------------- */

/* A checkpoint larger than the GPU (a sparse 512 GiB embedding, [2^30, 128] f32): loading it on
 * CUDA is OUT_OF_MEMORY, and the host goes on: the real model loads and generates on the same
 * device afterwards. Skipped (with a line saying so) without a CUDA build and a visible GPU. */
static void test_device_memory(void) {
  xserv_model* model = NULL;
  xserv_model_params mp = xserv_model_default_params();
  xserv_generate_params gp = xserv_generate_default_params();
  Checkpoint* c;
  char* text = NULL;
  mp.device = XSERV_DEVICE_CUDA;
  if (xserv_model_load(g_dir, &mp, &model) != XSERV_OK) {
    printf("capi_hostile_test: no CUDA device (%s): device memory exhaustion not tested\n",
           xserv_last_error());
    return;
  }
  xserv_model_free(model);
  model = NULL;
  write_config("1073741824", "128", "2", "2");
  c = tiny_gpt2_of((int64_t)1 << 30, 128);
  CHECK(write_model(c));
  free(c);
  expect_load_with(&mp, "a 512 GiB checkpoint on the GPU", XSERV_ERR_OUT_OF_MEMORY,
                   "out of device memory", NULL);
  write_good_config();
  write_good_model();
  CHECK(xserv_model_load(g_dir, &mp, &model) == XSERV_OK);
  gp.max_tokens = 4;
  gp.temperature = 0.0f;
  CHECK(model != NULL && xserv_generate(model, "Hello", &gp, NULL, NULL, &text) == XSERV_OK);
  xserv_string_free(text);
  xserv_model_free(model);
  printf("capi_hostile_test: device memory exhaustion tested on %s\n", "CUDA");
}

int main(void) {
  static const char* const kNames[] = {"config.json", "model.safetensors", "tokenizer.json",
                                       "model.safetensors.index.json",
                                       "model-00001-of-00002.safetensors"};
  char path[256];
  size_t i;
  FILE* probe = fopen(kTokenizer, "rb");
  if (probe == NULL) {
    printf("capi_hostile_test: %s missing, skipped\n", kTokenizer);
    return 0;
  }
  fclose(probe);
  alarm(300); /* a load that blocks (a FIFO read) fails the test instead of hanging CI */
  strcpy(g_dir, "/tmp/xserv-hostile-XXXXXX");
  if (mkdtemp(g_dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  write_good_config();
  write_good_model();
  CHECK(make_link(kTokenizer, "tokenizer.json"));
  expect_loads("the baseline");

  test_safetensors();
  expect_loads("the baseline after the safetensors cases");
  test_config();
  expect_loads("the baseline after the config cases");
  test_tokenizer();
  expect_loads("the baseline after the tokenizer cases");
  test_threads();
  expect_loads("the baseline after the thread cases");
  test_device_memory();
  expect_loads("the baseline after the device memory case");

  for (i = 0; i < sizeof kNames / sizeof kNames[0]; ++i) {
    path_of(path, sizeof path, kNames[i]);
    unlink(path);
  }
  rmdir(g_dir);
  printf("capi_hostile_test: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

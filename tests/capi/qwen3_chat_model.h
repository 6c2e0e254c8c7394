/* A Qwen3 model directory for C API tests that need the real Qwen3 tokenizer and its chat
 * template: config.json and model.safetensors written here (random weights, 8 wide, 2 layers,
 * tied embeddings, the full 151936-row vocabulary, 4.9 MB), tokenizer.json and
 * tokenizer_config.json linked from shared/tokenizers/qwen3.
 *
 * Why not the tiny-qwen3 fixture with the Qwen3 tokenizer beside it: its embedding has 320 rows,
 * and a tokenizer whose ids pass the embedding's rows is a load error (ids past the table would
 * reach the embedding gather). Header-only, C99; used by capi_test.c and capi_threads_test.c. */
#ifndef XSERV_TEST_QWEN3_CHAT_MODEL_H
#define XSERV_TEST_QWEN3_CHAT_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
  kQwen3ChatVocab = 151936,
  kQwen3ChatHidden = 8,
  kQwen3ChatLayers = 2,
  kQwen3ChatHeads = 2,
  kQwen3ChatKvHeads = 1,
  kQwen3ChatHeadDim = 4,
  kQwen3ChatInter = 16
};

typedef struct Qwen3ChatTensor {
  char name[80];
  int64_t rows, cols; /* cols 0: a vector of `rows` */
} Qwen3ChatTensor;

static void qwen3_chat_add(Qwen3ChatTensor* t, int* n, const char* name, int layer,
                           int64_t rows, int64_t cols) {
  if (layer >= 0)
    snprintf(t[*n].name, sizeof t[*n].name, "model.layers.%d.%s", layer, name);
  else
    snprintf(t[*n].name, sizeof t[*n].name, "model.%s", name);
  t[*n].rows = rows;
  t[*n].cols = cols;
  ++*n;
}

static int qwen3_chat_tensors(Qwen3ChatTensor* t) {
  const int64_t d = kQwen3ChatHidden, q = kQwen3ChatHeads * kQwen3ChatHeadDim,
                kv = kQwen3ChatKvHeads * kQwen3ChatHeadDim, in = kQwen3ChatInter;
  int n = 0, i;
  qwen3_chat_add(t, &n, "embed_tokens.weight", -1, kQwen3ChatVocab, d);
  for (i = 0; i < kQwen3ChatLayers; ++i) {
    qwen3_chat_add(t, &n, "input_layernorm.weight", i, d, 0);
    qwen3_chat_add(t, &n, "self_attn.q_proj.weight", i, q, d);
    qwen3_chat_add(t, &n, "self_attn.k_proj.weight", i, kv, d);
    qwen3_chat_add(t, &n, "self_attn.v_proj.weight", i, kv, d);
    qwen3_chat_add(t, &n, "self_attn.q_norm.weight", i, kQwen3ChatHeadDim, 0);
    qwen3_chat_add(t, &n, "self_attn.k_norm.weight", i, kQwen3ChatHeadDim, 0);
    qwen3_chat_add(t, &n, "self_attn.o_proj.weight", i, d, q);
    qwen3_chat_add(t, &n, "post_attention_layernorm.weight", i, d, 0);
    qwen3_chat_add(t, &n, "mlp.gate_proj.weight", i, in, d);
    qwen3_chat_add(t, &n, "mlp.up_proj.weight", i, in, d);
    qwen3_chat_add(t, &n, "mlp.down_proj.weight", i, d, in);
  }
  qwen3_chat_add(t, &n, "norm.weight", -1, d, 0);
  return n;
}

static int qwen3_chat_link(const char* dir, const char* name, const char* target) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return symlink(target, path) == 0;
}

/* Fills `dir` (an existing, empty directory). Returns 0 when the shared Qwen3 tokenizer is not
 * there (the caller skips) or a file cannot be written. */
static int write_qwen3_chat_model(const char* dir) {
  static const char* const kTokenizer = XSERV_SHARED_DIR "/tokenizers/qwen3/tokenizer.json";
  static const char* const kTokenizerConfig =
      XSERV_SHARED_DIR "/tokenizers/qwen3/tokenizer_config.json";
  Qwen3ChatTensor t[64];
  const int n = qwen3_chat_tensors(t);
  char path[4096], header[8192];
  size_t len = 0, offset = 0;
  unsigned char prefix[8];
  uint32_t state = 12345u;
  struct stat st;
  FILE* f;
  int i, ok;
  if (stat(kTokenizer, &st) != 0 || stat(kTokenizerConfig, &st) != 0) return 0;

  snprintf(path, sizeof path, "%s/config.json", dir);
  f = fopen(path, "wb");
  if (f == NULL) return 0;
  fprintf(f,
          "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\",\n"
          " \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d,\n"
          " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,\n"
          " \"intermediate_size\": %d, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-6,\n"
          " \"rope_theta\": 1000000.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": true,\n"
          " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"torch_dtype\": \"float32\"}\n",
          kQwen3ChatVocab, kQwen3ChatHidden, kQwen3ChatLayers, kQwen3ChatHeads,
          kQwen3ChatKvHeads, kQwen3ChatHeadDim, kQwen3ChatInter);
  if (fclose(f) != 0) return 0;

  header[len++] = '{';
  for (i = 0; i < n; ++i) {
    const size_t bytes = (size_t)(t[i].rows * (t[i].cols > 0 ? t[i].cols : 1)) * 4;
    char shape[64];
    if (t[i].cols > 0)
      sprintf(shape, "%lld,%lld", (long long)t[i].rows, (long long)t[i].cols);
    else
      sprintf(shape, "%lld", (long long)t[i].rows);
    len += (size_t)sprintf(header + len,
                           "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%lu,%lu]}",
                           i ? "," : "", t[i].name, shape, (unsigned long)offset,
                           (unsigned long)(offset + bytes));
    offset += bytes;
  }
  header[len++] = '}';
  while (len % 8 != 0) header[len++] = ' ';
  for (i = 0; i < 8; ++i) prefix[i] = (unsigned char)((uint64_t)len >> (8 * i));

  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  f = fopen(path, "wb");
  if (f == NULL) return 0;
  ok = fwrite(prefix, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len;
  for (i = 0; ok && i < n; ++i) {
    /* Norm scales near 1, everything else small (std ~0.03): finite, varied logits. */
    const int is_norm = strstr(t[i].name, "norm") != NULL;
    const int64_t count = t[i].rows * (t[i].cols > 0 ? t[i].cols : 1);
    int64_t k;
    for (k = 0; ok && k < count; ++k) {
      float v;
      state = state * 1664525u + 1013904223u;
      v = ((float)(state >> 8) / 16777216.0f - 0.5f) * 0.1f + (is_norm ? 1.0f : 0.0f);
      ok = fwrite(&v, 4, 1, f) == 1;
    }
  }
  ok = (fclose(f) == 0) && ok;
  return ok && qwen3_chat_link(dir, "tokenizer.json", kTokenizer) &&
         qwen3_chat_link(dir, "tokenizer_config.json", kTokenizerConfig);
}

/* Removes what write_qwen3_chat_model wrote, and the directory. */
static void remove_qwen3_chat_model(const char* dir) {
  static const char* const kNames[] = {"config.json", "model.safetensors", "tokenizer.json",
                                       "tokenizer_config.json"};
  char path[4096];
  size_t i;
  for (i = 0; i < sizeof kNames / sizeof kNames[0]; ++i) {
    snprintf(path, sizeof path, "%s/%s", dir, kNames[i]);
    unlink(path);
  }
  rmdir(dir);
}

#endif /* XSERV_TEST_QWEN3_CHAT_MODEL_H */

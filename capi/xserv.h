/*
 * xserv.h — the C ABI of xserv, an embeddable LLM inference library.
 *
 * This one header is the whole stable contract. It is C99 and also valid C++.
 *
 * Conventions
 * - Every fallible function returns an xserv_status. On failure a message naming the cause is
 *   kept per thread and read with xserv_last_error(); the library never prints.
 * - Objects are opaque handles created by xserv_*_load / xserv_*_create and released by the
 *   matching xserv_*_free (which accepts NULL).
 * - Parameter structs are filled by xserv_*_default_params() and then edited by the caller, so
 *   fields added in later versions keep old source compiling. Always start from the defaults.
 *   Growing structs: every params struct starts with `size_t struct_size`, which its
 *   *_default_params() / *_init() function sets to the sizeof the caller was compiled with.
 *   Later versions only append fields; the library reads the fields that fit in struct_size and
 *   uses the defaults for the rest, so hosts compiled against an older header keep working. A
 *   struct_size smaller than sizeof(size_t) is INVALID_ARGUMENT.
 * - No C++ exception, abort or C++ type crosses this boundary; every pointer is checked. A NULL
 *   where an object is required is XSERV_ERR_INVALID_ARGUMENT, never a crash.
 * - Text is UTF-8. Text going in must be valid UTF-8 (XSERV_ERR_INVALID_ARGUMENT otherwise).
 * - Functions that write text or tokens into a caller buffer take (buffer, capacity, &needed):
 *   `needed` always receives the full size; when the buffer is too small nothing useful is
 *   written and XSERV_ERR_BUFFER_TOO_SMALL is returned, so the caller can grow it and call again.
 *   A NULL buffer with capacity 0 is the way to ask for the size.
 *
 * Minimal use:
 *
 *   xserv_model* model = NULL;
 *   xserv_model_params mp = xserv_model_default_params();
 *   if (xserv_model_load("path/to/model", &mp, &model) != XSERV_OK) {
 *     fprintf(stderr, "%s\n", xserv_last_error());
 *     return 1;
 *   }
 *   xserv_generate_params gp = xserv_generate_default_params();
 *   gp.max_tokens = 64;
 *   char* text = NULL;
 *   if (xserv_generate(model, "ROMEO:", &gp, NULL, NULL, &text) == XSERV_OK) puts(text);
 *   xserv_string_free(text);
 *   xserv_model_free(model);
 */
#ifndef XSERV_H
#define XSERV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(XSERV_BUILDING)
#    define XSERV_API __declspec(dllexport)
#  else
#    define XSERV_API __declspec(dllimport)
#  endif
#else
#  define XSERV_API __attribute__((visibility("default")))
#endif

/* The version of this header; xserv_version() gives the library's. */
#define XSERV_VERSION_MAJOR 0
#define XSERV_VERSION_MINOR 1 /* see XSERV_VERSION_MAJOR */
#define XSERV_VERSION_PATCH 0 /* see XSERV_VERSION_MAJOR */
/* The ABI version: the N of libxserv.so.N. Raised only when the ABI breaks. */
#define XSERV_ABI_VERSION 0

/* xserv_generate_params.seed value meaning "draw a fresh seed for every call". */
#define XSERV_SEED_RANDOM UINT64_MAX

#ifdef __cplusplus
extern "C" {
#endif

/* Result of every fallible call. The values are stable. */
typedef enum xserv_status {
  XSERV_OK = 0,
  XSERV_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, an absurd parameter, invalid UTF-8 */
  XSERV_ERR_NOT_FOUND = 2,        /* a file or directory that does not exist */
  XSERV_ERR_IO = 3,               /* a file that cannot be read */
  XSERV_ERR_FORMAT = 4,           /* a corrupt or inconsistent model file */
  XSERV_ERR_UNSUPPORTED = 5,      /* a model type, dtype or device this build cannot run */
  XSERV_ERR_OUT_OF_MEMORY = 6,    /* host or device memory exhausted */
  XSERV_ERR_RESOURCE_EXHAUSTED = 7, /* KV blocks, the context length, the threads the system
                                       grants or a tokenizer pattern's match budget ran out */
  XSERV_ERR_CUDA = 8,             /* a CUDA runtime or cuBLAS failure */
  XSERV_ERR_CANCELLED = 9,        /* stopped by the caller */
  XSERV_ERR_BUFFER_TOO_SMALL = 10, /* a caller buffer is too small; the needed size was returned */
  XSERV_ERR_INTERNAL = 11         /* a bug in xserv: please report it */
} xserv_status;

/* ---- library -------------------------------------------------------------------------- */

/* "0.1.0". Static storage; thread-safe. */
XSERV_API const char* xserv_version(void);

/* A short constant description of a status ("invalid argument"). Thread-safe. */
XSERV_API const char* xserv_status_string(xserv_status status);

/* The message of the last failed call on this thread ("" when none). Valid until the next
 * xserv call on the same thread. Thread-safe: each thread has its own. A successful call does
 * not clear it; look at it only after a call returned an error. */
XSERV_API const char* xserv_last_error(void);

/* True when this build has the CUDA backend and a usable GPU is visible: what
 * XSERV_DEVICE_AUTO picks. Hosts use it to size what differs by device before loading (a
 * server's tokens per step, say). Thread-safe; never fails. */
XSERV_API bool xserv_cuda_available(void);

/* Frees a string the library allocated (xserv_generate's out_text). NULL is a no-op. */
XSERV_API void xserv_string_free(char* str);

/* ---- models --------------------------------------------------------------------------- */

/* A loaded model: weights on a device, its tokenizer and its chat template. Opaque. */
typedef struct xserv_model xserv_model;

/* Where a model runs (xserv_model_params.device). */
typedef enum xserv_device {
  XSERV_DEVICE_AUTO = 0, /* CUDA when this build has it and a GPU is visible, else the CPU */
  XSERV_DEVICE_CPU = 1,
  XSERV_DEVICE_CUDA = 2
} xserv_device;

/* The dtype of a model's weights (xserv_model_params.dtype). */
typedef enum xserv_dtype {
  XSERV_DTYPE_AUTO = 0, /* the checkpoint's own dtype */
  XSERV_DTYPE_F32 = 1,
  XSERV_DTYPE_F16 = 2,
  XSERV_DTYPE_BF16 = 3
} xserv_dtype;

/* Called while a model loads with the fraction done in [0, 1] (the last call has 1). Return
 * true to go on, false to cancel the load (xserv_model_load then returns XSERV_ERR_CANCELLED).
 * Runs on the thread that called xserv_model_load. */
typedef bool (*xserv_progress_callback)(float progress, void* user_data);

/* How xserv_model_load loads a model. Start from xserv_model_default_params(). */
typedef struct xserv_model_params {
  size_t struct_size;      /* set by xserv_model_default_params (see "Growing structs") */
  xserv_device device;     /* default XSERV_DEVICE_AUTO */
  int32_t device_index;    /* which GPU for XSERV_DEVICE_CUDA; default 0 */
  int32_t n_threads;       /* CPU worker threads; 0 (default) = all hardware threads. At most
                              4 per hardware thread and never more than 1024 (more is
                              INVALID_ARGUMENT) */
  /* Weight dtype. AUTO (default) keeps the checkpoint's; another value must equal it in this
   * version (converting at load is XSERV_ERR_UNSUPPORTED). */
  xserv_dtype dtype;
  int32_t max_batch_tokens; /* tokens one forward may hold (prefill chunk); 0 = default (512) */
  xserv_progress_callback progress_callback; /* NULL: none */
  void* progress_user_data;                  /* passed to progress_callback */
  /* Tensor parallelism (docs/parallel.md): the model is split over this many ranks, one per
   * GPU: CUDA devices device_index .. device_index + tensor_parallel_size - 1, joined by NCCL
   * (libnccl.so.2, loaded at run time). On the CPU the ranks are threads of this process (the
   * reference path, for testing). Default 1 (no split). Errors: INVALID_ARGUMENT when < 1 or
   * when it does not divide the model's attention heads (or its KV heads, or does not make a
   * multiple of them) or MLP size; CUDA when there are fewer GPUs than ranks; UNSUPPORTED when
   * NCCL cannot be loaded. Appended in 0.2 (see "Growing structs"). */
  int32_t tensor_parallel_size;
  /* The K/V cache's dtype. AUTO (default): the backend's, i.e. the activation dtype (CUDA: the
   * weights' dtype; CPU: F32, or BF16 for a bf16 model when the environment sets
   * XSERV_CPU_KV=bf16). On the CPU, F32 or BF16 for any weights: BF16 rounds each cached K/V
   * element to bf16 (as a bf16 model's own cache in transformers holds it) and halves the
   * cache's memory and the bytes a long-context decode step reads (docs/cpu.md). On CUDA only
   * the activation dtype. Errors: INVALID_ARGUMENT for a value that is not an xserv_dtype,
   * UNSUPPORTED for one the backend does not read. Appended in 0.2 (see "Growing structs"). */
  xserv_dtype kv_cache_dtype;
} xserv_model_params;

/* The defaults (see each field). Thread-safe. */
XSERV_API xserv_model_params xserv_model_default_params(void);

/* Loads the Hugging Face model directory `path` (config.json, *.safetensors, tokenizer.json or
 * vocab.json + merges.txt, optionally tokenizer_config.json and generation_config.json).
 * `params` may be NULL for the defaults. On success *out_model owns the model (release it with
 * xserv_model_free); on failure *out_model is set to NULL.
 * Only regular files are read (a FIFO or device in their place is IO, never a blocked load);
 * config.json and the other JSON files beside the weights may hold at most 16 MiB, tokenizer
 * files 128 MiB, a safetensors header 100 MB (more is FORMAT). The config is checked against
 * the checkpoint's tensors before anything is sized from it.
 * Errors: INVALID_ARGUMENT (NULL path or out_model, bad params such as n_threads past its cap),
 * NOT_FOUND (no such directory, a required file missing, a shard named by
 * model.safetensors.index.json missing), IO (a file that cannot be read or is not a regular
 * file), FORMAT (corrupt files; the message names file and field: broken JSON, zero, negative
 * or out-of-range config values, a config that disagrees with the checkpoint (e.g. its layer
 * count), tensors with lying offsets, dtypes or shapes, tokenizer ids past the embedding's
 * rows), UNSUPPORTED (architecture, dtype or device this build cannot run), OUT_OF_MEMORY,
 * RESOURCE_EXHAUSTED (the system refused to start the worker threads; nothing is left
 * running), CUDA, CANCELLED (the progress callback returned false). Thread-safe. */
XSERV_API xserv_status xserv_model_load(const char* path, const xserv_model_params* params,
                                        xserv_model** out_model);

/* Releases a model and everything it holds. NULL is a no-op. Must not run concurrently with
 * another call on the same model. */
XSERV_API void xserv_model_free(xserv_model* model);

/* Model facts. A NULL model returns 0 (or NULL for strings) and sets the last error.
 * Strings are owned by the model and valid until xserv_model_free. Thread-safe. */
XSERV_API int32_t xserv_model_n_vocab(const xserv_model* model);  /* tokenizer vocab size */
XSERV_API int32_t xserv_model_n_ctx(const xserv_model* model);    /* max positions */
XSERV_API int32_t xserv_model_n_layer(const xserv_model* model);  /* transformer layers */
XSERV_API int32_t xserv_model_n_embd(const xserv_model* model);   /* hidden size */
XSERV_API int32_t xserv_model_n_head(const xserv_model* model);   /* attention (query) heads */
XSERV_API int32_t xserv_model_n_head_kv(const xserv_model* model); /* key/value heads (GQA) */
XSERV_API const char* xserv_model_arch(const xserv_model* model);   /* "gpt2", "qwen3" */
XSERV_API const char* xserv_model_device(const xserv_model* model); /* "cpu", "cuda" */
/* One line for humans: "gpt2, 6 layers, 384 wide, 50257 tokens, f16 on cpu". */
XSERV_API const char* xserv_model_desc(const xserv_model* model);
/* True when the model's tokenizer_config.json has a chat template (false for NULL). */
XSERV_API bool xserv_model_has_chat_template(const xserv_model* model);

/* ---- tokenizer ------------------------------------------------------------------------ */

/* Encodes NUL-terminated UTF-8 `text` exactly as Hugging Face tokenizers does. No BOS/EOS is
 * added. With allow_special, special tokens written in the text (such as "<|endoftext|>" or
 * "<|im_start|>") become their ids; without it they are encoded as ordinary text, so untrusted
 * input cannot inject them. Writes up to `capacity` ids to `tokens` and the full count to
 * *n_tokens.
 * Errors: INVALID_ARGUMENT (NULL model/text/n_tokens, NULL tokens with capacity > 0, invalid
 * UTF-8), BUFFER_TOO_SMALL (capacity < *n_tokens), RESOURCE_EXHAUSTED (the tokenizer's
 * pre-tokenizer pattern backtracked past its match budget on this text: a pathological
 * pattern in the model's tokenizer.json). Thread-safe: never waits for a generation or an
 * engine step (the tokenizer is immutable). */
XSERV_API xserv_status xserv_tokenize(const xserv_model* model, const char* text,
                                      bool allow_special, int32_t* tokens, size_t capacity,
                                      size_t* n_tokens);

/* Decodes ids to text as Hugging Face tokenizers does. With skip_special, special tokens (such
 * as "<|im_end|>") are left out. Writes the text and a terminating NUL into `text` (capacity
 * bytes including the NUL) and the text length without the NUL to *length. The text is valid
 * UTF-8: bytes of a character that the ids cut off become U+FFFD. Ids of the model's padding
 * rows (>= the tokenizer's vocabulary, < the model's) decode to nothing.
 * Errors: INVALID_ARGUMENT (NULL model/length, NULL tokens with n_tokens > 0, NULL text with
 * capacity > 0, a negative id or one past the model's vocabulary), BUFFER_TOO_SMALL
 * (capacity < *length + 1).
 * Thread-safe. */
XSERV_API xserv_status xserv_detokenize(const xserv_model* model, const int32_t* tokens,
                                        size_t n_tokens, bool skip_special, char* text,
                                        size_t capacity, size_t* length);

/* One message of a conversation. role: "system", "user" or "assistant". */
typedef struct xserv_chat_message {
  const char* role;    /* "system", "user" or "assistant" (NUL-terminated UTF-8) */
  const char* content; /* the message text (NUL-terminated UTF-8) */
} xserv_chat_message;

/* Renders a conversation with the model's chat template (Qwen3: ChatML) into the prompt text,
 * byte for byte as transformers' apply_chat_template does. add_generation_prompt appends the
 * assistant header; enable_thinking = false adds Qwen3's empty <think></think> block. Output
 * convention as xserv_detokenize.
 * Errors: INVALID_ARGUMENT (NULL model/length, NULL messages with n_messages > 0, a NULL role
 * or content, invalid UTF-8, a role the template rejects), UNSUPPORTED (the model has no chat
 * template: see xserv_model_has_chat_template), BUFFER_TOO_SMALL. Thread-safe. */
XSERV_API xserv_status xserv_apply_chat_template(const xserv_model* model,
                                                 const xserv_chat_message* messages,
                                                 size_t n_messages, bool add_generation_prompt,
                                                 bool enable_thinking, char* text,
                                                 size_t capacity, size_t* length);

/* The token ids of a conversation, ready to generate from: the prompt
 * xserv_apply_chat_template renders (with add_generation_prompt and enable_thinking as there),
 * encoded so that the template's own turn markers are special tokens while special-token text
 * inside a message's content stays ordinary text: a user who types "<|im_start|>system" gets
 * those characters, not a new turn. Equal to xserv_tokenize(xserv_apply_chat_template(...),
 * allow_special = true) whenever no content holds special-token text. Without a chat template
 * (GPT-2) the contents joined by "\n", encoded with allow_special = false. Output convention as
 * xserv_tokenize. Use this, not the rendered text with allow_special, for untrusted messages.
 * Errors: as xserv_apply_chat_template (UNSUPPORTED aside: a model without a template joins the
 * contents) and xserv_tokenize. Thread-safe. */
XSERV_API xserv_status xserv_tokenize_chat(const xserv_model* model,
                                           const xserv_chat_message* messages, size_t n_messages,
                                           bool add_generation_prompt, bool enable_thinking,
                                           int32_t* tokens, size_t capacity, size_t* n_tokens);

/* ---- generation ----------------------------------------------------------------------- */

/* Why generation of a sample ended. */
typedef enum xserv_finish_reason {
  XSERV_FINISH_NONE = 0,     /* still running */
  XSERV_FINISH_STOP = 1,     /* an end-of-sequence id, a stop token or a stop string */
  XSERV_FINISH_LENGTH = 2,   /* max_tokens or the model's context length */
  XSERV_FINISH_CANCELLED = 3, /* the token callback returned false, or xserv_engine_cancel */
  XSERV_FINISH_ERROR = 4       /* the request failed (engine events: see their status) */
} xserv_finish_reason;

/* Sampling and stopping for xserv_generate and engine requests. Start from
 * xserv_generate_default_params(). */
typedef struct xserv_generate_params {
  size_t struct_size;       /* set by xserv_generate_default_params (see "Growing structs") */
  int32_t max_tokens;       /* generated tokens at most; default 128 */
  float temperature;        /* 0 = greedy; default 1 */
  int32_t top_k;            /* 0 = off (default) */
  float top_p;              /* 1 = off (default); in (0, 1] */
  float min_p;              /* 0 = off (default); in [0, 1] */
  float repetition_penalty; /* HF semantics over prompt + output; 1 = off (default) */
  float presence_penalty;   /* OpenAI semantics over the output; 0 = off (default) */
  float frequency_penalty;  /* OpenAI semantics over the output; 0 = off (default) */
  uint64_t seed;            /* same seed, prompt and model: same text; default XSERV_SEED_RANDOM */
  /* Generation ends before the first occurrence of any of these strings; the stop string is
   * not part of the output. The array and strings are read during the call only. */
  const char* const* stop_strings;
  size_t n_stop_strings;      /* entries in stop_strings */
  const int32_t* stop_tokens; /* extra ids that end generation (besides the model's eos) */
  size_t n_stop_tokens;       /* entries in stop_tokens */
  bool ignore_eos;            /* keep going past the model's end-of-sequence ids */
} xserv_generate_params;

/* The defaults (see each field). Thread-safe. */
XSERV_API xserv_generate_params xserv_generate_default_params(void);

/* One generated token, as the token callback sees it. The pointer and `text` are valid during
 * the callback only. Fields may be added at the end in later versions. */
typedef struct xserv_token_event {
  int32_t token;              /* the generated id; -1 on a final event without a token of its
                                 own (max_tokens 0, a prompt that fills the context) */
  const char* text;           /* text that became safe to show with this token: only whole UTF-8
                                 characters, nothing that may start a stop string; may be empty */
  size_t text_len;            /* bytes in text (text is also NUL-terminated) */
  xserv_finish_reason finish; /* NONE, or why generation ends with this event */
} xserv_token_event;

/* Called for every generated token on the thread running xserv_generate. Return true to go on,
 * false to stop generation (the call then ends normally with the text so far). It must not
 * free the model; it may call the tokenizer functions on the same model, while xserv_generate
 * on the same model fails with XSERV_ERR_INVALID_ARGUMENT (generation is not reentrant). */
typedef bool (*xserv_token_callback)(const xserv_token_event* event, void* user_data);

/* Generates a continuation of the NUL-terminated UTF-8 `prompt` (raw text: to chat, render the
 * prompt with xserv_apply_chat_template first), blocking until it ends. `params` may be NULL
 * for the defaults; `on_token` may be NULL. When out_text is not NULL it receives the whole
 * generated text (no stop string), allocated by the library: free it with xserv_string_free.
 * On failure *out_text is NULL. A callback that returns false makes the call return XSERV_OK
 * with the text generated so far.
 * The callback's last event always has finish != NONE, even when nothing is generated.
 * Runs on an engine of its own (one sequence, a KV pool of one context, created at the first
 * call): the same loop as xserv_engine_step.
 * Errors: INVALID_ARGUMENT (NULL model or prompt, invalid UTF-8, an empty prompt, absurd
 * params naming the field, a prompt longer than the context), RESOURCE_EXHAUSTED, OUT_OF_MEMORY,
 * CUDA. Thread-safe: calls on one model are serialized (for requests in parallel, use an
 * xserv_engine). */
XSERV_API xserv_status xserv_generate(xserv_model* model, const char* prompt,
                                      const xserv_generate_params* params,
                                      xserv_token_callback on_token, void* user_data,
                                      char** out_text);

/* ---- engine: continuous batching driven by the host ---------------------------------------
 *
 * An engine owns a KV-cache pool and a scheduler over one model (several engines may share a
 * model). The host submits requests from any thread and calls xserv_engine_step() from its own
 * loop (a game's frame, a server's engine thread); each step runs one batched forward over every
 * running request (prompt chunks and decodes mixed under a token budget) and delivers events:
 * to the request's callback when it has one, otherwise to a queue read with xserv_engine_poll().
 * With params.background_thread the engine steps on a thread of its own instead.
 *
 * Thread-safety: xserv_engine_submit, xserv_engine_cancel, xserv_engine_poll,
 * xserv_engine_has_work and xserv_engine_get_stats may be called from any thread at any time.
 * xserv_engine_step must be called from one thread at a time (not at all with
 * background_thread). xserv_engine_free must not run concurrently with any other call on the
 * engine. Tokenizer functions (xserv_tokenize, ...) never wait for a step.
 *
 * Growing structs: every params struct of the engine starts with `struct_size`, which its
 * *_default_params() / *_init() function sets to the sizeof the caller was compiled with. Later
 * versions only append fields; the library reads the fields that fit in struct_size and uses
 * the defaults for the rest, so hosts compiled against an older header keep working. */

/* An engine: a KV-cache pool and a scheduler over one model (see above). Opaque. */
typedef struct xserv_engine xserv_engine;
/* Identifies a request within its engine; never 0 for a submitted request. */
typedef uint64_t xserv_request_id;

/* How xserv_engine_create sizes and runs an engine. Start from xserv_engine_default_params(). */
typedef struct xserv_engine_params {
  size_t struct_size;         /* set by xserv_engine_default_params */
  int32_t max_seqs;           /* requests running at once (the batch); default 256 */
  int32_t max_batch_tokens;   /* tokens per step (prompt chunks + decodes); 0 = the model's */
  /* KV-cache pool size, taken once at creation. kv_cache_tokens > 0 sets it in tokens; else
   * CUDA takes gpu_memory_fraction of the device memory free after weights and workspace, and
   * the CPU takes kv_cache_bytes (0: enough for max_seqs contexts, at most 1/4 of RAM). */
  int64_t kv_cache_tokens;    /* default 0 */
  float gpu_memory_fraction;  /* default 0.9; in (0, 1] */
  uint64_t kv_cache_bytes;    /* default 0 */
  int32_t block_size;         /* tokens per KV block; default 16 */
  bool prefix_cache;          /* reuse the KV of shared prompt prefixes; default true */
  int32_t max_waiting;        /* queued requests at most (submit: RESOURCE_EXHAUSTED); 0 = no limit */
  bool background_thread;     /* step on an engine thread; default false */
  /* Prompt-chunk tokens per step at most (single-token decodes never count), bounding how long
   * a step with decodes in it may take while long prompts are prefilled; 0 (default) = only
   * max_batch_tokens limits them. */
  int32_t max_prefill_tokens;
  /* Overlapped steps (docs/engine.md): in the steady decode state the next step is enqueued
   * before this step's token ids reach the host, so the GPU does not wait for the host's output
   * processing; the same tokens either way. -1 (default): the XSERV_ASYNC_STEPS environment
   * variable (0 or 1) when set, else on for CUDA and off for the CPU; 0: off; 1: on. */
  int32_t async_steps;
} xserv_engine_params;

/* The defaults (see each field), struct_size set. Thread-safe. */
XSERV_API xserv_engine_params xserv_engine_default_params(void);

/* Creates an engine over `model` (which must outlive it). `params` may be NULL for defaults.
 * Errors: INVALID_ARGUMENT (NULL model/out_engine, absurd params), OUT_OF_MEMORY (the KV pool
 * does not fit), CUDA. On failure *out_engine is NULL. Thread-safe. */
XSERV_API xserv_status xserv_engine_create(xserv_model* model, const xserv_engine_params* params,
                                           xserv_engine** out_engine);

/* Stops the background thread (if any), cancels every request (no further events) and releases
 * the engine. NULL is a no-op. */
XSERV_API void xserv_engine_free(xserv_engine* engine);

/* What an xserv_event reports. */
typedef enum xserv_event_type {
  XSERV_EVENT_TOKEN = 1,   /* a generated token; finish != NONE on a sample's last one */
  XSERV_EVENT_FINISHED = 2, /* a sample ended without a token of its own (cancel, an error
                               after admission, a stop string completed by held-back text) */
} xserv_event_type;

/* One of the top log-probabilities at a sampled position. */
typedef struct xserv_top_logprob {
  int32_t token; /* the token id */
  float logprob; /* natural log of its probability under the model's own distribution
                    (log_softmax of the logits, before temperature and penalties), as OpenAI
                    reports it */
} xserv_top_logprob;

/* What a request produced. Pointers are valid during the callback, or (from xserv_engine_poll)
 * until the same thread's next xserv_engine_poll call or xserv_engine_free. Fields may be added
 * at the end in later versions. */
typedef struct xserv_event {
  xserv_event_type type;   /* TOKEN or FINISHED */
  xserv_request_id request; /* the id xserv_engine_submit returned */
  int32_t index;           /* which sample of the request, 0 .. n-1 */
  int32_t token;           /* the generated id (TOKEN), -1 otherwise */
  const char* text;        /* text that became safe to show (NUL-terminated, may be "") */
  size_t text_len;         /* bytes in text */
  float logprob;           /* log-probability of `token` when logprobs were asked, else 0 */
  const xserv_top_logprob* top_logprobs; /* the request's `logprobs` best, most likely first */
  size_t n_top_logprobs;   /* entries in top_logprobs */
  xserv_finish_reason finish; /* NONE, or why this sample ended */
  xserv_status status;     /* XSERV_OK, or why the request failed (finish is then ERROR) */
  const char* error;       /* the failure's message, "" when status is OK */
  /* Usage, valid on the event that ends a sample (finish != NONE): */
  int32_t prompt_tokens;     /* tokens of the prompt */
  int32_t cached_tokens;     /* of which reused from the prefix cache */
  int32_t completion_tokens; /* tokens this sample generated */
} xserv_event;

/* Called on the stepping thread for each event of the request. Must not call xserv_engine_step
 * or xserv_engine_free; may call submit/cancel/poll and the tokenizer functions. */
typedef void (*xserv_event_callback)(const xserv_event* event, void* user_data);

/* One request: exactly one of prompt, prompt_tokens or messages. Read during submit only. */
typedef struct xserv_request {
  size_t struct_size;                  /* set by xserv_request_init */
  const char* prompt;                  /* raw UTF-8 text (special tokens not parsed), or NULL */
  const int32_t* prompt_tokens;        /* or token ids */
  size_t n_prompt_tokens;              /* entries in prompt_tokens */
  const xserv_chat_message* messages;  /* or a conversation, rendered with the chat template */
  size_t n_messages;                   /* (add_generation_prompt on) */
  bool enable_thinking;                /* for messages: Qwen3's thinking block; default false */
  const xserv_generate_params* params; /* sampling and stopping; NULL = defaults */
  int32_t n;                           /* independent samples sharing the prompt; default 1 */
  int32_t logprobs;                    /* top log-probabilities per token, 0..20; default 0 */
  xserv_event_callback on_event;       /* NULL: events go to xserv_engine_poll */
  void* user_data;                     /* passed to on_event */
} xserv_request;

/* Zeroes *request, sets struct_size and the defaults (n = 1). Thread-safe. */
XSERV_API void xserv_request_init(xserv_request* request);

/* Queues a request; *out_id identifies it in events. Returns at once: a problem found here is
 * the return status (INVALID_ARGUMENT: NULL pointers, no prompt or more than one, invalid UTF-8,
 * absurd params, a prompt past the model's context; UNSUPPORTED: messages without a chat
 * template; RESOURCE_EXHAUSTED: max_waiting requests already queued). A request that cannot run
 * later (it can never fit in the KV pool) ends with an event whose status says why; other
 * requests go on. Thread-safe. */
XSERV_API xserv_status xserv_engine_submit(xserv_engine* engine, const xserv_request* request,
                                           xserv_request_id* out_id);

/* Ends a request: its blocks are freed at the next step and its samples end with finish
 * CANCELLED. Unknown or finished ids are ignored (XSERV_OK). Thread-safe. */
XSERV_API xserv_status xserv_engine_cancel(xserv_engine* engine, xserv_request_id id);

/* Runs one step: schedule, one batched forward, sampling, events. Does nothing and returns OK
 * when there is no work. *n_events (may be NULL) receives the number of events it produced.
 * Errors: INVALID_ARGUMENT (NULL engine, called with background_thread), CUDA / OUT_OF_MEMORY /
 * INTERNAL when the forward itself failed (every running request then ends with that status).
 * Call from one thread at a time. */
XSERV_API xserv_status xserv_engine_step(xserv_engine* engine, size_t* n_events);

/* True while requests are queued or running. Thread-safe. */
XSERV_API bool xserv_engine_has_work(const xserv_engine* engine);

/* Takes the oldest queued event of requests submitted without a callback. *got is false when
 * none is queued (the call does not wait). Thread-safe. */
XSERV_API xserv_status xserv_engine_poll(xserv_engine* engine, xserv_event* out_event, bool* got);

/* A snapshot of an engine's state and counters (xserv_engine_get_stats). */
typedef struct xserv_engine_stats {
  size_t struct_size;          /* set by the caller to sizeof(xserv_engine_stats) */
  int32_t running;             /* requests (samples) in the batch */
  int32_t waiting;             /* queued, not yet admitted (preempted ones included) */
  int32_t kv_blocks_total;     /* blocks in the KV-cache pool */
  int32_t kv_blocks_used;      /* of which in use */
  int32_t block_size;          /* tokens per block */
  uint64_t prefix_queries;     /* prompt blocks looked up in the prefix cache */
  uint64_t prefix_hits;        /* of which found */
  uint64_t preemptions;        /* requests preempted (recomputed later) */
  uint64_t steps;              /* engine steps taken */
  uint64_t prompt_tokens;      /* prompt tokens computed (cached ones not counted) */
  uint64_t generated_tokens;   /* tokens sampled, all samples together */
} xserv_engine_stats;

/* Fills *out (fields up to out->struct_size). Thread-safe. */
XSERV_API xserv_status xserv_engine_get_stats(const xserv_engine* engine, xserv_engine_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* XSERV_H */

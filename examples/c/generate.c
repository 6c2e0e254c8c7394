/* The smallest complete xserv program in C: load a model, stream a continuation of a prompt.
 *
 *   cc -std=c99 generate.c $(pkg-config --cflags --libs xserv) -o generate
 *   ./generate examples/models/shakespeare "ROMEO:"
 */
#include <stdio.h>
#include <stdlib.h>

#include <xserv.h>

/* Called for every generated token; returning false would stop generation. */
static bool print_token(const xserv_token_event* event, void* user_data) {
  (void)user_data;
  fwrite(event->text, 1, event->text_len, stdout);
  fflush(stdout);
  return true;
}

int main(int argc, char** argv) {
  xserv_model* model = NULL;
  xserv_model_params model_params = xserv_model_default_params();
  xserv_generate_params params = xserv_generate_default_params();
  const char* prompt = argc > 2 ? argv[2] : "ROMEO:";

  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL_DIR [PROMPT] [MAX_TOKENS]\n", argv[0]);
    return 2;
  }
  if (xserv_model_load(argv[1], &model_params, &model) != XSERV_OK) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], xserv_last_error());
    return 1;
  }
  fprintf(stderr, "xserv %s: %s\n", xserv_version(), xserv_model_desc(model));

  params.max_tokens = argc > 3 ? atoi(argv[3]) : 64;
  params.temperature = 0.8f;
  params.top_k = 40;
  params.seed = 42;
  fputs(prompt, stdout);
  if (xserv_generate(model, prompt, &params, print_token, NULL, NULL) != XSERV_OK) {
    fprintf(stderr, "\ngeneration failed: %s\n", xserv_last_error());
    xserv_model_free(model);
    return 1;
  }
  putchar('\n');
  xserv_model_free(model);
  return 0;
}

/* Compiled as strict C99 with -Wall -Wextra -pedantic -Werror: xserv.h must stay plain C. */
#include "xserv.h"

#include <stdio.h>
#include <string.h>

int main(void) {
  xserv_model_params mp = xserv_model_default_params();
  xserv_generate_params gp = xserv_generate_default_params();
  xserv_chat_message msg = {"user", "hi"};
  (void)mp;
  (void)gp;
  (void)msg;
  return strcmp(xserv_version(), "") == 0 ? 1 : 0;
}

/* The check macro of the C API tests (C99): counts checks and failures, prints each failure with
 * xserv_last_error(). Each test is a program of its own, so the counters live here. */
#ifndef XSERV_TESTS_C_CHECK_H
#define XSERV_TESTS_C_CHECK_H

#include <stdio.h>

#include "xserv.h"

static int g_checks = 0;
static int g_failures = 0;

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    ++g_checks;                                                                            \
    if (!(cond)) {                                                                         \
      ++g_failures;                                                                        \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: '%s'\n", __FILE__, __LINE__, \
              #cond, xserv_last_error());                                                  \
    }                                                                                      \
  } while (0)

#endif

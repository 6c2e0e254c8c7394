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
 *   fields added in later versions keep old source compiling.
 * - No C++ exception, abort or C++ type crosses this boundary; every pointer is checked.
 */
#ifndef XSERV_H
#define XSERV_H

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

#define XSERV_VERSION_MAJOR 0
#define XSERV_VERSION_MINOR 1
#define XSERV_VERSION_PATCH 0
/* The ABI version: the N of libxserv.so.N. Raised only when the ABI breaks. */
#define XSERV_ABI_VERSION 0

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
  XSERV_ERR_RESOURCE_EXHAUSTED = 7, /* KV blocks or the context length ran out */
  XSERV_ERR_CUDA = 8,             /* a CUDA runtime or cuBLAS failure */
  XSERV_ERR_CANCELLED = 9,        /* stopped by the caller */
  XSERV_ERR_BUFFER_TOO_SMALL = 10, /* a caller buffer is too small; the needed size was returned */
  XSERV_ERR_INTERNAL = 11         /* a bug in xserv: please report it */
} xserv_status;

/* "0.1.0". Static storage; thread-safe. */
XSERV_API const char* xserv_version(void);

/* A short constant description of a status ("invalid argument"). Thread-safe. */
XSERV_API const char* xserv_status_string(xserv_status status);

/* The message of the last failed call on this thread ("" when none). Valid until the next
 * xserv call on the same thread. Thread-safe: each thread has its own. */
XSERV_API const char* xserv_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* XSERV_H */

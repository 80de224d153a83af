/* What the C tests of several processes under mncl-run share: CHECK_OK, which reports a call
 * that did not return MNCL_OK (naming the rank, the call, its status and message) and counts
 * it, and sleep_ms. Each test sets g_rank once it knows it and exits non-zero on g_failures. */
#ifndef MNCL_TESTS_COMMON_MP_CHECKS_H
#define MNCL_TESTS_COMMON_MP_CHECKS_H

#include <mncl/mncl.h>
#include <stdio.h>
#include <time.h>

static int g_rank = -1;
static int g_failures = 0;

#define CHECK_OK(call)                                                                 \
  do {                                                                                 \
    mncl_status_t st_ = (call);                                                        \
    if (st_ != MNCL_OK) {                                                              \
      fprintf(stderr, "rank %d: %s: %s: %s\n", g_rank, #call, mncl_status_string(st_), \
              mncl_last_error());                                                      \
      g_failures++;                                                                    \
    }                                                                                  \
  } while (0)

static inline void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

#endif /* MNCL_TESTS_COMMON_MP_CHECKS_H */

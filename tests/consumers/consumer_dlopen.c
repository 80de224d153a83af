/*
 * A consumer that does not link libmncl: it dlopen()s the library (path given at build time
 * as MNCL_LIBRARY_PATH) and resolves the API by name, as language bindings (ctypes, cffi,
 * JNI) do. This checks that the mncl_* symbols are exported with C names and that the library
 * is self-contained enough to be loaded at run time.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <mncl/mncl.h>
#include <stdio.h>
#include <string.h>

#ifndef MNCL_LIBRARY_PATH
#error "MNCL_LIBRARY_PATH must name libmncl.so"
#endif

#define N 7

typedef mncl_status_t (*comm_create_fn)(const mncl_config_t *, mncl_comm_t *);
typedef mncl_status_t (*comm_destroy_fn)(mncl_comm_t);
typedef mncl_status_t (*comm_query_fn)(mncl_comm_t, int *);
typedef mncl_status_t (*allreduce_fn)(mncl_comm_t, const void *, void *, size_t, mncl_dtype_t,
                                      mncl_op_t, void *);
typedef const char *(*last_error_fn)(void);
typedef const char *(*status_string_fn)(mncl_status_t);
typedef int (*get_version_fn)(void);

/* Resolves a symbol into a function pointer (the POSIX-sanctioned conversion). */
static int resolve(void *lib, const char *name, void *fn_ptr_location) {
  void *sym = dlsym(lib, name);
  if (!sym) {
    fprintf(stderr, "consumer_dlopen: dlsym(%s): %s\n", name, dlerror());
    return 0;
  }
  memcpy(fn_ptr_location, &sym, sizeof(sym));
  return 1;
}

int main(void) {
  void *lib = dlopen(MNCL_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  comm_create_fn create;
  comm_destroy_fn destroy;
  comm_query_fn rank_of, size_of;
  allreduce_fn allreduce;
  last_error_fn last_error;
  status_string_fn status_string;
  get_version_fn get_version;
  mncl_comm_t comm = NULL;
  mncl_status_t st;
  int rank = -1, size = -1, i, ok = 1;
  int64_t x[N], y[N];

  if (!lib) {
    fprintf(stderr, "consumer_dlopen: dlopen(%s): %s\n", MNCL_LIBRARY_PATH, dlerror());
    return 1;
  }
  if (!resolve(lib, "mncl_comm_create", &create) || !resolve(lib, "mncl_comm_destroy", &destroy) ||
      !resolve(lib, "mncl_comm_rank", &rank_of) || !resolve(lib, "mncl_comm_size", &size_of) ||
      !resolve(lib, "mncl_allreduce", &allreduce) ||
      !resolve(lib, "mncl_last_error", &last_error) ||
      !resolve(lib, "mncl_status_string", &status_string) ||
      !resolve(lib, "mncl_get_version", &get_version))
    return 1;
  /* Internals must not be exported. */
  if (dlsym(lib, "_ZN4mncl5ErrorD1Ev") || dlsym(lib, "_ZN4mncl4core4Comm6createEPK11mncl_config")) {
    fprintf(stderr, "consumer_dlopen: libmncl exports C++ internals\n");
    ok = 0;
  }

  st = create(NULL, &comm);
  if (st != MNCL_OK) {
    fprintf(stderr, "consumer_dlopen: mncl_comm_create: %s: %s\n", status_string(st), last_error());
    return 1;
  }
  rank_of(comm, &rank);
  size_of(comm, &size);
  for (i = 0; i < N; ++i) x[i] = (int64_t)i * 1000 + rank;
  st = allreduce(comm, x, y, N, MNCL_INT64, MNCL_SUM, NULL);
  if (st != MNCL_OK) {
    fprintf(stderr, "consumer_dlopen: mncl_allreduce: %s: %s\n", status_string(st), last_error());
    ok = 0;
  } else {
    for (i = 0; i < N; ++i) {
      int64_t want = (int64_t)i * 1000 * size + (int64_t)size * (size - 1) / 2;
      if (y[i] != want) {
        fprintf(stderr, "consumer_dlopen: rank %d: y[%d] = %lld, want %lld\n", rank, i,
                (long long)y[i], (long long)want);
        ok = 0;
      }
    }
  }
  st = destroy(comm);
  if (st != MNCL_OK) {
    fprintf(stderr, "consumer_dlopen: mncl_comm_destroy: %s: %s\n", status_string(st),
            last_error());
    ok = 0;
  }
  printf("consumer_dlopen: rank %d of %d, library version %d: %s\n", rank, size, get_version(),
         ok ? "PASS" : "FAIL");
  dlclose(lib);
  return ok ? 0 : 1;
}

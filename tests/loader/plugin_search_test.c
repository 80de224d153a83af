/*
 * plugin_search_test <libmncl> [<expected text>...]
 *
 * Loads libmncl with dlopen(<libmncl>) — a relative name ("./libmncl.so") is taken from the
 * working directory, as for an application started with LD_LIBRARY_PATH=lib or one calling
 * dlopen("lib/libmncl.so") — then changes to a fresh empty folder, and creates a 1-rank
 * communicator (MNCL_BACKEND, MNCL_PLUGIN_PATH as the environment says; ctest sets them).
 *
 * With no expected text the creation must succeed (the backend is printed): libmncl found its
 * default plugin folder although the name it was loaded by no longer leads there. With some, it
 * must fail with MNCL_ERR_PLUGIN and mncl_last_error() must contain each text.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mncl/mncl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOOKUP(handle, fn)                                       \
  __typeof__(&fn) p_##fn = (__typeof__(&fn))dlsym(handle, #fn);  \
  if (p_##fn == NULL) {                                          \
    fprintf(stderr, "FAIL: %s not found: %s\n", #fn, dlerror()); \
    return 1;                                                    \
  }

int main(int argc, char **argv) {
  char folder[] = "/tmp/mncl-plugin-search-XXXXXX";
  void *lib;
  mncl_comm_t comm = NULL;
  mncl_status_t status;
  const char *backend = "?";
  int i, failed = 0;
  if (argc < 2) {
    fprintf(stderr, "usage: %s <libmncl> [<expected text>...]\n", argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "FAIL: dlopen(%s): %s\n", argv[1], dlerror());
    return 1;
  }
  {
    LOOKUP(lib, mncl_comm_create)
    LOOKUP(lib, mncl_comm_destroy)
    LOOKUP(lib, mncl_comm_backend)
    LOOKUP(lib, mncl_last_error)
    if (mkdtemp(folder) == NULL || chdir(folder) != 0) {
      perror("FAIL: mkdtemp/chdir");
      return 1;
    }
    printf("loaded %s, now in %s\n", argv[1], folder);
    status = p_mncl_comm_create(NULL, &comm);
    if (status == MNCL_OK) {
      p_mncl_comm_backend(comm, &backend);
      printf("created a communicator on %s\n", backend);
      p_mncl_comm_destroy(comm);
    } else {
      printf("mncl_comm_create: status %d: %s\n", (int)status, p_mncl_last_error());
    }
    if (argc == 2) {
      failed = status != MNCL_OK;
    } else if (status != MNCL_ERR_PLUGIN) {
      fprintf(stderr, "FAIL: expected MNCL_ERR_PLUGIN\n");
      failed = 1;
    } else {
      for (i = 2; i < argc; ++i) {
        if (strstr(p_mncl_last_error(), argv[i]) == NULL) {
          fprintf(stderr, "FAIL: the error does not contain: %s\n", argv[i]);
          failed = 1;
        }
      }
    }
  }
  if (chdir("/") != 0 || rmdir(folder) != 0) perror("warning: removing the temporary folder");
  printf("%s\n", failed ? "FAIL" : "PASS");
  return failed;
}

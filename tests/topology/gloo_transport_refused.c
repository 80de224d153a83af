/*
 * gloo_transport_refused.c: the gloo plugin, dlopen()ed directly (no libmncl, so no core probe
 * stands in front of comm_create), refuses MNCL_GLOO_TRANSPORT=ibverbs: this Gloo's ibverbs
 * transport has no unbound buffers, which every MNCL gloo operation uses. The probe scores 0
 * with the reason and comm_create fails with MNCL_ERR_NOT_SUPPORTED and the same explanation,
 * before it touches a device or the store. A value that is no transport at all stays
 * comm_create's MNCL_ERR_INVALID_ARGUMENT ("expected tcp") and leaves the probe's score alone.
 *
 * Usage: gloo_transport_refused <path to libmncl-gloo.so>
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <mncl/mncl_plugin.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_error[1024];
static int g_failures = 0;

static void host_log(int32_t level, const char *file, int32_t line, const char *fmt, ...) {
  (void)level;
  (void)file;
  (void)line;
  (void)fmt;
}

static void host_set_error(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(g_error, sizeof g_error, fmt, args);
  va_end(args);
}

static const char *host_get_env(const char *name) {
  return getenv(name);
}

/* The store must never be used: every call fails the test. */
static int g_store_calls = 0;
static mncl_status_t store_set(void *ctx, const char *key, const void *value, size_t len) {
  (void)ctx, (void)key, (void)value, (void)len;
  ++g_store_calls;
  return MNCL_ERR_INTERNAL;
}
static mncl_status_t store_get(void *ctx, const char *key, void **value, size_t *len,
                               int64_t timeout_ms) {
  (void)ctx, (void)key, (void)value, (void)len, (void)timeout_ms;
  ++g_store_calls;
  return MNCL_ERR_INTERNAL;
}
static void store_release(void *ctx, void *value) {
  (void)ctx, (void)value;
}
static mncl_status_t store_add(void *ctx, const char *key, int64_t delta, int64_t *result) {
  (void)ctx, (void)key, (void)delta, (void)result;
  ++g_store_calls;
  return MNCL_ERR_INTERNAL;
}
static mncl_status_t store_wait(void *ctx, const char *const *keys, size_t nkeys,
                                int64_t timeout_ms) {
  (void)ctx, (void)keys, (void)nkeys, (void)timeout_ms;
  ++g_store_calls;
  return MNCL_ERR_INTERNAL;
}
static mncl_status_t store_del(void *ctx, const char *key) {
  (void)ctx, (void)key;
  ++g_store_calls;
  return MNCL_ERR_INTERNAL;
}

static void check(int ok, const char *what, const char *detail) {
  printf("%s: %s%s%s\n", ok ? "ok  " : "FAIL", what, detail ? ": " : "", detail ? detail : "");
  if (!ok) ++g_failures;
}

/* Probes and creates a 2-rank communicator under MNCL_GLOO_TRANSPORT=setting. */
static void run(const mncl_plugin_v1_t *plugin, const char *setting, int32_t want_score_positive,
                mncl_status_t want_status, const char *want_text) {
  mncl_probe_v1_t info;
  mncl_store_v1_t store;
  mncl_bootstrap_v1_t bs;
  char reason[512] = "";
  char what[256];
  int32_t score = -1;
  void *comm = NULL;
  mncl_status_t st;

  setenv("MNCL_GLOO_TRANSPORT", setting, 1);
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  info.size = 2;
  info.local_size = 1;
  info.num_hosts = 2;
  info.num_gpus = 0;
  info.has_infiniband = 1; /* even with InfiniBand */
  info.launched_by_mpi = 0;
  st = plugin->probe(&info, &score, reason, sizeof reason);
  snprintf(what, sizeof what, "MNCL_GLOO_TRANSPORT=%s: probe score %d", setting, (int)score);
  check(st == MNCL_OK && (want_score_positive ? score > 0 : score == 0), what, reason);
  if (!want_score_positive) {
    snprintf(what, sizeof what, "MNCL_GLOO_TRANSPORT=%s: probe reason names '%s'", setting,
             want_text);
    check(strstr(reason, want_text) != NULL, what, reason);
  }

  memset(&store, 0, sizeof store);
  store.struct_size = sizeof store;
  store.set = store_set;
  store.get = store_get;
  store.release = store_release;
  store.add = store_add;
  store.wait = store_wait;
  store.del = store_del;
  memset(&bs, 0, sizeof bs);
  bs.struct_size = sizeof bs;
  bs.rank = 0;
  bs.size = 2;
  bs.local_rank = 0;
  bs.local_size = 1;
  bs.num_hosts = 2;
  bs.device = -1;
  bs.timeout_ms = 2000;
  bs.comm_id = "w";
  bs.store = &store;
  g_error[0] = '\0';
  g_store_calls = 0;
  st = plugin->comm_create(&bs, &comm);
  snprintf(what, sizeof what, "MNCL_GLOO_TRANSPORT=%s: comm_create returns %d (want %d)", setting,
           (int)st, (int)want_status);
  check(st == want_status && comm == NULL, what, g_error);
  snprintf(what, sizeof what, "MNCL_GLOO_TRANSPORT=%s: comm_create's error names '%s'", setting,
           want_text);
  check(strstr(g_error, want_text) != NULL, what, g_error);
  check(g_store_calls == 0, "comm_create refused before using the store", NULL);
  if (st == MNCL_OK && comm != NULL) plugin->comm_destroy(comm);
}

int main(int argc, char **argv) {
  static mncl_host_v1_t host;
  const mncl_plugin_v1_t *plugin;
  void *lib;

  if (argc != 2) {
    fprintf(stderr, "usage: %s <libmncl-gloo.so>\n", argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  plugin = (const mncl_plugin_v1_t *)dlsym(lib, "mncl_plugin_v1");
  if (plugin == NULL) {
    fprintf(stderr, "%s: no mncl_plugin_v1\n", argv[1]);
    return 1;
  }
  host.struct_size = sizeof host;
  host.version = 0;
  host.log_level = MNCL_LOG_NONE;
  host.log = host_log;
  host.set_error = host_set_error;
  host.get_env = host_get_env;
  if (plugin->init(&host) != MNCL_OK) {
    fprintf(stderr, "gloo init failed: %s\n", g_error);
    return 1;
  }

  run(plugin, "ibverbs", 0, MNCL_ERR_NOT_SUPPORTED, "no unbound buffers");
  run(plugin, "verbs", 1, MNCL_ERR_INVALID_ARGUMENT, "expected tcp");

  if (plugin->finalize != NULL) plugin->finalize();
  dlclose(lib);
  printf("%s\n", g_failures == 0 ? "PASS" : "FAIL");
  return g_failures == 0 ? 0 : 1;
}

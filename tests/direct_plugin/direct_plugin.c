/*
 * direct_plugin.c — the "other framework" case: a C program that uses an MNCL backend plugin
 * WITHOUT libmncl. It dlopen()s libmncl-<name>.so, takes its mncl_plugin_v1 table, gives it a
 * host (log, error, environment) and a bootstrap store of its own, and runs a 2-rank allreduce
 * (and a broadcast) through the table, as a framework with its own runtime would.
 *
 * The two ranks are two forked processes; the store is a folder of files, one per key (written
 * to a temporary name, then renamed into place, so a reader sees whole values only), with
 * add() serialized by an fcntl lock. Keys are escaped into file names.
 *
 * Usage: direct_plugin <path to libmncl-naive.so> [store folder]
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <mncl/mncl_plugin.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NRANKS 2
#define COUNT 1000
#define TIMEOUT_MS 20000

/* ---------------------------------------------------------------------------------------------
 * The host services (one thread per process here, so a static error buffer is enough).
 * ------------------------------------------------------------------------------------------- */

static char g_error[1024];
static int g_rank = -1;

static void host_log(int32_t level, const char *file, int32_t line, const char *fmt, ...) {
  va_list args;
  fprintf(stderr, "[rank %d plugin log %d %s:%d] ", g_rank, (int)level, file, (int)line);
  va_start(args, fmt);
  vfprintf(stderr, fmt, args);
  va_end(args);
  fputc('\n', stderr);
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

/* ---------------------------------------------------------------------------------------------
 * The store: a folder shared by the ranks.
 * ------------------------------------------------------------------------------------------- */

typedef struct dir_store {
  const char *dir;
  unsigned long tmp_seq;
} dir_store_t;

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* dir/<key with every byte outside [A-Za-z0-9._-] written as %XX>. */
static void key_path(const dir_store_t *s, const char *key, char *path, size_t len) {
  size_t n = (size_t)snprintf(path, len, "%s/k.", s->dir);
  for (; *key != '\0' && n + 4 < len; ++key) {
    const unsigned char c = (unsigned char)*key;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-') {
      path[n++] = (char)c;
    } else {
      n += (size_t)snprintf(path + n, len - n, "%%%02X", c);
    }
  }
  path[n] = '\0';
}

static mncl_status_t write_file(dir_store_t *s, const char *path, const void *data, size_t len) {
  char tmp[4096];
  FILE *f;
  snprintf(tmp, sizeof tmp, "%s/tmp.%ld.%lu", s->dir, (long)getpid(), s->tmp_seq++);
  f = fopen(tmp, "wb");
  if (f == NULL || (len > 0 && fwrite(data, 1, len, f) != len) || fclose(f) != 0 ||
      rename(tmp, path) != 0) {
    host_set_error("store: cannot write %s: %s", path, strerror(errno));
    return MNCL_ERR_SYSTEM;
  }
  return MNCL_OK;
}

/* Reads a whole file into malloc'ed memory; 0 if it does not exist (yet). */
static int read_file(const char *path, void **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t size = 0, cap = 0, got;
  if (f == NULL) return 0;
  do {
    if (size == cap) {
      char *grown = (char *)realloc(buf, cap = cap ? 2 * cap : 4096);
      if (grown == NULL) break;
      buf = grown;
    }
    got = fread(buf + size, 1, cap - size, f);
    size += got;
  } while (got > 0);
  fclose(f);
  *data = buf;
  *len = size;
  return 1;
}

static mncl_status_t store_set(void *ctx, const char *key, const void *value, size_t len) {
  char path[4096];
  key_path((dir_store_t *)ctx, key, path, sizeof path);
  return write_file((dir_store_t *)ctx, path, value, len);
}

static mncl_status_t store_get(void *ctx, const char *key, void **value, size_t *len,
                               int64_t timeout_ms) {
  char path[4096];
  const long long deadline = now_ms() + timeout_ms;
  key_path((dir_store_t *)ctx, key, path, sizeof path);
  while (!read_file(path, value, len)) {
    if (now_ms() >= deadline) {
      host_set_error("store: key '%s' did not appear within %lld ms", key, (long long)timeout_ms);
      return MNCL_ERR_TIMEOUT;
    }
    sleep_ms(1);
  }
  return MNCL_OK;
}

static void store_release(void *ctx, void *value) {
  (void)ctx;
  free(value);
}

static mncl_status_t store_add(void *ctx, const char *key, int64_t delta, int64_t *result) {
  dir_store_t *s = (dir_store_t *)ctx;
  char path[4096], lock_path[4096], text[32];
  struct flock lock;
  void *old = NULL;
  size_t len = 0;
  long long value = 0;
  mncl_status_t st;
  int fd;
  snprintf(lock_path, sizeof lock_path, "%s/lock", s->dir);
  fd = open(lock_path, O_RDWR | O_CREAT, 0600);
  memset(&lock, 0, sizeof lock);
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  if (fd < 0 || fcntl(fd, F_SETLKW, &lock) != 0) {
    host_set_error("store: cannot lock %s: %s", lock_path, strerror(errno));
    if (fd >= 0) close(fd);
    return MNCL_ERR_SYSTEM;
  }
  key_path(s, key, path, sizeof path);
  if (read_file(path, &old, &len)) {
    char buf[32];
    const size_t n = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, old, n);
    buf[n] = '\0';
    value = strtoll(buf, NULL, 10);
    free(old);
  }
  value += delta;
  snprintf(text, sizeof text, "%lld", value);
  st = write_file(s, path, text, strlen(text));
  close(fd); /* releases the lock */
  *result = value;
  return st;
}

static mncl_status_t store_wait(void *ctx, const char *const *keys, size_t nkeys,
                                int64_t timeout_ms) {
  const long long deadline = now_ms() + timeout_ms;
  char path[4096];
  size_t i = 0;
  struct stat st;
  while (i < nkeys) {
    key_path((dir_store_t *)ctx, keys[i], path, sizeof path);
    if (stat(path, &st) == 0) {
      ++i;
    } else if (now_ms() >= deadline) {
      host_set_error("store: key '%s' did not appear within %lld ms", keys[i],
                     (long long)timeout_ms);
      return MNCL_ERR_TIMEOUT;
    } else {
      sleep_ms(1);
    }
  }
  return MNCL_OK;
}

static mncl_status_t store_del(void *ctx, const char *key) {
  char path[4096];
  key_path((dir_store_t *)ctx, key, path, sizeof path);
  if (unlink(path) != 0 && errno != ENOENT) {
    host_set_error("store: cannot delete %s: %s", path, strerror(errno));
    return MNCL_ERR_SYSTEM;
  }
  return MNCL_OK;
}

/* ---------------------------------------------------------------------------------------------
 * One rank: load, init, probe, create, allreduce, bcast, destroy, finalize.
 * ------------------------------------------------------------------------------------------- */

#define CHECK(call, what)                                                                        \
  do {                                                                                           \
    const mncl_status_t st_ = (call);                                                            \
    if (st_ != MNCL_OK) {                                                                        \
      fprintf(stderr, "rank %d: %s failed with status %d: %s\n", rank, what, (int)st_, g_error); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

static int run_rank(const char *plugin_path, const char *dir, int rank) {
  const mncl_plugin_v1_t *table;
  mncl_host_v1_t host;
  mncl_store_v1_t store;
  mncl_bootstrap_v1_t bs;
  mncl_probe_v1_t probe;
  mncl_coll_v1_t coll;
  dir_store_t ctx;
  char reason[256] = "";
  int32_t score = 0;
  void *comm = NULL, *lib, *sym;
  static int64_t x[COUNT], y[COUNT];
  int i, bad = 0;

  g_rank = rank;
  lib = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "rank %d: dlopen(%s): %s\n", rank, plugin_path, dlerror());
    return 1;
  }
  sym = dlsym(lib, MNCL_PLUGIN_V1_SYMBOL);
  if (sym == NULL) {
    fprintf(stderr, "rank %d: %s exports no %s\n", rank, plugin_path, MNCL_PLUGIN_V1_SYMBOL);
    return 1;
  }
  table = (const mncl_plugin_v1_t *)sym;
  /* The checks the core makes before trusting a table. */
  if (table->magic != MNCL_PLUGIN_MAGIC || table->abi_version != MNCL_PLUGIN_ABI_V1 ||
      table->struct_size < sizeof(mncl_plugin_v1_t) || table->execute == NULL ||
      !(table->coll_mask & MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE))) {
    fprintf(stderr, "rank %d: %s: not a usable v1 table\n", rank, plugin_path);
    return 1;
  }

  host.struct_size = sizeof host;
  host.version = MNCL_VERSION;
  host.log_level = MNCL_LOG_WARN;
  host.log = host_log;
  host.set_error = host_set_error;
  host.get_env = host_get_env;
  CHECK(table->init(&host), "init");

  probe.struct_size = sizeof probe;
  probe.size = NRANKS;
  probe.local_size = NRANKS;
  probe.num_hosts = 1;
  probe.num_gpus = 0;
  probe.has_infiniband = 0;
  probe.launched_by_mpi = 0;
  CHECK(table->probe(&probe, &score, reason, sizeof reason), "probe");
  if (rank == 0)
    printf("plugin '%s' %s: probe score %d (%s)\n", table->name, table->version, (int)score,
           reason);

  ctx.dir = dir;
  ctx.tmp_seq = 0;
  store.struct_size = sizeof store;
  store.ctx = &ctx;
  store.set = store_set;
  store.get = store_get;
  store.release = store_release;
  store.add = store_add;
  store.wait = store_wait;
  store.del = store_del;

  memset(&bs, 0, sizeof bs);
  bs.struct_size = sizeof bs;
  bs.rank = rank;
  bs.size = NRANKS;
  bs.local_rank = rank;
  bs.local_size = NRANKS;
  bs.num_hosts = 1;
  bs.device = -1;
  bs.timeout_ms = TIMEOUT_MS;
  bs.comm_id = "fw";
  bs.store = &store;
  CHECK(table->comm_create(&bs, &comm), "comm_create");

  /* allreduce (sum): y[i] = (i + 0) + (i + 1000000) */
  for (i = 0; i < COUNT; ++i) x[i] = i + (int64_t)rank * 1000000;
  memset(&coll, 0, sizeof coll);
  coll.struct_size = sizeof coll;
  coll.kind = MNCL_COLL_ALLREDUCE;
  coll.dtype = MNCL_INT64;
  coll.op = MNCL_SUM;
  coll.root = -1;
  coll.sendbuf = x;
  coll.recvbuf = y;
  coll.count = COUNT;
  coll.seq = 0;
  coll.timeout_ms = TIMEOUT_MS;
  CHECK(table->execute(comm, &coll), "execute(allreduce)");
  for (i = 0; i < COUNT; ++i) bad += y[i] != 2 * (int64_t)i + 1000000;

  /* bcast from rank 1, in place. */
  for (i = 0; i < COUNT; ++i) y[i] = rank == 1 ? 7 * (int64_t)i : -1;
  coll.kind = MNCL_COLL_BCAST;
  coll.root = 1;
  coll.sendbuf = y;
  coll.recvbuf = y;
  coll.seq = 1;
  CHECK(table->execute(comm, &coll), "execute(bcast)");
  for (i = 0; i < COUNT; ++i) bad += y[i] != 7 * (int64_t)i;

  CHECK(table->comm_destroy(comm), "comm_destroy");
  if (table->finalize) table->finalize();
  if (dlopen("libmncl.so.1", RTLD_NOW | RTLD_NOLOAD) != NULL) {
    fprintf(stderr, "rank %d: libmncl.so.1 got loaded; the plugin must not need it\n", rank);
    ++bad;
  }
  dlclose(lib);
  if (bad) {
    fprintf(stderr, "rank %d: %d wrong elements\n", rank, bad);
    return 1;
  }
  printf("rank %d: allreduce and bcast of %d int64 through %s: correct\n", rank, COUNT,
         MNCL_PLUGIN_V1_SYMBOL);
  return 0;
}

int main(int argc, char **argv) {
  char dir_template[] = "/tmp/mncl-direct-plugin.XXXXXX";
  const char *dir;
  pid_t pids[NRANKS];
  int r, failed = 0, leftover = 0;
  char cmd[4200];

  if (argc < 2) {
    fprintf(stderr, "usage: %s <libmncl-<name>.so> [store folder]\n", argv[0]);
    return 2;
  }
  dir = argc > 2 ? argv[2] : mkdtemp(dir_template);
  if (dir == NULL || (argc > 2 && mkdir(dir, 0700) != 0 && errno != EEXIST)) {
    perror("store folder");
    return 1;
  }
  fflush(stdout);
  for (r = 0; r < NRANKS; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      const int rc = run_rank(argv[1], dir, r);
      fflush(stdout);
      _exit(rc);
    }
    if (pids[r] < 0) {
      perror("fork");
      return 1;
    }
  }
  for (r = 0; r < NRANKS; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (wait status 0x%x)\n", r, status);
      failed = 1;
    }
  }
  /* The plugin deletes every key it created: only our lock file may remain. */
  snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -v '^lock$' | grep -q .", dir);
  leftover = system(cmd) == 0;
  if (leftover) {
    fprintf(stderr, "keys left in the store after comm_destroy:\n");
    snprintf(cmd, sizeof cmd, "ls -A '%s' >&2", dir);
    if (system(cmd) != 0) fprintf(stderr, "(cannot list %s)\n", dir);
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  if (failed || leftover) return 1;
  printf("2-rank job through the plugin table alone: OK\n");
  return 0;
}

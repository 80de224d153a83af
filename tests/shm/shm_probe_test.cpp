// The shm plugin's probe, called directly through its table: highest host-memory score when
// every rank is on one host, unusable ("ranks span N hosts") otherwise, and a low but usable
// score when the layout is unknown.
//
//   shm_probe_test <path to libmncl-shm.so>
#include <dlfcn.h>
#include <mncl/mncl_plugin.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace {

int failures = 0;

void log_cb(int32_t, const char *, int32_t, const char *, ...) {}
void set_error_cb(const char *, ...) {}
const char *get_env_cb(const char *) {
  return nullptr;
}

void expect(const mncl_plugin_v1_t *p, int size, int local_size, int hosts, bool usable,
            const char *reason_part) {
  mncl_probe_v1_t info{};
  info.struct_size = sizeof info;
  info.size = size;
  info.local_size = local_size;
  info.num_hosts = hosts;
  int32_t score = -1;
  char reason[256] = "";
  const mncl_status_t st = p->probe(&info, &score, reason, sizeof reason);
  const bool ok = st == MNCL_OK && (usable ? score >= 80 : score == 0) &&
                  (reason_part == nullptr || std::strstr(reason, reason_part) != nullptr);
  std::printf("%s size %d local %d hosts %d -> score %d '%s'\n", ok ? "ok  " : "FAIL", size,
              local_size, hosts, score, reason);
  if (!ok) ++failures;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s libmncl-shm.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  const auto *p = static_cast<const mncl_plugin_v1_t *>(dlsym(lib, MNCL_PLUGIN_V1_SYMBOL));
  if (p == nullptr || std::strcmp(p->name, "shm") != 0) return 1;
  const mncl_host_v1_t host = {sizeof(mncl_host_v1_t), MNCL_VERSION, 0, log_cb,
                               set_error_cb,           get_env_cb};
  if (p->init(&host) != MNCL_OK) return 1;
  expect(p, 4, 4, 1, true, nullptr);
  expect(p, 1, 1, 1, true, nullptr);
  expect(p, 4, 4, -1, true, nullptr);  // num_hosts unknown: local_size == size decides
  expect(p, 8, 4, 2, false, "ranks span 2 hosts");
  expect(p, 8, 4, -1, false, "more than one host");
  // Nothing known: usable (comm_create verifies the host) but below gloo's 50.
  mncl_probe_v1_t info{};
  info.struct_size = sizeof info;
  info.size = 4;
  info.local_size = -1;
  info.num_hosts = -1;
  int32_t score = -1;
  char reason[256] = "";
  p->probe(&info, &score, reason, sizeof reason);
  std::printf("%s layout unknown -> score %d '%s'\n", score > 0 && score < 50 ? "ok  " : "FAIL",
              score, reason);
  if (!(score > 0 && score < 50)) ++failures;
  if (p->finalize) p->finalize();
  std::printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

// The nccl plugin seen from the loader's side, on any machine: it loads (its CUDA and NCCL
// libraries resolve), its table advertises what it implements, and probe / comm_create are
// honest about the GPUs present: without one, probe scores 0 with "no CUDA device" and
// comm_create fails cleanly with a message instead of crashing.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mncl/mncl_plugin.h>

#include <cstdarg>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

std::string g_error;
void host_log(int32_t, const char *, int32_t, const char *, ...) {}
void host_set_error(const char *fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  g_error = buf;
}
const char *host_get_env(const char *) {
  return nullptr;
}
const mncl_host_v1_t kHost = {sizeof(mncl_host_v1_t), MNCL_VERSION, MNCL_LOG_NONE, host_log,
                              host_set_error,         host_get_env};

// A one-process store for a communicator of size 1.
std::map<std::string, std::string> g_store;
mncl_status_t store_set(void *, const char *k, const void *v, size_t n) {
  g_store[k] = std::string(static_cast<const char *>(v), n);
  return MNCL_OK;
}
mncl_status_t store_get(void *, const char *k, void **v, size_t *n, int64_t) {
  auto it = g_store.find(k);
  if (it == g_store.end()) return MNCL_ERR_TIMEOUT;
  *v = new std::string(it->second);
  *n = it->second.size();
  return MNCL_OK;
}
void store_release(void *, void *v) {
  delete static_cast<std::string *>(v);
}
mncl_status_t store_add(void *, const char *, int64_t d, int64_t *r) {
  *r = d;
  return MNCL_OK;
}
mncl_status_t store_wait(void *, const char *const *, size_t, int64_t) {
  return MNCL_OK;
}
mncl_status_t store_del(void *, const char *k) {
  g_store.erase(k);
  return MNCL_OK;
}
const mncl_store_v1_t kStore = {sizeof(mncl_store_v1_t), nullptr,   store_set,  store_get,
                                store_release,           store_add, store_wait, store_del};

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

class NcclPlugin : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    handle_ = dlopen(MNCL_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    table_ = static_cast<const mncl_plugin_v1_t *>(dlsym(handle_, MNCL_PLUGIN_V1_SYMBOL));
    ASSERT_NE(table_, nullptr);
    ASSERT_EQ(table_->init(&kHost), MNCL_OK) << g_error;
  }
  static void *handle_;
  static const mncl_plugin_v1_t *table_;
};
void *NcclPlugin::handle_ = nullptr;
const mncl_plugin_v1_t *NcclPlugin::table_ = nullptr;

TEST_F(NcclPlugin, AdvertisesWhatItImplements) {
  EXPECT_STREQ(table_->name, "nccl");
  EXPECT_NE(std::string(table_->version).find("NCCL 2."), std::string::npos) << table_->version;
  const uint64_t caps =
      MNCL_CAP_CUDA_MEMORY | MNCL_CAP_HOST_MEMORY | MNCL_CAP_STREAM_ORDERED | MNCL_CAP_NATIVE_ASYNC;
  EXPECT_EQ(table_->caps, caps);
  // The v5 table has every kind, gatherv and scatterv (grouped sends and receives to and from
  // the root) included; each older copy has the same functions and caps without the kinds its
  // version lacks: v4 drops gatherv and scatterv, v3 the batch too, v2 and v1 allgatherv and
  // alltoallv too.
  const uint32_t v1_mask = MNCL_COLL_MASK_ALL_V1 | MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED);
  EXPECT_EQ(table_->abi_version, MNCL_PLUGIN_ABI_V1);
  EXPECT_EQ(table_->coll_mask, v1_mask);
  const auto *v2 = static_cast<const mncl_plugin_v2_t *>(dlsym(handle_, MNCL_PLUGIN_V2_SYMBOL));
  ASSERT_NE(v2, nullptr);
  EXPECT_EQ(v2->struct_size, sizeof(mncl_plugin_v2_t));
  EXPECT_EQ(v2->abi_version, MNCL_PLUGIN_ABI_V2);
  EXPECT_EQ(v2->caps, caps);
  EXPECT_EQ(v2->coll_mask, v1_mask);
  EXPECT_EQ(v2->execute, table_->execute);
  const auto *v3 = static_cast<const mncl_plugin_v3_t *>(dlsym(handle_, MNCL_PLUGIN_V3_SYMBOL));
  ASSERT_NE(v3, nullptr);
  EXPECT_EQ(v3->struct_size, sizeof(mncl_plugin_v3_t));
  EXPECT_EQ(v3->abi_version, MNCL_PLUGIN_ABI_V3);
  EXPECT_EQ(v3->caps, caps);
  EXPECT_EQ(v3->coll_mask, MNCL_COLL_MASK_ALL_V3);
  EXPECT_EQ(v3->coll_mask & MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH), 0u);
  EXPECT_EQ(v3->execute, table_->execute);
  const auto *v4 = static_cast<const mncl_plugin_v4_t *>(dlsym(handle_, MNCL_PLUGIN_V4_SYMBOL));
  ASSERT_NE(v4, nullptr);
  EXPECT_EQ(v4->struct_size, sizeof(mncl_plugin_v4_t));
  EXPECT_EQ(v4->magic, MNCL_PLUGIN_MAGIC);
  EXPECT_EQ(v4->abi_version, MNCL_PLUGIN_ABI_V4);
  EXPECT_STREQ(v4->name, "nccl");
  EXPECT_EQ(v4->caps, caps);
  EXPECT_EQ(v4->coll_mask, MNCL_COLL_MASK_ALL_V4);
  EXPECT_NE(v4->coll_mask & MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH), 0u);
  EXPECT_EQ(v4->execute, table_->execute);
  EXPECT_EQ(v4->post, table_->post);
  EXPECT_EQ(v4->test, table_->test);
  EXPECT_EQ(v4->coll_mask & (MNCL_COLL_BIT(MNCL_COLL_GATHERV) | MNCL_COLL_BIT(MNCL_COLL_SCATTERV)),
            0u);
  const auto *v5 = static_cast<const mncl_plugin_v5_t *>(dlsym(handle_, MNCL_PLUGIN_V5_SYMBOL));
  ASSERT_NE(v5, nullptr);
  EXPECT_EQ(v5->struct_size, sizeof(mncl_plugin_v5_t));
  EXPECT_EQ(v5->magic, MNCL_PLUGIN_MAGIC);
  EXPECT_EQ(v5->abi_version, MNCL_PLUGIN_ABI_V5);
  EXPECT_STREQ(v5->name, "nccl");
  EXPECT_STREQ(v5->version, table_->version);
  EXPECT_EQ(v5->caps, caps);
  EXPECT_EQ(v5->coll_mask, MNCL_COLL_MASK_ALL_V5);
  EXPECT_NE(v5->coll_mask & MNCL_COLL_BIT(MNCL_COLL_GATHERV), 0u);
  EXPECT_NE(v5->coll_mask & MNCL_COLL_BIT(MNCL_COLL_SCATTERV), 0u);
  EXPECT_EQ(v5->dtype_mask, table_->dtype_mask);
  EXPECT_EQ(v5->op_mask, table_->op_mask);
  EXPECT_EQ(v5->init, table_->init);
  EXPECT_EQ(v5->execute, table_->execute);
  EXPECT_EQ(v5->post, table_->post);
  EXPECT_EQ(v5->test, table_->test);
  // The newest ABI this header set defines is the newest the plugin exports.
  static_assert(MNCL_PLUGIN_ABI_CURRENT == MNCL_PLUGIN_ABI_V5);
  EXPECT_EQ(table_->dtype_mask, (1u << MNCL_NUM_DTYPES) - 1);
  EXPECT_EQ(table_->op_mask, (1u << MNCL_NUM_OPS) - 1);
  EXPECT_NE(table_->post, nullptr);
  EXPECT_NE(table_->test, nullptr);
  // Only the table is exported.
  EXPECT_EQ(dlsym(handle_, "_ZN4mncl4nccl4CommD1Ev"), nullptr);
}

TEST_F(NcclPlugin, ProbeMatchesTheGpusPresent) {
  mncl_probe_v1_t info{};
  info.struct_size = sizeof info;
  info.size = info.local_size = 1;
  int32_t score = -1;
  char reason[256] = "";
  ASSERT_EQ(table_->probe(&info, &score, reason, sizeof reason), MNCL_OK);
  if (gpu_count() == 0) {
    EXPECT_EQ(score, 0);
    EXPECT_NE(std::string(reason).find("no CUDA device"), std::string::npos) << reason;
  } else {
    EXPECT_GT(score, 10) << reason;  // above the host backends
    info.local_size = gpu_count() + 1;
    ASSERT_EQ(table_->probe(&info, &score, reason, sizeof reason), MNCL_OK);
    EXPECT_EQ(score, 0);
    EXPECT_NE(std::string(reason).find("ranks on this host"), std::string::npos) << reason;
    // ...unless the host has a GPU per rank and each process sees its own (Slurm's
    // --gpus-per-task): hwloc counts them all.
    info.num_gpus = info.local_size;
    ASSERT_EQ(table_->probe(&info, &score, reason, sizeof reason), MNCL_OK);
    EXPECT_GT(score, 10) << reason;
  }
}

TEST_F(NcclPlugin, CommCreateWithoutGpuFailsCleanly) {
  if (gpu_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  mncl_bootstrap_v1_t bs{};
  bs.struct_size = sizeof bs;
  bs.rank = 0;
  bs.size = 1;
  bs.local_rank = 0;
  bs.local_size = 1;
  bs.num_hosts = 1;
  bs.device = 0;
  bs.timeout_ms = 5000;
  bs.comm_id = "w";
  bs.store = &kStore;
  void *comm = nullptr;
  g_error.clear();
  EXPECT_EQ(table_->comm_create(&bs, &comm), MNCL_ERR_PLUGIN);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(g_error.find("no CUDA device"), std::string::npos) << g_error;
}

}  // namespace

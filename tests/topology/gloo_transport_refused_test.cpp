// The gloo plugin, dlopen()ed directly (no libmncl, so no core probe stands in front of
// comm_create), refuses MNCL_GLOO_TRANSPORT=ibverbs: this Gloo's ibverbs transport has no
// unbound buffers, which every MNCL gloo operation uses. The probe scores 0 with the reason
// and comm_create fails with MNCL_ERR_NOT_SUPPORTED and the same explanation, before it
// touches a device or the store. A value that is no transport at all stays comm_create's
// MNCL_ERR_INVALID_ARGUMENT ("expected tcp") and leaves the probe's score alone.
#include <gtest/gtest.h>

#include <string>

#include "plugin_harness.h"

namespace {

mncl_testing::Plugin g_gloo;
::testing::Environment *const g_env = mncl_testing::add_plugins_env(
    {"gloo", MNCL_LOG_NONE, {}, {}},
    {{"gloo", MNCL_GLOO_PLUGIN, mncl_testing::PluginsEnv::kV1, &g_gloo}});

// Rank 0 of a 2-rank job on two hosts, with InfiniBand, under MNCL_GLOO_TRANSPORT=setting.
struct Outcome {
  int32_t score = -1;
  std::string reason;
  mncl_status_t created = MNCL_OK;
  std::string error;
  size_t store_keys = 0;
};
Outcome probe_and_create(const char *setting) {
  mncl_testing::host_env().pin("MNCL_GLOO_TRANSPORT", setting);
  Outcome out;
  mncl_probe_v1_t info{};
  info.struct_size = sizeof info;
  info.size = 2;
  info.local_size = 1;
  info.num_hosts = 2;
  info.has_infiniband = 1;  // even with InfiniBand
  char reason[512] = "";
  EXPECT_EQ(g_gloo.v1->probe(&info, &out.score, reason, sizeof reason), MNCL_OK);
  out.reason = reason;
  mncl_testing::MemStore store;
  mncl_bootstrap_v1_t bs = mncl_testing::make_bootstrap(0, 2, 2000, "w", store.table());
  bs.local_size = 1;
  bs.num_hosts = 2;
  void *comm = nullptr;
  mncl_testing::t_last_error.clear();
  out.created = g_gloo.v1->comm_create(&bs, &comm);
  out.error = mncl_testing::t_last_error;
  if (comm != nullptr) g_gloo.v1->comm_destroy(comm);
  out.store_keys = store.max_keys();
  return out;
}

TEST(GlooTransport, IbverbsIsRefusedByTheProbeAndByCommCreate) {
  const Outcome o = probe_and_create("ibverbs");
  EXPECT_EQ(o.score, 0);
  EXPECT_NE(o.reason.find("no unbound buffers"), std::string::npos) << o.reason;
  EXPECT_EQ(o.created, MNCL_ERR_NOT_SUPPORTED) << o.error;
  EXPECT_NE(o.error.find("no unbound buffers"), std::string::npos) << o.error;
  EXPECT_EQ(o.store_keys, 0u) << "comm_create wrote to the store before refusing";
}

TEST(GlooTransport, NoTransportAtAllIsAnInvalidArgumentOfCommCreate) {
  const Outcome o = probe_and_create("verbs");
  EXPECT_GT(o.score, 0) << o.reason;
  EXPECT_EQ(o.created, MNCL_ERR_INVALID_ARGUMENT) << o.error;
  EXPECT_NE(o.error.find("expected tcp"), std::string::npos) << o.error;
  EXPECT_EQ(o.store_keys, 0u) << "comm_create wrote to the store before refusing";
}

}  // namespace

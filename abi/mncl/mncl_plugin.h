/*
 * mncl_plugin.h — what a backend plugin includes: the newest plugin ABI plus helpers.
 *
 * Each ABI version lives in its own frozen header (mncl_plugin_v1.h, mncl_plugin_v2.h, ...).
 * This file includes all of them and names the newest one "current", so a plugin written today
 * writes
 *
 *     #include <mncl/mncl_plugin.h>
 *     MNCL_PLUGIN_EXPORT const mncl_plugin_v5_t mncl_plugin_v5 = { ... };
 *
 * and keeps compiling, unchanged, against later releases (it stays a v5 plugin, served by the
 * core's v5 adapter, until its author moves to a newer table). A v1 plugin is loaded as before.
 *
 * Rules every version shares, beside those of the version headers:
 * - Loading. The core loads a plugin (dlopen, init) when a communicator is created or
 *   mncl-info runs and no communicator holds it already, and unloads it (finalize, dlclose)
 *   with the last communicator that used it: under MNCL_BACKEND=auto every plugin on the
 *   search path is loaded and probed at each such creation. Keep init and probe cheap and
 *   local (no device enumeration that takes seconds, no network); they are not bounded by the
 *   timeout.
 * - Threads. Calls on different communicators (two jobs, or a split beside its parent) may run
 *   at the same time on different threads, whatever the capabilities: state shared between
 *   communicators (globals, caches, a device context) must be thread-safe. comm_abort may come
 *   from any thread at any time after comm_create returned, including while the process exits.
 * - Choice. Under auto, probe's score only orders plugins the core's rules rank alike (its
 *   "higher is better" is within a rank). The rules go by name first: for CUDA buffers nccl,
 *   then any plugin with MNCL_CAP_CUDA_MEMORY; then shm on one host, flat under mpirun, gloo;
 *   then any other plugin; naive last. So a host-memory plugin of another name is chosen
 *   under auto only where none of shm, flat, gloo can serve the job; name it to have it
 *   (MNCL_BACKEND, MNCL_BACKEND_HOST, MNCL_BACKEND_CUDA, config.backend).
 * - The store (mncl_store_v1_t). Keys are non-empty; a value holds less than 1 GiB; one wait
 *   names at most 2^20 keys. set, add and del have no timeout argument: each is bounded by the
 *   communicator's timeout, and fails (MNCL_ERR_BOOTSTRAP, MNCL_ERR_REMOTE, MNCL_ERR_TIMEOUT)
 *   when the store cannot be reached, as when the store's host (rank 0's process) is gone.
 * - Errors. Every entry reports failure as a status of mncl_status_t with host->set_error.
 *   A status outside the enum (or MNCL_IN_PROGRESS from an entry that must end) becomes
 *   MNCL_ERR_INTERNAL naming the entry. An exception that escapes an entry is a defect the
 *   core survives but cannot trust: from init, the plugin is unusable; from any other entry,
 *   that call fails with MNCL_ERR_INTERNAL, the communicator is aborted (the other ranks are
 *   told, as by mncl_comm_abort), and every later call on it fails quoting the exception.
 *   Never end or cancel the calling thread (pthread_exit): the core cannot recover it.
 * - Symbols. Export the mncl_plugin_vN tables only: link with a version script ({ global:
 *   mncl_plugin_v*; local: *; }; installed as <libdir>/cmake/mncl/plugin.map, which
 *   mncl_add_plugin of find_package(mncl) links with), as -fvisibility=hidden alone leaves
 *   the C++ library's weak symbols exported.
 */
#ifndef MNCL_PLUGIN_H
#define MNCL_PLUGIN_H

#include "mncl.h"
#include "mncl_plugin_v1.h"
#include "mncl_plugin_v2.h"
#include "mncl_plugin_v3.h"
#include "mncl_plugin_v4.h"
#include "mncl_plugin_v5.h"

/* Newest plugin ABI this header set defines, and the oldest the matching core still loads. */
#define MNCL_PLUGIN_ABI_CURRENT MNCL_PLUGIN_ABI_V5
#define MNCL_PLUGIN_ABI_OLDEST MNCL_PLUGIN_ABI_V1

#if defined(__GNUC__)
#ifdef __cplusplus
#define MNCL_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define MNCL_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif
#else
#define MNCL_PLUGIN_EXPORT
#endif

#endif /* MNCL_PLUGIN_H */

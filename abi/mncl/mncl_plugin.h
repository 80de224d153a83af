/*
 * mncl_plugin.h — what a backend plugin includes: the newest plugin ABI plus helpers.
 *
 * Each ABI version lives in its own frozen header (mncl_plugin_v1.h, mncl_plugin_v2.h, ...).
 * This file includes all of them and names the newest one "current", so a plugin written today
 * writes
 *
 *     #include <mncl/mncl_plugin.h>
 *     MNCL_PLUGIN_EXPORT const mncl_plugin_v3_t mncl_plugin_v3 = { ... };
 *
 * and keeps compiling, unchanged, against later releases (it stays a v3 plugin, served by the
 * core's v3 adapter, until its author moves to a newer table). A v1 plugin is loaded as before.
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

// Finding, loading and checking backend plugins (libmncl-<name>.so) with Boost.DLL.
//
// Search order: every folder of MNCL_PLUGIN_PATH (colon-separated; a relative entry is taken
// from the working directory at each search), then the default folder, beside the module
// holding this code: <libdir>/mncl/plugins for libmncl.so (its own folder + /mncl/plugins); for
// a program linking the static core (mncl-info, in <bindir>), the install tree's
// <bindir>/../<CMAKE_INSTALL_LIBDIR>/mncl/plugins, then the build tree's <bin>/../lib/mncl/plugins
// (one folder when the install's libdir is "lib"). So the build tree and an install tree both
// work and tests never see an installed plugin. The module's folder is made absolute once, when
// the module is loaded: a libmncl loaded by a relative name (dlopen, LD_LIBRARY_PATH=lib) keeps
// finding its plugins after the application changes its working directory; a program's folder
// is that of /proc/self/exe (symbolic links resolved, whatever argv[0] says). The first file
// found for a name wins.
//
// Each file is logged (info) as "loading <path>" before dlopen runs its static initializers, so
// one that kills the process is named (MNCL_DEBUG=info).
//
// Loading checks, in order, each refusal logged with the file and the reason: at warn the first
// time this process meets it (that path, that reason), at info after, since every
// communicator's creation searches the folders again (a refusal of a plugin asked for by name or
// path is an error that carries the reason too):
//   not a regular file / not an ELF file / ELF of the wrong class or machine /
//   dlopen failed (dlerror text) / no mncl_plugin_vN symbol / only newer ABI versions than this
//   core supports (naming both ranges) / bad magic, struct_size or abi_version in the table /
//   missing mandatory functions / capability mismatch (no memory type, no collectives,
//   name differing from the file name) / init() refused (status + message).
#pragma once

#include <mncl/mncl_plugin.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mncl::loader {

// A loaded, initialized plugin. Destroying the last reference calls finalize() and unloads.
class Plugin {
 public:
  virtual ~Plugin() = default;
  // The table adapted to the newest ABI this core knows (v5 today).
  virtual const mncl_plugin_v5_t &table() const = 0;
  virtual const std::string &path() const = 0;
  virtual const std::string &name() const = 0;
  // The ABI version the plugin was actually built for (before adaptation).
  virtual uint32_t abi_version() const = 0;
};

// What mncl-info shows for each file found.
struct PluginReport {
  std::string path;
  std::string name;     // from the file name, libmncl-<name>.so
  bool loaded = false;  // passed every check and init()
  std::string reason;   // why it was refused (empty when loaded)
  // What its init() returned when it refused: MNCL_ERR_INVALID_ARGUMENT means a bad setting
  // of its own (MNCL_SHM_CHUNK=1K), which the core reports instead of passing it over.
  mncl_status_t init_status = MNCL_OK;
  std::string init_message;  // and the message it set
  std::string version;       // plugin's version string, when the table was readable
  uint32_t abi_version = 0;  // 0 when unknown
  uint64_t caps = 0;
  uint32_t coll_mask = 0, dtype_mask = 0, op_mask = 0;
  std::shared_ptr<Plugin> plugin;  // set when loaded (keeps it loaded)
};

// Folders searched, in order.
std::vector<std::string> search_path();
// Every libmncl-*.so in the search path (first per name), loaded and checked. Nothing is
// cached: each call searches the folders of that moment (MNCL_PLUGIN_PATH may have changed) and
// loads and initializes each plugin not loaded already (plugins unload with their last user).
std::vector<PluginReport> discover();

// One search of the plugin folders, run when first needed and then kept, with the plugins it
// loaded: what one communicator's creation (or one mncl-info run) decides with, so that it
// searches once however many of its steps need the list (each entry of a backend list, the
// available names in an error, the agreed backend). Not thread-safe.
class Discovery {
 public:
  const std::vector<PluginReport> &reports();

 private:
  std::optional<std::vector<PluginReport>> reports_;
};

// The status that a refused plugin means to the user: MNCL_ERR_INVALID_ARGUMENT where its
// init() refused a setting of its own, else MNCL_ERR_PLUGIN.
mncl_status_t refusal_status(const PluginReport &report);
// Loads one plugin by name ("naive": searched) or by path (contains '/'). Throws
// mncl::Error(refusal_status) with the reason; for an unknown name (MNCL_ERR_PLUGIN) the
// message lists the available backends (discovery's, or a search of its own without one).
// Plugins already loaded by this process are shared.
std::shared_ptr<Plugin> load(const std::string &name_or_path, Discovery *discovery = nullptr);
// Names of the plugins in the search path that load (for error messages): discovery's, or a
// search of its own without one.
std::vector<std::string> available_names(Discovery *discovery = nullptr);

// The host services handed to plugin init() (logging tagged with the plugin name, set_error
// into mncl_last_error, get_env through the env table).
const mncl_host_v1_t *host_services();

}  // namespace mncl::loader

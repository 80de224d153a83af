// Finding, checking and sharing backend plugins (see plugin_loader.h for the contract).
#include "loader/plugin_loader.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <boost/filesystem.hpp>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "loader/elf_check.h"
#include "loader/plugin_abi.h"
#include "loader/plugin_call.h"

#ifndef MNCL_PLUGIN_SUBDIR
#define MNCL_PLUGIN_SUBDIR "mncl/plugins"
#endif
// For a program linking the static core (mncl-info, in <bindir>): the plugin folder relative to
// its folder, in an install tree (<libdir>/mncl/plugins, whatever CMAKE_INSTALL_LIBDIR is) and
// in the build tree (bin/ beside lib/mncl/plugins). sdk/CMakeLists.txt computes both.
#ifndef MNCL_PLUGIN_DIR_FROM_BINDIR
#define MNCL_PLUGIN_DIR_FROM_BINDIR "../lib/" MNCL_PLUGIN_SUBDIR
#endif
#ifndef MNCL_BUILD_PLUGIN_DIR_FROM_BINDIR
#define MNCL_BUILD_PLUGIN_DIR_FROM_BINDIR "../lib/" MNCL_PLUGIN_SUBDIR
#endif

namespace mncl::loader {

namespace {

namespace fs = boost::filesystem;

constexpr char kPrefix[] = "libmncl-";
constexpr char kSuffix[] = ".so";

// "naive" for ".../libmncl-naive.so"; "" when the file name does not follow that pattern.
std::string name_from_file(const std::string &path) {
  const std::string file = fs::path(path).filename().string();
  const size_t p = sizeof kPrefix - 1, s = sizeof kSuffix - 1;
  if (file.size() <= p + s || file.compare(0, p, kPrefix) != 0 ||
      file.compare(file.size() - s, s, kSuffix) != 0) {
    return {};
  }
  return file.substr(p, file.size() - p - s);
}

std::string join(const std::vector<std::string> &items, const char *sep) {
  std::string out;
  for (const auto &item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}

class LoadedPlugin final : public Plugin {
 public:
  LoadedPlugin(boost::dll::shared_library lib, const abi::Table &table, std::string path,
               uint32_t abi_version)
      : lib_(std::move(lib)),
        table_(table),
        path_(std::move(path)),
        name_(table.name),
        abi_version_(abi_version) {}
  // Runs under the registry lock (see release()), so finalize never overlaps another init.
  ~LoadedPlugin() override {
    if (table_.finalize != nullptr) {
      try {
        table_.finalize();
      } catch (...) {  // the ABI forbids it; a destructor must not let it through
        MNCL_WARN("plugin %s (%s): finalize threw a C++ exception, which the plugin ABI forbids",
                  name_.c_str(), path_.c_str());
      }
    }
    MNCL_INFO("unloaded plugin %s (%s)", name_.c_str(), path_.c_str());
  }  // lib_ unloads after this body, once the plugin's code is no longer needed

  const abi::Table &table() const override { return table_; }
  const std::string &path() const override { return path_; }
  const std::string &name() const override { return name_; }
  uint32_t abi_version() const override { return abi_version_; }

 private:
  boost::dll::shared_library lib_;
  abi::Table table_;
  std::string path_, name_;
  uint32_t abi_version_;
};

// Plugins loaded by this process, by canonical path. An entry whose weak_ptr has expired but is
// still present is being finalized: a new load of that file waits for it to go, so init() and
// finalize() of one file never interleave. Leaked on purpose: plugins held by other statics may
// be released during exit, after this file's statics would be destroyed.
struct Registry {
  std::mutex mutex;
  std::condition_variable unloaded;
  std::map<std::string, std::weak_ptr<Plugin>> plugins;
};
Registry &registry() {
  static auto *r = new Registry;
  return *r;
}

// Deleter of the shared_ptr handed out: finalize + unload under the lock, then let waiters in.
void release(const std::string &key, LoadedPlugin *plugin) {
  Registry &reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  delete plugin;
  reg.plugins.erase(key);
  reg.unloaded.notify_all();
}

// Mandatory entry points, capabilities and name. Returns "" or the reason.
std::string validate(const abi::Table &t, const std::string &file_name) {
  const std::pair<bool, const char *> required[] = {{t.init != nullptr, "init"},
                                                    {t.probe != nullptr, "probe"},
                                                    {t.comm_create != nullptr, "comm_create"},
                                                    {t.comm_destroy != nullptr, "comm_destroy"},
                                                    {t.comm_abort != nullptr, "comm_abort"},
                                                    {t.execute != nullptr, "execute"}};
  std::vector<std::string> missing;
  for (const auto &[present, fn] : required) {
    if (!present) missing.push_back(fn);
  }
  if (!missing.empty()) return "missing mandatory functions: " + join(missing, ", ");

  const bool async = (t.caps & MNCL_CAP_NATIVE_ASYNC) != 0;
  if (async && (t.post == nullptr || t.test == nullptr)) {
    return "advertises MNCL_CAP_NATIVE_ASYNC but post or test is NULL";
  }
  if (!async && (t.post != nullptr || t.test != nullptr)) {
    return "sets post/test without advertising MNCL_CAP_NATIVE_ASYNC";
  }

  if ((t.caps & (MNCL_CAP_HOST_MEMORY | MNCL_CAP_CUDA_MEMORY)) == 0) {
    return "capability mismatch: no memory type (neither MNCL_CAP_HOST_MEMORY nor "
           "MNCL_CAP_CUDA_MEMORY)";
  }
  constexpr uint32_t kKnownColls = MNCL_COLL_MASK_ALL_V5;
  constexpr uint32_t kKnownDtypes = (1u << MNCL_NUM_DTYPES) - 1u;
  constexpr uint32_t kKnownOps = (1u << MNCL_NUM_OPS) - 1u;
  if ((t.coll_mask & kKnownColls) == 0) {
    return format("capability mismatch: coll_mask 0x%x has no collective this core knows",
                  t.coll_mask);
  }
  if ((t.dtype_mask & kKnownDtypes) == 0) {
    return format("capability mismatch: dtype_mask 0x%x has no data type this core knows",
                  t.dtype_mask);
  }
  if ((t.op_mask & kKnownOps) == 0) {
    return format("capability mismatch: op_mask 0x%x has no reduction this core knows", t.op_mask);
  }

  if (t.name == nullptr || *t.name == '\0') return "the table has no name";
  // MNCL_BACKEND=<name> and mncl-info rely on file and table agreeing.
  if (!file_name.empty() && file_name != t.name) {
    return format("table name '%s' differs from the file name '%s' (%s%s%s)", t.name,
                  file_name.c_str(), kPrefix, file_name.c_str(), kSuffix);
  }
  return {};
}

// Which symbol to use, or why there is none: the newest version this core knows wins; failing
// that, versions out of range are named so the user knows to upgrade one side.
const abi::Adapter *find_adapter(const boost::dll::shared_library &lib, std::string *reason) {
  // MNCL_PLUGIN_ABI_MAX: take no table newer than that, as a core of that version would (to run
  // a plugin the way an older core or a plugin of that version is run: the core's fallbacks).
  const auto newest = static_cast<uint32_t>(
      env::get_int("MNCL_PLUGIN_ABI_MAX", abi::kOldest, abi::kNewest).value_or(abi::kNewest));
  bool newer_only = false;
  for (const abi::Adapter &adapter : abi::kAdapters) {
    if (!lib.has(adapter.symbol)) continue;
    if (adapter.version <= newest) return &adapter;
    newer_only = true;
  }
  if (newer_only) {
    *reason = format("exports no table of plugin ABI v%u or older (MNCL_PLUGIN_ABI_MAX=%u)", newest,
                     newest);
    return nullptr;
  }
  std::vector<std::string> offered;
  for (uint32_t v = 1; v <= abi::kMaxProbed; ++v) {
    if ((v < abi::kOldest || v > abi::kNewest) && lib.has(abi::symbol_for(v))) {
      offered.push_back(format("v%u", v));
    }
  }
  if (!offered.empty()) {
    *reason = format("offers plugin ABI %s only; this core supports v%u..v%u",
                     join(offered, ", ").c_str(), abi::kOldest, abi::kNewest);
  } else {
    *reason = format(
        "no %s..%s symbol exported: not an MNCL plugin, or built with hidden "
        "visibility for its table",
        abi::symbol_for(1).c_str(), abi::symbol_for(abi::kMaxProbed).c_str());
  }
  return nullptr;
}

// Whether this process meets the refusal of the file at path for reason for the first time
// (and notes it). Every communicator's creation searches the plugin folders again, and a
// refusal is warned about once, not at each. Leaked on purpose, as the registry.
bool first_refusal(const std::string &path, const std::string &reason) {
  static auto *mutex = new std::mutex;
  static auto *seen = new std::set<std::pair<std::string, std::string>>;
  std::lock_guard<std::mutex> lock(*mutex);
  return seen->emplace(path, reason).second;
}

// Loads, checks and initializes one file, or finds it already loaded. Never throws for a bad
// plugin: the report says why. Must not be called with the registry lock held.
PluginReport try_load(const std::string &path) {
  PluginReport report;
  report.path = path;
  report.name = name_from_file(path);
  auto refuse = [&report](std::string reason) {
    if (first_refusal(report.path, reason)) {
      MNCL_WARN("skipping plugin %s: %s", report.path.c_str(), reason.c_str());
    } else {
      MNCL_INFO("skipping plugin %s: %s (warned about earlier)", report.path.c_str(),
                reason.c_str());
    }
    report.reason = std::move(reason);
    return report;
  };
  auto fill_from = [&report](const Plugin &plugin) {
    const abi::Table &t = plugin.table();
    report.loaded = true;
    report.name = plugin.name();
    report.abi_version = plugin.abi_version();
    report.version = t.version ? t.version : "";
    report.caps = t.caps;
    report.coll_mask = t.coll_mask;
    report.dtype_mask = t.dtype_mask;
    report.op_mask = t.op_mask;
  };

  boost::system::error_code ec;
  const fs::path canonical = fs::canonical(path, ec);
  const std::string key = ec ? path : canonical.string();

  Registry &reg = registry();
  std::unique_lock<std::mutex> lock(reg.mutex);
  for (;;) {
    auto it = reg.plugins.find(key);
    if (it == reg.plugins.end()) break;
    if (auto shared = it->second.lock()) {
      report.plugin = std::move(shared);
      fill_from(*report.plugin);
      return report;
    }
    reg.unloaded.wait(lock);  // its last user is finalizing it right now
  }

  if (std::string reason = check_elf(path); !reason.empty()) return refuse(reason);

  // Before dlopen runs the file's static initializers: one that kills the process is named.
  MNCL_INFO("loading %s", path.c_str());
  boost::dll::shared_library lib;
  boost::dll::fs::error_code dll_ec;  // std:: or boost:: flavour, as Boost.DLL is configured
  lib.load(path, dll_ec, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (dll_ec || !lib.is_loaded()) {
    const char *why = dlerror();  // Boost.DLL leaves it set after a failed dlopen
    return refuse(std::string("dlopen failed: ") + (why ? why : dll_ec.message().c_str()));
  }

  std::string reason;
  const abi::Adapter *adapter = find_adapter(lib, &reason);
  if (adapter == nullptr) return refuse(reason);
  report.abi_version = adapter->version;
  const void *exported = dlsym(lib.native(), adapter->symbol);
  if (exported == nullptr) return refuse(format("%s resolves to NULL", adapter->symbol));

  abi::Table table;
  if (reason = adapter->adapt(exported, &table); !reason.empty()) return refuse(reason);
  report.version = table.version ? table.version : "";
  report.caps = table.caps;
  report.coll_mask = table.coll_mask;
  report.dtype_mask = table.dtype_mask;
  report.op_mask = table.op_mask;
  if (reason = validate(table, report.name); !reason.empty()) return refuse(reason);
  if (report.name.empty()) report.name = table.name;

  // init() reports through the thread's last error; keep the caller's message intact.
  const std::string saved_error = last_error();
  set_last_error("");
  // A throwing init (a plugin without the kit's guard) only makes the plugin unusable here,
  // as a throwing probe does: it failed every job under auto before, naming no plugin.
  const mncl_status_t status = call_plugin(table.name ? table.name : report.name, "init",
                                           [&] { return table.init(host_services()); });
  const std::string message = last_error();
  set_last_error(saved_error);
  if (status != MNCL_OK) {
    report.init_status = status;
    // Only the plugin's own words (the refusal of a setting quotes them, else the reason).
    report.init_message = message == no_message_text() ? std::string() : message;
    return refuse(format("init() refused with %s: %s", status_name(status), message.c_str()));
  }

  auto *raw = new LoadedPlugin(std::move(lib), table, path, adapter->version);
  std::shared_ptr<Plugin> plugin(raw, [key, raw](Plugin *) { release(key, raw); });
  reg.plugins[key] = plugin;
  MNCL_INFO("loaded plugin %s %s (ABI v%u) from %s", raw->name().c_str(), report.version.c_str(),
            adapter->version, path.c_str());
  report.plugin = std::move(plugin);
  fill_from(*report.plugin);
  return report;
}

bool is_file_entry(const fs::path &p) {
  boost::system::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// The module holding this code: libmncl.so (or another shared object linking the static core),
// or a program linking the static core (mncl-info, the white-box tests).
struct Module {
  std::string dir;  // its folder, absolute; "" when it cannot be located (error says why)
  bool program = false;
  std::string error;
};

Module locate_module() {
  Module self;
  Dl_info info{};
  void *map = nullptr;
  if (dladdr1(reinterpret_cast<const void *>(&locate_module), &info, &map, RTLD_DL_LINKMAP) == 0 ||
      info.dli_fname == nullptr) {
    self.error = "dladdr found no module holding the loader";
    return self;
  }
  // The main program has no name of its own: dladdr reports argv[0], which may be relative or
  // a bare name found through PATH. The kernel knows the file.
  const auto *link = static_cast<const struct link_map *>(map);
  self.program = link != nullptr && (link->l_name == nullptr || link->l_name[0] == '\0');
  fs::path file;
  if (self.program) {
    boost::system::error_code ec;
    file = fs::read_symlink("/proc/self/exe", ec);
    if (ec) {
      self.error = "cannot read /proc/self/exe: " + ec.message();
      return self;
    }
  } else {
    // The name the library was loaded by: relative when dlopen or LD_LIBRARY_PATH named it so,
    // and then relative to the working directory of that moment (see this_module()).
    file = info.dli_fname;
    if (!file.is_absolute()) {
      boost::system::error_code ec;
      const fs::path cwd = fs::current_path(ec);
      if (ec) {
        self.error = format("%s is a relative name and the working directory is unreadable (%s)",
                            info.dli_fname, ec.message().c_str());
        return self;
      }
      file = cwd / file;
    }
  }
  self.dir = file.parent_path().lexically_normal().string();
  return self;
}

// Located once, while the module is being loaded (the initializer below): a library loaded by a
// relative name stays found after the application changes its working directory.
const Module &this_module() {
  static const Module self = locate_module();
  return self;
}
[[maybe_unused]] const Module &g_module_at_load = this_module();

// The parts of a ':' (or ',') separated list, empty ones left out.
std::vector<std::string> list_items(const std::string &list, char separator) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(separator, start);
    if (end == std::string::npos) end = list.size();
    if (end > start) items.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

// search_path() for a given MNCL_PLUGIN_PATH value; quiet: without the warning.
std::vector<std::string> search_path_of(const std::string &plugin_path, bool quiet) {
  std::vector<std::string> dirs;
  auto add = [&dirs](const fs::path &dir) {
    boost::system::error_code ec;
    const fs::path abs = dir.is_absolute() ? dir : fs::current_path(ec) / dir;
    const std::string d = abs.lexically_normal().string();
    if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  };
  for (const std::string &dir : list_items(plugin_path, ':')) add(dir);
  const Module &self = this_module();
  if (!self.error.empty()) {
    if (!quiet) {
      MNCL_WARN("cannot locate the MNCL module (%s); only MNCL_PLUGIN_PATH is searched",
                self.error.c_str());
    }
  } else if (self.program) {
    // A program linking the static core, in <bindir>: the install tree's plugin folder, then
    // the build tree's (the same folder unless CMAKE_INSTALL_LIBDIR is not "lib").
    add(fs::path(self.dir) / MNCL_PLUGIN_DIR_FROM_BINDIR);
    add(fs::path(self.dir) / MNCL_BUILD_PLUGIN_DIR_FROM_BINDIR);
  } else {
    add(fs::path(self.dir) / MNCL_PLUGIN_SUBDIR);  // libmncl.so in <libdir>
  }
  return dirs;
}

// For env::unknown_variables (a third party's plugin's MNCL_<NAME>_* are its own): the names
// of the plugin files on the search path and of those MNCL_BACKEND(_HOST, _CUDA) give by path
// (config.backend, an application's, is not known here). Reads the
// variables raw: it runs under env::get's lock.
std::vector<std::string> plugin_names_for_env() {
  std::vector<std::string> names;
  const char *plugin_path = env::raw("MNCL_PLUGIN_PATH");
  for (const std::string &dir : search_path_of(plugin_path ? plugin_path : "", true)) {
    boost::system::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = name_from_file(it->path().string());
      if (!name.empty()) names.push_back(name);
    }
  }
  for (const char *variable : {"MNCL_BACKEND", "MNCL_BACKEND_HOST", "MNCL_BACKEND_CUDA"}) {
    const char *backends = env::raw(variable);
    if (backends == nullptr) continue;
    for (const std::string &item : list_items(backends, ',')) {
      if (item.find('/') == std::string::npos) continue;
      const std::string name = name_from_file(item);
      if (!name.empty()) names.push_back(name);
    }
  }
  return names;
}
[[maybe_unused]] const bool g_plugin_names_for_env =
    (env::set_plugin_names_source(&plugin_names_for_env), true);

}  // namespace

std::vector<std::string> search_path() {
  const auto plugin_path = env::get("MNCL_PLUGIN_PATH");
  return search_path_of(plugin_path.value_or(""), false);
}

std::vector<PluginReport> discover() {
  std::vector<PluginReport> reports;
  std::set<std::string> seen;
  for (const std::string &dir : search_path()) {
    boost::system::error_code ec;
    std::vector<std::string> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string path = it->path().string();
      if (!name_from_file(path).empty()) files.push_back(path);
    }
    std::sort(files.begin(), files.end());  // readdir order is arbitrary
    for (const std::string &path : files) {
      const std::string name = name_from_file(path);
      if (!seen.insert(name).second) {
        MNCL_INFO("ignoring plugin %s: '%s' was found earlier in the search path", path.c_str(),
                  name.c_str());
        continue;
      }
      reports.push_back(try_load(path));
    }
  }
  return reports;
}

const std::vector<PluginReport> &Discovery::reports() {
  if (!reports_) reports_ = discover();
  return *reports_;
}

std::vector<std::string> available_names(Discovery *discovery) {
  Discovery own;
  std::vector<std::string> names;
  for (const PluginReport &r : (discovery ? discovery : &own)->reports()) {
    if (r.loaded) names.push_back(r.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

// The one plugin file of dir named `name` in any case ("" when none, or several).
fs::path file_in_any_case(const std::string &dir, const std::string &name) {
  const std::string wanted = env::lower(kPrefix + name + kSuffix);
  boost::system::error_code ec;
  fs::path found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (env::lower(it->path().filename().string()) != wanted) continue;
    if (!found.empty()) return {};  // libmncl-Mine.so beside libmncl-mine.so: no guess
    found = it->path();
  }
  return found;
}

}  // namespace

mncl_status_t refusal_status(const PluginReport &report) {
  return report.init_status == MNCL_ERR_INVALID_ARGUMENT ? MNCL_ERR_INVALID_ARGUMENT
                                                         : MNCL_ERR_PLUGIN;
}

std::shared_ptr<Plugin> load(const std::string &name_or_path, Discovery *discovery) {
  if (name_or_path.find('/') != std::string::npos) {
    PluginReport r = try_load(name_or_path);
    if (!r.loaded) {
      throw Error(refusal_status(r),
                  format("cannot load plugin %s: %s", name_or_path.c_str(), r.reason.c_str()));
    }
    return r.plugin;
  }
  const std::vector<std::string> dirs = search_path();
  for (const std::string &dir : dirs) {
    fs::path candidate = fs::path(dir) / (kPrefix + name_or_path + kSuffix);
    if (name_or_path.empty()) continue;
    // A name in another case (MNCL_BACKEND=SHM) finds the one file of this folder that is
    // that name in any case; an exact match wins.
    if (!is_file_entry(candidate)) candidate = file_in_any_case(dir, name_or_path);
    if (candidate.empty()) continue;
    PluginReport r = try_load(candidate.string());
    if (!r.loaded) {
      throw Error(refusal_status(r),
                  format("backend '%s' (%s) cannot be used: %s", name_or_path.c_str(),
                         candidate.string().c_str(), r.reason.c_str()));
    }
    return r.plugin;
  }
  const std::vector<std::string> names = available_names(discovery);
  throw Error(
      MNCL_ERR_PLUGIN,
      format("unknown backend '%s'; available: %s (searched %s), or auto", name_or_path.c_str(),
             names.empty() ? "none" : join(names, ", ").c_str(), join(dirs, ":").c_str()));
}

}  // namespace mncl::loader

// Reading a host's topology with hwloc: from this machine (hwloc honours HWLOC_XMLFILE, so
// `HWLOC_XMLFILE=dgx.xml mncl-info --topology` shows what MNCL would do on another machine), or
// from an explicit XML file (tests). The only part of MNCL that includes hwloc.h.
#pragma once

#include <memory>
#include <string>

#include "topology/binding.h"
#include "topology/cpuset.h"
#include "topology/summary.h"

namespace mncl::topology {

class Topology {
 public:
  // Throws mncl::Error(MNCL_ERR_SYSTEM) naming the file or hwloc's complaint.
  static std::unique_ptr<Topology> load_this_machine();
  static std::unique_ptr<Topology> load_xml(const std::string &path);
  ~Topology();
  Topology(const Topology &) = delete;
  Topology &operator=(const Topology &) = delete;

  const Summary &summary() const { return summary_; }

  // The PUs this process is bound to now (empty when unknown, e.g. an XML topology).
  CpuSet current_binding() const;
  // Whether a runtime placed this process's threads one by one: the main thread is bound to
  // fewer PUs than its threads together (false when unknown, e.g. an XML topology).
  bool threads_bound_apart() const;
  // Binds every thread of this process to cpus (hwloc_set_cpubind, HWLOC_CPUBIND_PROCESS).
  // Throws mncl::Error: MNCL_ERR_INVALID_ARGUMENT for an XML topology (not this machine) or an
  // empty set, MNCL_ERR_SYSTEM when the OS refuses (errno text).
  void bind(const CpuSet &cpus) const;

 private:
  struct Handle;
  explicit Topology(std::unique_ptr<Handle> handle, const std::string &source);
  std::unique_ptr<Handle> handle_;
  Summary summary_;
};

// This machine's topology, loaded once per process; nullptr (with a warning logged once) when
// hwloc cannot read it, in which case MNCL decides from the job facts alone.
const Topology *this_machine();

// Computes the request's binding on `machine` (its current binding filled in) and applies it,
// once per process: later calls return the first outcome, since a process has one placement
// however many communicators it creates. Never throws: a failed bind only costs speed, so it
// is a warning. The outcome is logged at info level (MNCL_DEBUG=info).
Binding bind_this_process(const Topology *machine, BindRequest request);

}  // namespace mncl::topology

// A set of logical processors (PUs) named by their OS index, as Linux numbers them in
// /proc/cpuinfo and taskset. Plain data, no hwloc: the decision and binding rules are pure
// functions over these, testable without any machine.
#pragma once

#include <string>
#include <vector>

namespace mncl::topology {

class CpuSet {
 public:
  CpuSet() = default;
  explicit CpuSet(std::vector<int> pus);  // any order, duplicates allowed

  // "0-3,8,10-11"; "" when empty. The format of taskset -c and hwloc-calc --taskset.
  static CpuSet parse(const std::string &list);  // throws std::invalid_argument
  std::string to_string() const;

  const std::vector<int> &pus() const { return pus_; }  // sorted, unique
  bool empty() const { return pus_.empty(); }
  size_t size() const { return pus_.size(); }
  bool contains(int pu) const;
  bool includes(const CpuSet &other) const;  // other is a subset of this
  bool intersects(const CpuSet &other) const;
  CpuSet operator|(const CpuSet &other) const;
  CpuSet operator&(const CpuSet &other) const;
  CpuSet operator-(const CpuSet &other) const;  // the PUs of this set not in other
  bool operator==(const CpuSet &other) const { return pus_ == other.pus_; }
  bool operator!=(const CpuSet &other) const { return pus_ != other.pus_; }

 private:
  std::vector<int> pus_;
};

}  // namespace mncl::topology

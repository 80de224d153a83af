#include "topology/cpuset.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace mncl::topology {

CpuSet::CpuSet(std::vector<int> pus) : pus_(std::move(pus)) {
  std::sort(pus_.begin(), pus_.end());
  pus_.erase(std::unique(pus_.begin(), pus_.end()), pus_.end());
}

CpuSet CpuSet::parse(const std::string &list) {
  std::vector<int> pus;
  size_t pos = 0;
  auto number = [&](size_t &at) {
    size_t used = 0;
    const int value = std::stoi(list.substr(at), &used);  // throws std::invalid_argument
    if (value < 0) throw std::invalid_argument("negative processor number in '" + list + "'");
    at += used;
    return value;
  };
  while (pos < list.size()) {
    const int first = number(pos);
    int last = first;
    if (pos < list.size() && list[pos] == '-') last = number(++pos);
    if (last < first) throw std::invalid_argument("descending range in '" + list + "'");
    for (int pu = first; pu <= last; ++pu) pus.push_back(pu);
    if (pos < list.size()) {
      if (list[pos] != ',') throw std::invalid_argument("unexpected character in '" + list + "'");
      ++pos;
    }
  }
  return CpuSet(std::move(pus));
}

std::string CpuSet::to_string() const {
  std::string out;
  for (size_t i = 0; i < pus_.size();) {
    size_t j = i;
    while (j + 1 < pus_.size() && pus_[j + 1] == pus_[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(pus_[i]);
    if (j > i) out += '-' + std::to_string(pus_[j]);
    i = j + 1;
  }
  return out;
}

bool CpuSet::contains(int pu) const {
  return std::binary_search(pus_.begin(), pus_.end(), pu);
}

bool CpuSet::includes(const CpuSet &other) const {
  return std::includes(pus_.begin(), pus_.end(), other.pus_.begin(), other.pus_.end());
}

bool CpuSet::intersects(const CpuSet &other) const {
  for (int pu : other.pus_) {
    if (contains(pu)) return true;
  }
  return false;
}

CpuSet CpuSet::operator|(const CpuSet &other) const {
  std::vector<int> all = pus_;
  all.insert(all.end(), other.pus_.begin(), other.pus_.end());
  return CpuSet(std::move(all));
}

CpuSet CpuSet::operator-(const CpuSet &other) const {
  std::vector<int> left;
  std::set_difference(pus_.begin(), pus_.end(), other.pus_.begin(), other.pus_.end(),
                      std::back_inserter(left));
  return CpuSet(std::move(left));
}

CpuSet CpuSet::operator&(const CpuSet &other) const {
  std::vector<int> both;
  std::set_intersection(pus_.begin(), pus_.end(), other.pus_.begin(), other.pus_.end(),
                        std::back_inserter(both));
  return CpuSet(std::move(both));
}

}  // namespace mncl::topology

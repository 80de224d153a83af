#include "topology/agreement.h"

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>
#include <tuple>

#include "common/error.h"

namespace mncl::topology {

namespace {

constexpr const char *kMagic = "mncl-choice-v2";

// "1, 3 and 4", or "0-7" for runs, for messages.
std::string rank_list(const std::vector<int> &ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j > i + 1 ? format("%d-%d", ranks[i], ranks[j]) : std::to_string(ranks[i]));
    if (j == i + 1) parts.push_back(std::to_string(ranks[j]));
    i = j + 1;
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  }
  return format("rank%s %s", ranks.size() > 1 ? "s" : "", out.c_str());
}

// "\n  gloo (auto): ranks 0-2\n  naive (MNCL_BACKEND=naive): rank 3", grouped by choice.
std::string choices_text(const std::vector<RankChoice> &ranks) {
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < ranks.size(); ++r) {
    groups[ranks[r].backend + " (" + ranks[r].how + ")"].push_back(static_cast<int>(r));
  }
  std::string out;
  for (const auto &[what, members] : groups) {
    out += format("\n  %s: %s", what.c_str(), rank_list(members).c_str());
  }
  return out;
}

}  // namespace

std::string serialize(const RankChoice &c) {
  std::string out =
      std::string(kMagic) + "\n" + c.backend + "\n" + (c.forced ? "1" : "0") + "\n" + c.how + "\n";
  for (const auto &name : c.ranked) out += name + "\n";
  // An empty line, then "<name>\t<build>" lines: no plugin name is empty.
  out += "\n";
  for (const auto &[name, build] : c.builds) out += name + "\t" + build + "\n";
  return out;
}

RankChoice parse_choice(const std::string &record) {
  std::istringstream in(record);
  std::string magic, forced;
  RankChoice c;
  std::getline(in, magic);
  MNCL_CHECK(magic == kMagic && std::getline(in, c.backend) && std::getline(in, forced) &&
                 std::getline(in, c.how),
             MNCL_ERR_BOOTSTRAP,
             "malformed backend choice record from another rank ('%.40s'; do all ranks run the "
             "same MNCL version? this one writes %s)",
             record.c_str(), kMagic);
  c.forced = forced == "1";
  bool builds = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) {
      builds = true;
      continue;
    }
    if (!builds) {
      c.ranked.push_back(line);
      continue;
    }
    const size_t tab = line.find('\t');
    MNCL_CHECK(tab != std::string::npos && tab > 0, MNCL_ERR_BOOTSTRAP,
               "malformed plugin build in another rank's backend choice ('%.40s')", line.c_str());
    c.builds[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return c;
}

namespace {

// Every rank that says which build of `backend` it loaded must have loaded the same one.
std::string builds_differ(const std::vector<RankChoice> &ranks, const std::string &backend) {
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto it = ranks[r].builds.find(backend);
    if (it != ranks[r].builds.end()) groups[it->second].push_back(static_cast<int>(r));
  }
  if (groups.size() <= 1) return "";
  std::string out = format(
      "ranks loaded different builds of the %s plugin, which run some calls differently "
      "(every rank must load the same libmncl-%s.so with the same MNCL_PLUGIN_ABI_MAX):",
      backend.c_str(), backend.c_str());
  for (const auto &[build, members] : groups) {
    out += format("\n  %s: %s", build.c_str(), rank_list(members).c_str());
  }
  return out;
}

}  // namespace

Agreement agree(const std::vector<RankChoice> &ranks) {
  Agreement a = agree_on_name(ranks);
  if (a.backend.empty()) return a;
  a.error = builds_differ(ranks, a.backend);
  if (!a.error.empty()) a.backend.clear();
  return a;
}

Agreement agree_on_name(const std::vector<RankChoice> &ranks) {
  Agreement a;
  if (ranks.empty()) {
    a.error = "no rank published a backend choice";
    return a;
  }
  const bool unanimous = std::all_of(ranks.begin(), ranks.end(), [&](const RankChoice &c) {
    return c.backend == ranks.front().backend;
  });
  if (unanimous) {
    a.backend = ranks.front().backend;
    a.why = format("every rank chose %s", a.backend.c_str());
    return a;
  }
  const bool any_forced =
      std::any_of(ranks.begin(), ranks.end(), [](const RankChoice &c) { return c.forced; });
  if (any_forced) {
    a.error =
        "ranks disagree on the backend (set MNCL_BACKEND, or MNCL_BACKEND_HOST/_CUDA, to "
        "the same value on every rank):" +
        choices_text(ranks);
    return a;
  }
  // Every rank chose by the rules, on different machines: the best backend they all can use.
  std::string best;
  long best_worst = LONG_MAX, best_sum = LONG_MAX;
  for (const std::string &name : ranks.front().ranked) {
    long worst = 0, sum = 0;
    bool everywhere = true;
    for (const RankChoice &c : ranks) {
      const auto it = std::find(c.ranked.begin(), c.ranked.end(), name);
      if (it == c.ranked.end()) {
        everywhere = false;
        break;
      }
      const long pos = it - c.ranked.begin();
      worst = std::max(worst, pos);
      sum += pos;
    }
    if (!everywhere) continue;
    if (std::make_tuple(worst, sum, name) < std::make_tuple(best_worst, best_sum, best) ||
        best.empty()) {
      best = name;
      best_worst = worst;
      best_sum = sum;
    }
  }
  if (best.empty()) {
    std::string lists;
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::string list;
      for (const auto &n : ranks[r].ranked) list += (list.empty() ? "" : ",") + n;
      lists += format("\n  rank %zu: %s", r, list.empty() ? "(nothing usable)" : list.c_str());
    }
    a.error = "no backend is usable on every rank (usable backends per rank, best first):" + lists;
    return a;
  }
  a.backend = best;
  a.why = format("the ranks' machines differ; %s is the best backend every rank can use:%s",
                 best.c_str(), choices_text(ranks).c_str());
  return a;
}

}  // namespace mncl::topology

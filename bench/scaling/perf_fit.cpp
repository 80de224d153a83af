#include "perf_fit.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace mncl_scaling {
namespace {

// Just enough JSON for mncl-perf's output: objects, arrays, strings, numbers, literals.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json *get(const std::string &key) const {
    for (const auto &m : members) {
      if (m.first == key) return &m.second;
    }
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string &s) : s_(s) {}
  Json parse() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char *what) const {
    throw std::runtime_error(std::string("JSON: ") + what + " at offset " + std::to_string(i_));
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  char peek() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail("unexpected character");
    ++i_;
  }
  Json value() {
    const char c = peek();
    Json v;
    if (c == '{') {
      v.kind = Json::kObject;
      ++i_;
      if (peek() == '}') return ++i_, v;
      for (;;) {
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value());
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::kArray;
      ++i_;
      if (peek() == ']') return ++i_, v;
      for (;;) {
        v.items.push_back(value());
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::kString;
      v.text = string();
      return v;
    }
    for (const char *literal : {"null", "true", "false"}) {
      if (s_.compare(i_, std::strlen(literal), literal) == 0) {
        i_ += std::strlen(literal);
        v.kind = literal[0] == 'n' ? Json::kNull : Json::kBool;
        v.number = literal[0] == 't';
        return v;
      }
    }
    std::size_t used = 0;
    try {
      v.number = std::stod(s_.substr(i_, 40), &used);
    } catch (const std::exception &) {
      fail("bad value");
    }
    i_ += used;
    v.kind = Json::kNumber;
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) {
        ++i_;
        if (s_[i_] == 'u') {  // not needed for the numbers: keep a placeholder
          out += '?';
          i_ += 5;
          continue;
        }
        const char e = s_[i_++];
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        continue;
      }
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

  const std::string &s_;
  std::size_t i_ = 0;
};

double number_of(const Json *v) {
  if (!v) return 0;
  if (v->kind == Json::kNumber) return v->number;
  if (v->kind == Json::kObject) return number_of(v->get("avg"));  // time_us: {avg, min, max}
  return 0;
}

// Any object with "results" is one mncl-perf run; sweeps nest them under backends[].run.
void collect_runs(const Json &v, PerfFile &out) {
  if (v.kind == Json::kArray) {
    for (const auto &item : v.items) collect_runs(item, out);
    return;
  }
  if (v.kind != Json::kObject) return;
  const Json *results = v.get("results");
  if (results && results->kind == Json::kArray) {
    const Json *backend = v.get("backend");
    const int ranks = static_cast<int>(number_of(v.get("ranks")));
    if (const Json *membw = v.get("membw")) out.membw_gbps = number_of(membw->get("GBps"));
    for (const auto &r : results->items) {
      PerfRow row;
      row.backend = backend ? backend->text : "";
      row.ranks = ranks;
      if (const Json *c = r.get("collective")) row.collective = c->text;
      if (const Json *p = r.get("placement")) row.placement = p->text;
      row.bytes = number_of(r.get("size"));
      row.time_us = number_of(r.get("time_us"));
      if (row.time_us > 0) out.rows.push_back(row);
    }
    return;
  }
  for (const auto &m : v.members) collect_runs(m.second, out);
}

std::vector<std::string> split_csv(const std::string &line) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  fields.push_back(field);
  return fields;
}

PerfFile read_csv(std::istream &in) {
  PerfFile out;
  std::string line;
  std::map<std::string, std::size_t> column;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto fields = split_csv(line);
    if (column.empty()) {
      for (std::size_t k = 0; k < fields.size(); ++k) column[fields[k]] = k;
      for (const char *need : {"backend", "collective", "size_B", "ranks", "time_us"}) {
        if (!column.count(need)) {
          throw std::runtime_error(std::string("CSV: no column ") + need +
                                   " (not mncl-perf output?)");
        }
      }
      continue;
    }
    auto field = [&](const char *name) -> std::string {
      const auto it = column.find(name);
      return it != column.end() && it->second < fields.size() ? fields[it->second] : "";
    };
    PerfRow row;
    row.backend = field("backend");
    row.collective = field("collective");
    row.placement = field("placement");
    try {
      row.ranks = std::stoi(field("ranks"));
      row.bytes = std::stod(field("size_B"));
      row.time_us = std::stod(field("time_us"));
      if (!field("membw_GBps").empty()) out.membw_gbps = std::stod(field("membw_GBps"));
    } catch (const std::exception &) {
      throw std::runtime_error("CSV: bad number in line: " + line);
    }
    if (row.time_us > 0) out.rows.push_back(row);
  }
  return out;
}

}  // namespace

PerfFile read_perf_file(const std::string &path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  const bool json = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (!json) return read_csv(in);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  PerfFile out;
  collect_runs(JsonParser(text).parse(), out);
  return out;
}

std::vector<std::pair<std::string, int>> allreduce_groups(const std::vector<PerfRow> &rows) {
  std::vector<std::pair<std::string, int>> groups;
  for (const auto &r : rows) {
    if (r.collective != "allreduce") continue;
    const std::pair<std::string, int> key{r.backend, r.ranks};
    bool known = false;
    for (const auto &g : groups) known = known || g == key;
    if (!known) groups.push_back(key);
  }
  return groups;
}

namespace {
// Weighted least squares of t = a + b n with weights 1/t^2 (relative residuals).
bool least_squares(const std::vector<std::pair<double, double>> &points, double &a, double &b) {
  double sw = 0, sn = 0, st = 0, snn = 0, snt = 0;
  for (const auto &[n, t] : points) {
    const double w = 1 / (t * t);
    sw += w, sn += w * n, st += w * t, snn += w * n * n, snt += w * n * t;
  }
  const double det = sw * snn - sn * sn;
  if (points.size() < 2 || std::abs(det) <= 1e-300) return false;
  b = std::max(0.0, (sw * snt - sn * st) / det);
  a = std::max(0.0, (st - b * sn) / sw);
  return true;
}
}  // namespace

Fit fit_allreduce(const std::vector<PerfRow> &rows, const std::string &backend, int ranks,
                  double min_bytes, double max_bytes) {
  std::vector<std::pair<double, double>> points;
  for (const auto &r : rows) {
    if (r.collective != "allreduce" || r.backend != backend || r.ranks != ranks) continue;
    if (r.bytes < min_bytes || r.bytes > max_bytes || r.bytes <= 0) continue;
    points.emplace_back(r.bytes, r.time_us * 1e-6);
  }
  Fit fit;
  fit.backend = backend;
  fit.ranks = ranks;
  auto fail = [&] {
    return std::runtime_error("no allreduce sizes to fit for backend " + backend + " at " +
                              std::to_string(ranks) + " ranks");
  };
  if (!least_squares(points, fit.a_s, fit.b_s_per_byte)) throw fail();
  // One robust pass: on a shared machine single sizes hit scheduling stalls (a rank descheduled
  // mid-call), so points more than 3x the median relative residual (and > 50 %) are dropped.
  std::vector<double> residuals;
  for (const auto &[n, t] : points) residuals.push_back(std::abs(fit.predict_s(n) - t) / t);
  std::vector<double> sorted = residuals;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double cut = std::max(0.5, 3 * sorted[sorted.size() / 2]);
  std::vector<std::pair<double, double>> kept;
  for (std::size_t k = 0; k < points.size(); ++k) {
    if (residuals[k] <= cut) kept.push_back(points[k]);
  }
  if (kept.size() >= 2 && kept.size() < points.size()) {
    Fit refit = fit;
    if (least_squares(kept, refit.a_s, refit.b_s_per_byte)) {
      fit = refit;
      points = kept;
    }
  }
  fit.points = points.size();
  double sq = 0;
  for (const auto &[n, t] : points) sq += std::pow((fit.predict_s(n) - t) / t, 2);
  fit.rms_relative_error = std::sqrt(sq / points.size());
  const double p = std::max(2, ranks);
  fit.link.alpha_s = fit.a_s / (2 * (p - 1));
  fit.link.beta_s_per_byte = fit.b_s_per_byte / (2 * (p - 1) / p);
  return fit;
}

}  // namespace mncl_scaling

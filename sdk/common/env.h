// Every environment variable MNCL reads is declared once, in the table in env.cpp, with its
// default and documentation; mncl-info prints that table. Values are read with secure_getenv
// (ignored in setuid programs) and logged once at info level when set (secrets: only that
// they are set).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mncl::env {

struct Variable {
  const char *name;
  const char *default_value;  // as documented ("" = unset)
  const char *doc;
};

// The table, in documentation order.
const std::vector<Variable> &table();
// The declaration of a variable, or nullptr if it is not in the table.
const Variable *find(const std::string &name);

// secure_getenv without logging or validation (for the logger itself).
const char *raw(const char *name);
// The value if set and non-empty; logs "NAME set by environment to VALUE" the first time
// (the value hidden for a secret: is_secret), and warns once for an MNCL_* name the table
// lacks (names outside MNCL_*, such as a plugin's own, draw no warning). The first call also
// warns once about every unknown MNCL_* variable set in the environment (unknown_variables),
// read or not: a misspelt name is never read, so it would otherwise pass unnoticed.
std::optional<std::string> get(const char *name);
// The MNCL_* variables set in this process's environment that the table lacks (the test
// suite's own hooks aside), each with the documented name it most likely meant, if any
// (MNCL_TIMOUT: MNCL_TIMEOUT; MNCL_LOG_LEVEL: MNCL_DEBUG).
struct Unknown {
  std::string name;
  std::string meant;  // "" when no documented name is close
};
// Names in the namespace of a plugin on the search path that the table has no variable of
// (MNCL_MINE_* for a third party's libmncl-mine.so) are that plugin's, and not unknown.
std::vector<Unknown> unknown_variables();
// Where unknown_variables() learns the plugins' names: the loader's (set at load time, as env
// may not depend on it). source must not call get() (it runs under get()'s lock): raw() only.
void set_plugin_names_source(std::vector<std::string> (*source)());
// "NAME is not a documented MNCL variable and has no effect (did you mean X?)".
std::string describe_unknown(const Unknown &unknown);
// Whether a variable's value must never be printed: its name contains TOKEN, SECRET,
// PASSWORD, PASSWD, KEY or CREDENTIAL (any case), as MNCL_STORE_TOKEN.
bool is_secret(const std::string &name);
// The value as logs and tools may show it: "set (hidden)" for a secret, "(unset)" for nullptr.
std::string shown_value(const std::string &name, const char *value);

// ASCII lower case: keyword values (auto, host, numa, backend names, log levels) are taken in
// any case, as NCCL_DEBUG=INFO is.
std::string lower(std::string text);

// Parsers that throw MNCL_ERR_INVALID_ARGUMENT naming the variable and the bad value.
// The longest timeout MNCL takes (one week): deadlines of now + timeout stay far from any
// clock's overflow, and poll()'s int milliseconds hold it.
constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;
// Seconds as a decimal number (fractions allowed), > 0 and <= 1 week; returns milliseconds.
std::optional<int64_t> get_timeout_ms(const char *name);
// A decimal integer in [lo, hi].
std::optional<int64_t> get_int(const char *name, int64_t lo, int64_t hi);

}  // namespace mncl::env

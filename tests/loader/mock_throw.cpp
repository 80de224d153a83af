// The C++ half of the mock_plugin.c variants built with MOCK_PROBE_THROWS: a plugin whose probe
// lets an exception escape (a bug the core must survive: that plugin is unusable).
#include <stdexcept>

extern "C" void mock_throw(const char *what) {
  if (what == nullptr) throw 42;  // not a std::exception
  throw std::runtime_error(what);
}

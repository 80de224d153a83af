// Private to the loader: reads a file's ELF header before dlopen, so a wrong file gets a precise
// reason ("32-bit ELF ... but this process is 64-bit") instead of dlerror's generic text.
#pragma once

#include <string>

namespace mncl::loader {

// "" if the file is a regular file holding a shared object this process could load (class,
// byte order, machine); else the reason.
std::string check_elf(const std::string &path);

}  // namespace mncl::loader

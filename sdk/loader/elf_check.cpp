// The ELF header checks done before dlopen (see elf_check.h).
#include "loader/elf_check.h"

#include <elf.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <type_traits>

#include "common/error.h"

namespace mncl::loader {

namespace {

#if defined(__x86_64__)
constexpr uint16_t kOwnMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kOwnMachine = EM_AARCH64;
#elif defined(__i386__)
constexpr uint16_t kOwnMachine = EM_386;
#elif defined(__arm__)
constexpr uint16_t kOwnMachine = EM_ARM;
#elif defined(__powerpc64__)
constexpr uint16_t kOwnMachine = EM_PPC64;
#elif defined(__riscv)
constexpr uint16_t kOwnMachine = EM_RISCV;
#elif defined(__s390x__)
constexpr uint16_t kOwnMachine = EM_S390;
#else
constexpr uint16_t kOwnMachine = EM_NONE;  // unknown here: leave the machine check to dlopen
#endif

constexpr unsigned char kOwnClass = sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32;
constexpr unsigned char kOwnData =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;

const char *machine_name(uint16_t machine) {
  switch (machine) {
    case EM_X86_64:
      return "x86-64";
    case EM_AARCH64:
      return "AArch64";
    case EM_386:
      return "i386";
    case EM_ARM:
      return "ARM";
    case EM_PPC64:
      return "PowerPC64";
    case EM_PPC:
      return "PowerPC";
    case EM_RISCV:
      return "RISC-V";
    case EM_S390:
      return "s390";
    case EM_CUDA:
      return "CUDA";
  }
  return "an unknown machine";
}

const char *bits(unsigned char elf_class) {
  return elf_class == ELFCLASS64 ? "64" : "32";
}

// The first bytes, quoted and escaped, so a log shows what the file really is.
std::string preview(const unsigned char *data, size_t n) {
  std::string out = "\"";
  for (size_t i = 0; i < n && i < 12; ++i) {
    const unsigned char c = data[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += format("\\x%02x", c);
    }
  }
  return out + "\"";
}

}  // namespace

std::string check_elf(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return format("cannot stat: %s", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return "not a regular file";

  std::ifstream in(path, std::ios::binary);
  if (!in) return format("cannot open: %s", std::strerror(errno));
  unsigned char buf[sizeof(Elf64_Ehdr)] = {};
  in.read(reinterpret_cast<char *>(buf), sizeof buf);
  const size_t n = static_cast<size_t>(in.gcount());

  if (n == 0) return "not an ELF file (empty file)";
  if (n < SELFMAG || std::memcmp(buf, ELFMAG, SELFMAG) != 0) {
    return "not an ELF file (starts with " + preview(buf, n) + ")";
  }
  if (n <= EI_DATA) return format("truncated ELF header (%zu bytes)", n);
  const unsigned char elf_class = buf[EI_CLASS];
  if (elf_class != ELFCLASS32 && elf_class != ELFCLASS64) {
    return format("invalid ELF class %u", elf_class);
  }
  if (elf_class != kOwnClass) {
    return format("%s-bit ELF (ELFCLASS%s) but this process is %s-bit", bits(elf_class),
                  bits(elf_class), bits(kOwnClass));
  }
  if (buf[EI_DATA] != kOwnData) {
    return format("%s ELF but this process is %s",
                  buf[EI_DATA] == ELFDATA2MSB ? "big-endian" : "little-endian",
                  kOwnData == ELFDATA2MSB ? "big-endian" : "little-endian");
  }
  // Class and byte order match ours, so the header can be read natively.
  using Ehdr = std::conditional_t<kOwnClass == ELFCLASS64, Elf64_Ehdr, Elf32_Ehdr>;
  if (n < sizeof(Ehdr)) return format("truncated ELF header (%zu bytes)", n);
  Ehdr header;
  std::memcpy(&header, buf, sizeof header);
  if (header.e_type != ET_DYN) {
    return format("ELF type %u is not a shared object (ET_DYN)",
                  static_cast<unsigned>(header.e_type));
  }
  if (kOwnMachine != EM_NONE && header.e_machine != kOwnMachine) {
    return format("ELF for %s (e_machine %u) but this process is %s (%u)",
                  machine_name(header.e_machine), static_cast<unsigned>(header.e_machine),
                  machine_name(kOwnMachine), static_cast<unsigned>(kOwnMachine));
  }
  return {};
}

}  // namespace mncl::loader

/*
 * make_bad_plugins.c — writes deliberately wrong "plugins" into a folder (argv[1]) at build
 * time, so the loader's refusals can be tested on real files:
 *   libmncl-text.so       a text file
 *   libmncl-empty.so      an empty file
 *   libmncl-elf32.so      a 32-bit ELF header (the other class on a 64-bit host, and vice versa)
 *   libmncl-foreign.so    an ELF header of this class for another machine
 *   libmncl-truncated.so  a valid ELF header for this machine and nothing else (dlopen fails)
 *   libmncl-dir.so        a folder
 * ELF headers start from this program's own header, so they match the build machine.
 */
#include <elf.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL || (len > 0 && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
    fprintf(stderr, "make_bad_plugins: cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <folder>\n", argv[0]);
    return 2;
  }
  const char *dir = argv[1];
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "make_bad_plugins: cannot create %s: %s\n", dir, strerror(errno));
    return 1;
  }

  /* This program's own ELF header: the right class, byte order and machine. */
  unsigned char own[sizeof(Elf64_Ehdr)] = {0};
  FILE *self = fopen("/proc/self/exe", "rb");
  if (self == NULL || fread(own, 1, sizeof own, self) < sizeof(Elf32_Ehdr)) {
    fprintf(stderr, "make_bad_plugins: cannot read /proc/self/exe\n");
    return 1;
  }
  fclose(self);
  const int is64 = own[EI_CLASS] == ELFCLASS64;
  const size_t own_size = is64 ? sizeof(Elf64_Ehdr) : sizeof(Elf32_Ehdr);

  const char text[] = "This is not a shared library, just text named like one.\n";
  write_file(dir, "libmncl-text.so", text, sizeof text - 1);
  write_file(dir, "libmncl-empty.so", "", 0);

  /* The other class: e_ident, then a header of that size, type ET_DYN. */
  unsigned char other[sizeof(Elf64_Ehdr)] = {0};
  memcpy(other, own, EI_NIDENT);
  other[EI_CLASS] = is64 ? ELFCLASS32 : ELFCLASS64;
  write_file(dir, "libmncl-elf32.so", other, is64 ? sizeof(Elf32_Ehdr) : sizeof(Elf64_Ehdr));

  /* Same class, another machine. e_type and e_machine sit at the same offsets in both classes. */
  unsigned char foreign[sizeof(Elf64_Ehdr)];
  memcpy(foreign, own, sizeof foreign);
  Elf64_Half type = ET_DYN, machine;
  memcpy(&machine, own + offsetof(Elf64_Ehdr, e_machine), sizeof machine);
  machine = machine == EM_AARCH64 ? EM_X86_64 : EM_AARCH64;
  memcpy(foreign + offsetof(Elf64_Ehdr, e_type), &type, sizeof type);
  memcpy(foreign + offsetof(Elf64_Ehdr, e_machine), &machine, sizeof machine);
  write_file(dir, "libmncl-foreign.so", foreign, own_size);

  unsigned char truncated[sizeof(Elf64_Ehdr)];
  memcpy(truncated, own, sizeof truncated);
  memcpy(truncated + offsetof(Elf64_Ehdr, e_type), &type, sizeof type);
  write_file(dir, "libmncl-truncated.so", truncated, own_size);

  char path[4096];
  snprintf(path, sizeof path, "%s/libmncl-dir.so", dir);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "make_bad_plugins: cannot create %s: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

#!/usr/bin/env bash
# Installs the build tree into a temporary prefix (cmake --install <build> --prefix <tmp>),
# checks the layout, then builds a consumer project against the INSTALLED tree with
# find_package(mncl CONFIG) and with pkg-config, and runs each as one rank on the installed
# naive plugin, which the installed libmncl must find next to itself (<libdir>/mncl/plugins),
# and the installed mncl-info (static core, in bin/) at bin/../<libdir>/mncl/plugins.
#
# Usage: check_install.sh <build dir> <work dir> <consumer source dir> <C compiler> <C++ compiler>
#                         [<CMAKE_INSTALL_LIBDIR>, default lib]
set -euo pipefail
build=$1 work=$2 src=$3 cc=$4 cxx=$5 libdir=${6:-lib}
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
echo "installed into $prefix ($(wc -l <"$work/install.log") lines of install log)"

status=0
expect_file() {
  for f in "$@"; do
    if [ -e "$prefix/$f" ]; then echo "  ok   $f"; else echo "  MISSING $f" >&2; status=1; fi
  done
}
expect_file include/mncl/mncl.h include/mncl/mncl_plugin.h include/mncl/mncl_plugin_v1.h \
  include/mncl/kit/common/host.h include/mncl/kit/common/tables.h $libdir/cmake/mncl/plugin.map \
  $libdir/cmake/mncl/mnclPlugin.cmake \
  include/mncl/frontends/communicator.hpp $libdir/libmncl.so $libdir/libmncl.so.1 \
  $libdir/mncl/plugins/libmncl-naive.so $libdir/libmncl_frontends.a bin/mncl-info bin/mncl-run \
  bin/mncl-perf $libdir/cmake/mncl/mnclConfig.cmake $libdir/cmake/mncl/mnclConfigVersion.cmake \
  $libdir/cmake/mncl/mnclTargets.cmake $libdir/pkgconfig/mncl.pc
# Nothing from the tests (mock plugins, test programs) is installed.
if find "$prefix" -name '*mock*' -o -name '*_test' | grep .; then
  echo "  test files were installed" >&2
  status=1
fi
[ $status -eq 0 ] || exit 1

# The installed tree must not lean on the build tree: no plugin path, no library path.
unset MNCL_PLUGIN_PATH LD_LIBRARY_PATH
export MNCL_BACKEND=naive

echo "--- installed mncl-info finds the installed plugins"
"$prefix/bin/mncl-info" --plugins 2>&1 | tee "$work/info.txt"
grep -Eq "naive +loaded" "$work/info.txt" || { echo "mncl-info: naive not loaded" >&2; exit 1; }
grep -q "^  $prefix/$libdir/mncl/plugins\$" "$work/info.txt" ||
  { echo "mncl-info: the installed plugin folder is not listed" >&2; exit 1; }
# The folder of a library, never one made from the program's own (bin/mncl/plugins).
if grep -q "^  $prefix/bin/" "$work/info.txt"; then
  echo "mncl-info: searches a plugin folder under bin/" >&2
  exit 1
fi

echo "--- find_package(mncl CONFIG)"
cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release \
  >"$work/cmake-configure.log" || { cat "$work/cmake-configure.log"; exit 1; }
grep "found mncl" "$work/cmake-configure.log"
cmake --build "$work/cmake-build" >"$work/cmake-build.log" 2>&1 ||
  { cat "$work/cmake-build.log"; exit 1; }
"$work/cmake-build/consumer_c"
"$work/cmake-build/consumer_cxx"

echo "--- pkg-config mncl"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
flags=$(pkg-config --cflags --libs mncl)
echo "pkg-config --cflags --libs mncl: $flags (version $(pkg-config --modversion mncl))"
libdir=$(pkg-config --variable=libdir mncl)
"$cc" -std=c99 -Wall -Wextra -Werror -o "$work/consumer_pc" "$src/consumer.c" $flags \
  -Wl,-rpath,"$libdir"
"$work/consumer_pc"
echo "--- the same program without an rpath, through LD_LIBRARY_PATH"
"$cc" -std=c99 -o "$work/consumer_pc_norpath" "$src/consumer.c" $flags
LD_LIBRARY_PATH=$libdir "$work/consumer_pc_norpath"
echo "--- a plugin built outside the tree: find_package(mncl) -> mncl::plugin_kit, mncl_add_plugin"
cmake -S "$src/../plugin" -B "$work/plugin-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release \
  >"$work/plugin-configure.log" || { cat "$work/plugin-configure.log"; exit 1; }
cmake --build "$work/plugin-build" >"$work/plugin-build.log" 2>&1 ||
  { cat "$work/plugin-build.log"; exit 1; }
plugin=$work/plugin-build/libmncl-kitdemo.so
# Its tables and nothing else (the version script that mncl_add_plugin links with).
exported=$(nm -D --defined-only "$plugin" | awk '{print $3}' | sort | tr '\n' ' ')
echo "exported: $exported"
[ "$exported" = "mncl_plugin_v1 mncl_plugin_v2 " ] ||
  { echo "libmncl-kitdemo.so exports more than its tables: $exported" >&2; exit 1; }
MNCL_PLUGIN_PATH=$work/plugin-build "$prefix/bin/mncl-info" --plugins >"$work/plugin-info.txt" 2>&1
grep -Eq "kitdemo +loaded" "$work/plugin-info.txt" ||
  { cat "$work/plugin-info.txt"; echo "mncl-info: kitdemo not loaded" >&2; exit 1; }
MNCL_PLUGIN_PATH=$work/plugin-build MNCL_BACKEND=kitdemo "$work/cmake-build/consumer_c" |
  tee "$work/plugin-run.txt"
grep -q "backend kitdemo: allreduce OK" "$work/plugin-run.txt"
echo "OK: the installed tree works with find_package and with pkg-config, and builds plugins"

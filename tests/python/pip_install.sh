#!/usr/bin/env bash
# Installs python/ with pip into a folder, offline, as a user would (`pip install ./python`):
# no build isolation (Debian's setuptools builds it), no dependencies fetched (Debian's numpy).
# The source is copied first so the build leaves nothing in the source tree.
# Usage: pip_install.sh <python> <python/ source folder> <work folder>
set -eu
py=$1 src=$2 work=$3
if ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "SKIPPED: numpy is not installed for $py (Debian: python3-numpy)"
  exit 77
fi
if ! "$py" -m pip --version >/dev/null 2>&1 || ! "$py" -c 'import setuptools' 2>/dev/null; then
  echo "SKIPPED: pip or setuptools missing for $py (Debian: python3-pip python3-setuptools)"
  exit 77
fi
rm -rf "$work/src" "$work/site"
mkdir -p "$work"
cp -r "$src" "$work/src"
rm -rf "$work/src/build" "$work/src"/*.egg-info
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --no-build-isolation --no-deps --no-index \
  --no-cache-dir --target "$work/site" "$work/src"
PYTHONPATH=$work/site "$py" -c 'import mncl; print("installed", mncl.__file__, "->", mncl.library_path)'
# Without MNCL_LIBRARY the package falls back to the dynamic loader's search.
if [ -n "${MNCL_LIBRARY:-}" ]; then
  env -u MNCL_LIBRARY LD_LIBRARY_PATH="$(dirname "$MNCL_LIBRARY")" PYTHONPATH="$work/site" "$py" -c \
    'import mncl; assert mncl.library_path == "libmncl.so.1", mncl.library_path; print("found through LD_LIBRARY_PATH: libmncl", mncl.version())'
fi
# Installed with --prefix P next to a library in P/lib (`cmake --install --prefix P`), the package
# finds it there; Debian's pip puts the package in P/local/lib/pythonX.Y/dist-packages.
if [ -n "${MNCL_LIBRARY:-}" ]; then
  rm -rf "$work/prefix"
  mkdir -p "$work/prefix/lib"
  cp "$MNCL_LIBRARY" "$work/prefix/lib/libmncl.so.1"
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q \
    --no-build-isolation --no-deps --no-index --no-cache-dir --prefix "$work/prefix" "$work/src"
  pkg=$(cd "$work/prefix" && find . -path '*-packages/mncl/__init__.py' | head -n 1)
  pkg=${pkg#./}
  [ -n "$pkg" ] || { echo "pip install --prefix: no mncl package under $work/prefix"; exit 1; }
  env -u MNCL_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$work/prefix/${pkg%/mncl/__init__.py}" \
    "$py" -c 'import mncl, os, sys; want = os.path.join(sys.argv[1], "lib/libmncl.so.1")
assert mncl.library_path == want, (mncl.library_path, want)
print("found in the prefix:", mncl.__file__, "->", mncl.library_path)' "$work/prefix"
fi
# Optional: ml_dtypes for test_ml_dtypes.py, from PyPI when it is reachable (never required:
# without it those tests skip with the reason). 0.4.1 is the last release that imports with
# Debian 12's numpy 1.24.
if ! "$py" -c 'import ml_dtypes' 2>/dev/null; then
  if PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore timeout 90 "$py" -m pip install \
      --no-deps --no-cache-dir --only-binary=:all: --timeout 20 --retries 1 -q \
      --target "$work/site" "ml_dtypes==0.4.1" >/dev/null 2>&1 &&
    PYTHONPATH=$work/site "$py" -c 'import ml_dtypes' 2>/dev/null; then
    echo "installed ml_dtypes 0.4.1 (PyPI) for the ml_dtypes tests"
  else
    echo "note: ml_dtypes could not be installed from PyPI; the ml_dtypes tests will skip"
  fi
fi

# Sourced by the tests/topology scripts: runs a command (check), and line checks on the output of
# the last command run, which the script keeps in $out (described by $what). A failed check
# prints what was missing or unexpected and sets status=1; the script exits with $status at the
# end.
status=0
expect() {  # expect <ERE>: some line of $out matches
  if ! grep -Eq -- "$1" <<<"$out"; then
    echo "MISSING in '$what': a line matching /$1/" >&2
    status=1
  fi
}
refute() {  # refute <ERE>: no line of $out matches
  if grep -Eq -- "$1" <<<"$out"; then
    echo "UNEXPECTED in '$what': a line matching /$1/" >&2
    status=1
  fi
}
check() {  # check <description> <command...>: runs it; its output in $out, its status in $rc
  what=$1
  shift
  out=$("$@" 2>&1)
  rc=$?
  echo "=== $what (exit $rc)"
  echo "$out"
}

# Sourced by flat's store-folder scripts (one rank each of an mpirun job): rank 0 prepares
# something, then marks it ready; the other ranks wait for the mark (10 s at most) first.
#   rank0_ready MARK        on rank 0: done preparing
#   wait_for_rank0 MARK     on the others: returns once MARK exists (or after 10 s)
rank0_ready() { touch "$1"; }
wait_for_rank0() {
  for _ in $(seq 200); do
    [ -e "$1" ] && return 0
    sleep 0.05
  done
  return 0
}

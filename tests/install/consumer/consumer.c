/* Built against an installed MNCL (find_package or pkg-config); one rank, any backend. */
#include <mncl/mncl.h>
#include <stdio.h>

int main(void) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  mncl_comm_t comm = NULL;
  const char *backend = "?";
  int x[3] = {1, 2, 3}, y[3] = {0, 0, 0};
  mncl_status_t st = mncl_comm_create(&config, &comm);
  if (st != MNCL_OK) {
    fprintf(stderr, "consumer: mncl_comm_create: %s: %s\n", mncl_status_string(st),
            mncl_last_error());
    return 1;
  }
  mncl_comm_backend(comm, &backend);
  st = mncl_allreduce(comm, x, y, 3, MNCL_INT32, MNCL_SUM, NULL);
  if (st != MNCL_OK || y[0] != 1 || y[1] != 2 || y[2] != 3) {
    fprintf(stderr, "consumer: allreduce: %s\n", mncl_last_error());
    return 1;
  }
  mncl_comm_destroy(comm);
  printf("consumer (C): libmncl %d, backend %s: allreduce OK\n", mncl_get_version(), backend);
  return 0;
}

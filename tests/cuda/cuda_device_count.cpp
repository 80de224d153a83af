// Prints the number of CUDA devices the runtime sees (0 on any error): the GPU tests' gate.
#include <cuda_runtime_api.h>

#include <cstdio>

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  std::printf("%d\n", count);
  return 0;
}

// A toy engine in C (CUDA C++ for its kernel): stepscope's C ABI around a loop of iterations,
// each launching K kernels, for NVIDIA's own tools to read stepscope's capture range and NVTX
// ranges (scripts/gpu_check.py builds it with nvcc on a GPU machine and runs it under ncu and
// nsys). Prints one JSON line: the iterations, the kernels launched, and which iterations
// stepscope ran (its window), so the tools' counts can be checked against it.
//
//   gpu_toy ITERATIONS KERNELS_PER_ITERATION '{"profiler": "cuda", "delay_iterations": 3, ...}'
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "stepscope.h"

__global__ void scale(float *x, int n, float a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a + 1.0f;
}

int main(int argc, char **argv) {
  int iterations = argc > 1 ? atoi(argv[1]) : 10;
  int per = argc > 2 ? atoi(argv[2]) : 4;
  const char *config = argc > 3 ? argv[3] : "{\"profiler\": \"cuda\", \"delay_iterations\": 3, \"max_iterations\": 2}";
  const int n = 1 << 20;
  float *x = NULL;
  if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess) {
    fprintf(stderr, "gpu_toy: cudaMalloc failed\n");
    return 2;
  }
  cudaMemset(x, 0, n * sizeof(float));
  cudaDeviceSynchronize();
  stepscope_profiler *p = NULL;
  if (stepscope_profiler_new(config, "toy", &p) != STEPSCOPE_OK) {
    fprintf(stderr, "gpu_toy: %s\n", stepscope_last_error());
    return 2;
  }
  if (stepscope_start(p, STEPSCOPE_KEEP, STEPSCOPE_KEEP) != STEPSCOPE_OK) {
    fprintf(stderr, "gpu_toy: start: %s\n", stepscope_last_error());
    return 2;
  }
  int window = 0;
  printf("{\"iterations\": %d, \"per_iteration\": %d, \"running\": [", iterations, per);
  for (int it = 0; it < iterations; it++) {
    // Decode of 8 requests, one token each (the range's name: execute_context_0(0)_generation_8(8)).
    stepscope_iteration info = {0, 0, 8, 8};
    stepscope_step(p, &info);
    int running = stepscope_is_running(p);
    window += running;
    printf("%s%d", it ? ", " : "", running);
    for (int k = 0; k < per; k++) scale<<<(n + 255) / 256, 256>>>(x, n, 0.5f);
    cudaDeviceSynchronize();
    stepscope_step_end(p);
  }
  stepscope_stop(p);
  stepscope_profiler_free(p);
  cudaFree(x);
  printf("], \"window_iterations\": %d, \"window_kernels\": %d, \"kernels\": %d}\n", window, window * per,
         iterations * per);
  return 0;
}

// Small kernels for test_cuda_racecheck.py, beside this file: correct ones, and ones with the bugs
// the emulator's race detector (QBENCH_CUDA=racecheck) and launch checks must catch. Never built
// by nvcc: they only need to compile against kernels/emulate/cuda_emu.h.
#include <stdint.h>

// Sum of each block's blockDim.x values (a power of two); shared memory: blockDim.x floats.
extern "C" __global__ void sum_ok(const float *x, float *out) {
  extern __shared__ float sum_buf[];
  const unsigned t = threadIdx.x;
  sum_buf[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
    if (t < h) sum_buf[t] = __fadd_rn(sum_buf[t], sum_buf[t + h]);
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = sum_buf[0];
}

// The same with the barrier inside the loop removed: a thread may read a partial sum before
// (or after) the thread that owns it has added to it.
extern "C" __global__ void sum_missing_sync(const float *x, float *out) {
  extern __shared__ float sum_buf[];
  const unsigned t = threadIdx.x;
  sum_buf[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
    if (t < h) sum_buf[t] = __fadd_rn(sum_buf[t], sum_buf[t + h]);
  }
  if (t == 0) out[blockIdx.x] = sum_buf[0];
}

// Threads 2k and 2k+1 both write byte k.
extern "C" __global__ void pairs_share_a_byte(uint8_t *out) {
  out[threadIdx.x / 2] = (uint8_t)threadIdx.x;
}

// Every block writes word 0.
extern "C" __global__ void blocks_share_a_word(int32_t *out) {
  if (threadIdx.x == 0) out[0] = (int32_t)blockIdx.x;
}

// Thread 0 reads a shared slot nothing wrote.
extern "C" __global__ void reads_uninitialised_shared(float *out) {
  extern __shared__ float sum_buf[];
  if (threadIdx.x > 0) sum_buf[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = sum_buf[threadIdx.x];
}

// out[i] = x[i + 1] for i < n: reads one value past the end of x.
extern "C" __global__ void reads_past_the_end(const float *x, float *out, int32_t n) {
  const int32_t i = (int32_t)threadIdx.x;
  if (i < n) out[i] = x[i + 1];
}

// out[i] = 1 for i <= n: writes one value past the end.
extern "C" __global__ void writes_past_the_end(float *out, int32_t n) {
  if ((int32_t)threadIdx.x <= n) out[threadIdx.x] = 1.0f;
}

// Writes shared memory past the blockDim.x floats the launch asks for.
extern "C" __global__ void shared_overrun(float *out) {
  extern __shared__ float sum_buf[];
  sum_buf[threadIdx.x + blockDim.x] = 2.0f;
  out[threadIdx.x] = 1.0f;
}

// Thread 0 returns before a barrier the others wait at.
extern "C" __global__ void divergent_barrier(float *out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// out[i] = i ^ 1 through a full-warp shuffle: wrong in a block that is not whole warps.
extern "C" __global__ void swap_neighbours(int32_t *out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int32_t)threadIdx.x, 1);
}

// Counts the threads of the grid into out[0]: atomically, and with a lost-update race.
extern "C" __global__ void count_atomic(int32_t *out) { atomicAdd(out, 1); }

extern "C" __global__ void count_racy(int32_t *out) {
  const int32_t seen = *out;
  __threadfence();  // a yield point between the read and the write
  *out = seen + 1;
}

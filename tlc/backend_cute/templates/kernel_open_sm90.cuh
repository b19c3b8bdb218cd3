extern "C" __global__ void __launch_bounds__(${threads}, ${min_blocks}) ${name}(const __grid_constant__ ${params} p) {
  using namespace cute;
  extern __shared__ __align__(1024) char smem_[];

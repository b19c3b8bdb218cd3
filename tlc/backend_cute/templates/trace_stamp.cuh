// A phase boundary of the kernel's timeline (`trace-phases`): (SM id << 56) | the SM's clock, at
// [(CTA × warp groups + warp group) × slots + slot] of ${buffer}; entries past its end are dropped.
__device__ __forceinline__ void ${buffer}_stamp(int slots, int slot) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const unsigned long long cta = blockIdx.x + gridDim.x * (blockIdx.y + static_cast<unsigned long long>(gridDim.y) * blockIdx.z);
  const unsigned long long at = (cta * ((blockDim.x + 127) / 128) + threadIdx.x / 128) * slots + slot;
  const unsigned long long now = static_cast<unsigned long long>(clock64()) & ((1ull << 56) - 1);
  if (at < ${entries}ull) ${buffer}[at] = (static_cast<unsigned long long>(smid) << 56) | now;
}

// A phase boundary of the kernel's timeline (`trace-phases`): (SM id << 56) | the SM's clock, at
// [(unit × warp groups + warp group) × slots + slot] of ${buffer} (the unit: the CTA, or a persistent
// kernel's tile turn); entries past its end are dropped.
__device__ __forceinline__ unsigned long long ${buffer}_cta() {
  return blockIdx.x + gridDim.x * (blockIdx.y + static_cast<unsigned long long>(gridDim.y) * blockIdx.z);
}
__device__ __forceinline__ void ${buffer}_stamp(int slots, int slot, unsigned long long unit) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const unsigned long long at = (unit * ((blockDim.x + 127) / 128) + threadIdx.x / 128) * slots + slot;
  const unsigned long long now = static_cast<unsigned long long>(clock64()) & ((1ull << 56) - 1);
  if (at < ${entries}ull) ${buffer}[at] = (static_cast<unsigned long long>(smid) << 56) | now;
}

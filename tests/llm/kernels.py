"""A naive but correct CUDA attention kernel, the scripted "vanilla" answer (one thread per query row)."""
from __future__ import annotations

NAIVE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef __ELEM__ T;
constexpr int D_QK = __DQK__;
constexpr int D_V = __DV__;
constexpr int BLOCK_M = 64;
constexpr int NUM_THREADS = 64;
constexpr int SMEM_BYTES = 0;
constexpr bool CAUSAL = __CAUSAL__;
constexpr bool BOTTOM_RIGHT = __BOTTOM_RIGHT__;

__device__ inline float to_f(T x) { return (float)x; }

extern "C" __global__ void attention_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                         const T* __restrict__ v, T* __restrict__ o,
                                         int batch, int num_heads_q, int num_heads_kv,
                                         int seqlen_q, int seqlen_k, float scale) {
  int row = blockIdx.x * BLOCK_M + threadIdx.x;
  int h = blockIdx.y, b = blockIdx.z;
  if (row >= seqlen_q) return;
  int hk = h / (num_heads_q / num_heads_kv);
  const T* qr = q + (((long long)b * num_heads_q + h) * seqlen_q + row) * D_QK;
  const T* kb = k + ((long long)b * num_heads_kv + hk) * seqlen_k * D_QK;
  const T* vb = v + ((long long)b * num_heads_kv + hk) * seqlen_k * D_V;
  T* orow = o + (((long long)b * num_heads_q + h) * seqlen_q + row) * D_V;
  int last = seqlen_k - 1;
  if (CAUSAL) last = BOTTOM_RIGHT ? row + seqlen_k - seqlen_q : row;
  if (last > seqlen_k - 1) last = seqlen_k - 1;
  float acc[D_V];
  for (int d = 0; d < D_V; ++d) acc[d] = 0.f;
  float m = __int_as_float(0xff800000), l = 0.f;  // -inf
  for (int j = 0; j <= last; ++j) {
    float s = 0.f;
    for (int d = 0; d < D_QK; ++d) s += to_f(qr[d]) * to_f(kb[(long long)j * D_QK + d]);
    s *= scale;
    float m_new = fmaxf(m, s);
    float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
    for (int d = 0; d < D_V; ++d) acc[d] = acc[d] * corr + p * to_f(vb[(long long)j * D_V + d]);
    m = m_new;
  }
  float inv = l > 0.f ? 1.f / l : 0.f;
  for (int d = 0; d < D_V; ++d) orow[d] = T(acc[d] * inv);
}
"""


def naive_kernel(d_qk: int = 128, d_v: int = 128, dtype: str = "bf16", causal: bool = False,
                 bottom_right: bool = False, bug: str | None = None) -> str:
    src = (NAIVE.replace("__ELEM__", "__nv_bfloat16" if dtype == "bf16" else "__half")
           .replace("__DQK__", str(d_qk)).replace("__DV__", str(d_v))
           .replace("__CAUSAL__", "true" if causal else "false")
           .replace("__BOTTOM_RIGHT__", "true" if bottom_right else "false"))
    if bug == "no-scale":
        src = src.replace("s *= scale;", "")
    if bug == "syntax":
        src = src.replace("float m_new", "float m_new float", 1)
    return src.strip() + "\n"

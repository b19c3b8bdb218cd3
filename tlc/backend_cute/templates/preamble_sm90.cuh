// tlc helpers for wgmma accumulators (sm_90a programs only). A wgmma C fragment is
// ((2, 2, N/8), MMA_M, MMA_N): per thread a column pair, rows r and r + 8, one pair per n8 block.
// These overloads take layouts whose mode 0 has rank 3; the sm_80 forms (mode 0 (2, 2)) are unchanged.
namespace tlc {

template <class Shape, class Stride>
using if_wgmma_acc_ = cute::enable_if_t<decltype(cute::rank(cute::get<0>(cute::declval<Shape const&>())))::value == 3, int>;

// (rows, cols) = ((2, MMA_M), (2, N/8, MMA_N)).
template <class Shape, class Stride, if_wgmma_acc_<Shape, Stride> = 0>
CUTE_HOST_DEVICE constexpr auto rowcol(cute::Layout<Shape, Stride> const& acc) {
  static_assert(decltype(cute::size<0, 0>(acc))::value == 2 && decltype(cute::size<0, 1>(acc))::value == 2);
  return cute::make_layout(cute::make_layout(cute::get<0, 1>(acc), cute::get<1>(acc)),
                           cute::make_layout(cute::get<0, 0>(acc), cute::get<0, 2>(acc), cute::get<2>(acc)));
}

// The accumulator as the A operand of an RS wgmma (k16 slices): each k16 slice takes two n8 blocks,
// ((2, 2, N/8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, (N/16, MMA_N)).
template <class TiledMma, class Shape, class Stride, if_wgmma_acc_<Shape, Stride> = 0>
CUTE_HOST_DEVICE constexpr auto acc_to_a(cute::Layout<Shape, Stride> const& acc) {
  static_assert(decltype(cute::size<0, 2>(acc))::value % 2 == 0, "an A operand takes whole k16 slices");
  auto n8 = cute::logical_divide(cute::get<0, 2>(acc), cute::Shape<cute::_2>{});  // ((2, N/16))
  return cute::make_layout(cute::make_layout(cute::get<0, 0>(acc), cute::get<0, 1>(acc), cute::get<0, 0>(n8)),
                           cute::get<1>(acc), cute::make_layout(cute::get<0, 1>(n8), cute::get<2>(acc)));
}

// threadIdx.x of the first thread of this thread's warp group, as a warp-uniform value (a shuffle from
// lane 0), so that values computed from it (a warp group's descriptors) live in uniform registers.
CUTE_DEVICE int warp_group_thread0() {
  return __shfl_sync(0xffffffff, int(threadIdx.x) / 128, 0) * 128;
}

// A GMMA shared-memory descriptor: the start address of `smem` (>> 4, 14 bits) and the fields tlc
// computed from the operand's layout (tlc/layout/gmma.py): `lo` the leading byte offset, `hi` the
// stride byte offset and layout type. What make_gmma_desc builds, without its layout algebra.
CUTE_DEVICE cute::GmmaDescriptor gmma_desc(void const* smem, uint32_t lo, uint32_t hi) {
  cute::GmmaDescriptor desc;
  desc.reg32_[0] = ((cute::cast_smem_ptr_to_uint(smem) >> 4) & 0x3FFFu) | lo;
  desc.reg32_[1] = hi;
  return desc;
}

}  // namespace tlc

"""CPU layout checks with pycute (docs/correctness.md): the SM80 m16n8k16 MMA atom's
thread-value (TV) layouts against the lowering's choices — the accumulator → A-operand
regroup that keeps P in registers, ldmatrix vs ldmatrix.trans per operand majorness, and
the swizzled shared layouts' bank behaviour under ldmatrix. `infer-layouts` asks
`required_load` which load an operand needs; `pipeline` runs `check_program` on the KIR.

A TV layout maps (thread, value) → the element's column-major index in the atom's tile,
as CuTe's `MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN>` (cute/atom/mma_traits_sm80.hpp).
"""
from __future__ import annotations

from typing import Callable

from pycute import ComposedLayout, Layout, Swizzle

from tlc.kir.ops import CopyOp, ProgramOp, SharedBufferOp, SmemLayoutOp, TiledCopyOp, walk  # noqa: F401 (walk re-exported for tests)

# --------------------------------------------------------------------------- the MMA atom
# PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16/.bf16):
# groupID = laneid >> 2, threadID_in_group = laneid % 4; A holds a0..a7, B b0..b3, C c0..c3.


def ptx_a(lane: int, i: int) -> tuple[int, int]:
    """(row m, col k) of a_i: row groupID (+8 for a2,a3,a6,a7), col 2·tig + (i&1) (+8 for i ≥ 4)."""
    g, t = lane >> 2, lane % 4
    return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >= 4)


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    """(row k, col n) of b_i: row 2·tig + (i&1) (+8 for i ≥ 2), col groupID."""
    g, t = lane >> 2, lane % 4
    return 2 * t + (i & 1) + 8 * (i >= 2), g


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row m, col n) of c_i: row groupID (+8 for c2,c3), col 2·tig + (i&1)."""
    g, t = lane >> 2, lane % 4
    return g + 8 * (i >= 2), 2 * t + (i & 1)


# The same fragments as CuTe writes them: thread = (tig, groupID), values colexicographic.
A_TV = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))  # (M16, K16) → m + 16·k
B_TV = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))          # (N8, K16)  → n + 8·k
C_TV = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))          # (M16, N8)  → m + 16·n


def tv_table(layout: Layout | Callable[[int, int], int], values: int) -> list[list[int]]:
    """[thread][value] → element index, for a pycute layout or a function."""
    f = layout if callable(layout) and not isinstance(layout, Layout) else (lambda t, v: layout((t, v)))
    return [[f(t, v) for v in range(values)] for t in range(32)]


def atom_problems() -> list[str]:
    """CuTe's TV layouts agree with the PTX ISA's fragment description, element for element."""
    want = {"A": (A_TV, 8, lambda t, i: ptx_a(t, i)[0] + 16 * ptx_a(t, i)[1]),
            "B": (B_TV, 4, lambda t, i: ptx_b(t, i)[1] + 8 * ptx_b(t, i)[0]),
            "C": (C_TV, 4, lambda t, i: ptx_c(t, i)[0] + 16 * ptx_c(t, i)[1])}
    return [f"{role}: CuTe's TV layout {lay} disagrees with the PTX fragment table"
            for role, (lay, n, fn) in want.items() if tv_table(lay, n) != tv_table(fn, n)]


# --------------------------------------------------------------------------- (a) P stays in registers
# Two adjacent n8 accumulator atoms cover a 16×16 tile of S; the second sits 8 columns
# (8·16 = 128 elements) further. FA2's convert_layout_acc_Aregs regroups the values
# ((2,2), (2)) → (2,2,2): atom 0's four values, then atom 1's.
ACC_PAIR_TV = Layout(((4, 8), ((2, 2), 2)), ((32, 1), ((16, 8), 128)))   # (M16, N16) → m + 16·n
# The same 16×16 tile read as two n8 B-operand atoms (rows = n_b, cols = k_b): a wrong target.
B_PAIR_TV = Layout(((4, 8), ((2, 2), 2)), ((32, 1), ((16, 128), 8)))


def regroup_problems(src: Layout = ACC_PAIR_TV, dst: Layout = A_TV, values: int = 8) -> list[str]:
    """Every register of every thread holds the element the target operand expects there."""
    problems = []
    have, need = tv_table(src, values), tv_table(dst, values)
    for t in range(32):
        for v in range(values):
            if have[t][v] != need[t][v]:
                h, n = divmod(have[t][v], 16)[::-1], divmod(need[t][v], 16)[::-1]
                problems.append(f"thread {t} register {v} holds element {h} of the accumulator, "
                                f"but the operand needs {n}")
    return problems


# --------------------------------------------------------------------------- (b) ldmatrix vs ldmatrix.trans
# PTX ISA, "ldmatrix": each 8×8 b16 matrix is 8 rows of 16 contiguous bytes, one row address
# per lane; without .trans lane l receives row l/4, elements 2(l%4) and 2(l%4)+1; with .trans
# it receives element l/4 of rows 2(l%4) and 2(l%4)+1.
LOADS = ("ldmatrix", "ldmatrix.trans")
LOAD_OF_ATOM = {"SM75_U32x4_LDSM_N": "ldmatrix", "SM75_U16x8_LDSM_T": "ldmatrix.trans"}


def ldmatrix_tv(major: str, load: str) -> Layout:
    """What `load` of one 8×8 block delivers: (T32, V2) → (MN8, K8) index mn + 8·k, for an
    operand stored `major`-contiguous ("k": rows run along MN; "mn": rows run along K)."""
    def element(lane: int, v: int) -> int:
        row, col = (lane >> 2, 2 * (lane % 4) + v) if load == "ldmatrix" else (2 * (lane % 4) + v, lane >> 2)
        mn, k = (row, col) if major == "k" else (col, row)
        return mn + 8 * k

    return _affine(element, ((4, 8), 2))


def _first_block(tv: Layout, rows: int) -> Layout:
    """Values 0 and 1 of an operand TV layout (its first 8×8 block), re-indexed mn + 8·k."""
    return _affine(lambda t, v: tv((t, v)) % rows + 8 * (tv((t, v)) // rows), ((4, 8), 2))


def load_problems(role: str, major: str, load: str) -> list[str]:
    want = _first_block(A_TV, 16) if role == "A" else _first_block(B_TV, 8)
    got = ldmatrix_tv(major, load)
    if tv_table(got, 2) == tv_table(want, 2):
        return []
    return [f"{load} of a {major}-major {role} operand delivers {got}, but the MMA's {role} fragment is {want}"]


def required_load(role: str, major: str) -> str:
    """The one shared→register load that gives the MMA its operand layout."""
    fits = [ld for ld in LOADS if not load_problems(role, major, ld)]
    assert len(fits) == 1, (role, major, fits)
    return fits[0]


# --------------------------------------------------------------------------- (c) swizzles
def smem_layout(swizzle: tuple[int, int, int] | None, atom: tuple[int, int], shape: tuple[int, ...]):
    """CuTe's tile_to_shape(composition(Swizzle<B,M,S>, row-major atom), (rows, cols)): atoms
    repeat down the rows first. Maps (row, col) → element offset."""
    (ar, ac), (rows, cols) = atom, shape[:2]
    tiled = Layout(((ar, rows // ar), (ac, cols // ac)), ((ac, ar * ac), (1, ar * ac * (rows // ar))))
    return tiled if swizzle is None else ComposedLayout(Swizzle(*swizzle), 0, tiled)


def ldmatrix_phase_problems(layout, shape: tuple[int, ...], elem_bytes: int = 2) -> list[str]:
    """An ldmatrix phase reads 8 rows × 16 bytes at one column: conflict-free iff the 8 reads hit
    8 different 16-byte bank groups (32 banks × 4 bytes = 8 groups of 16 bytes per 128 bytes)."""
    rows, cols = shape[:2]
    chunk = 16 // elem_bytes
    problems = []
    for r0 in range(0, rows, 8):
        for c in range(0, cols, chunk):
            groups = [layout((r, c)) * elem_bytes // 16 % 8 for r in range(r0, r0 + 8)]
            if len(set(groups)) < 8:
                worst = max(groups.count(g) for g in groups)
                problems.append(f"rows {r0}..{r0 + 7} at column {c}: bank groups {groups} ({worst}-way conflict)")
    return problems


# --------------------------------------------------------------------------- the kernel IR
def check_program(program: ProgramOp, loads: dict[str, str] | None = None) -> list[str]:
    """Swizzled shared layouts are conflict-free under ldmatrix; with `loads` (copy name → load
    the lowering chose), each GEMM's shared→register copy uses that load."""
    ops = list(walk(program))
    elem = {op.layout: 2 if op.dtype in ("bf16", "fp16") else 4 for op in ops if isinstance(op, SharedBufferOp)}
    copies = {op.name: op for op in ops if isinstance(op, TiledCopyOp)}
    problems = []
    for op in ops:
        if isinstance(op, SmemLayoutOp) and op.name in elem:
            layout = smem_layout(op.swizzle, op.atom, op.shape)
            problems += [f"{op.name}: {p}" for p in ldmatrix_phase_problems(layout, op.shape, elem[op.name])[:3]]
    for copy_name in sorted({op.copy for op in ops if isinstance(op, CopyOp) and op.kblock is not None}):
        copy = copies.get(copy_name)   # a GEMM operand's k-block load
        if copy is None or loads is None or copy_name not in loads:
            continue
        have = LOAD_OF_ATOM.get(copy.atom, copy.atom)
        if have != loads[copy_name]:
            problems.append(f"{copy_name} uses {copy.atom} ({have}) but the lowering chose {loads[copy_name]}")
    return problems


def _affine(fn: Callable[[int, int], int], shape: tuple) -> Layout:
    """A pycute Layout equal to `fn` on ((t0, t1), v), which must be affine in each mode."""
    (t0n, t1n), vn = shape
    base = fn(0, 0)
    strides = ((fn(1, 0) - base, fn(4, 0) - base), fn(0, 1) - base)
    layout = Layout(shape, strides)
    assert base == 0 and all(layout((t, v)) == fn(t, v) for t in range(t0n * t1n) for v in range(vn))
    return layout

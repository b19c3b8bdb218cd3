"""Hypothesis strategies for TL programs: valid program text in the spellings LLMs and
people write, problem shapes that stress tile edges, and never-zero inputs.

    @given(tl_programs(variant="attention").flatmap(with_shapes))
    def test_mine(case): ...
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from hypothesis import strategies as st

from tlc.testing.checks import ProgramInfo, ProgramLike, Shapes, as_graph, program_info, random_tensor

KEYWORDS = frozenset("""Param Input Allocate in global shared register with offset Copy coordinate from to
Compute GEMM and get new accumulate Multiply Divide Tanh Relu Mask causal Softmax max sum Reshape as for
end when""".split())
CASES = ("paper", "lower", "upper", "mixed")


@dataclass(frozen=True)
class ProgramChoices:
    """Everything one generated program varies; `render()` writes it as TL text."""

    variant: str = "attention"
    bm: int = 4
    bn: int = 4
    d_qk: int = 4
    d_v: int = 4
    kv: str = "head_idx / group"        # K/V offset: GQA, strict MHA ("head_idx") or MQA ("0")
    causal: bool = False
    align: str = "top_left"
    mask_style: str = "guard"           # "guard": `… when Causal`; "explicit": alignment written out
    softcap: bool = False
    reshape: bool = True
    transpose: str = ""                 # "", "K" or "V": that tensor is stored transposed in global
    register_copies: bool = True
    named_stats: bool = True            # `with max m, sum l` + a final Divide, or a normalised Softmax
    loop: str = "end"                   # "end" or "indented"
    bound: str = "div"                  # "div" (seqlen_k / BN) or "cdiv"
    rows_from_end: bool = False         # query tiles counted from the end: `[L = block_idx from end]`
    case: str = "paper"
    decorate: bool = False              # comments, blank lines, trailing spaces

    def render(self) -> str:
        return _Writer(self).text()


class _Writer:
    def __init__(self, c: ProgramChoices):
        self.c = c
        self.lines: list[str] = []
        self.depth = 0
        self._n = 0

    def kw(self, word: str) -> str:
        case = self.c.case
        if case == "mixed":
            self._n += 1
            case = ("lower", "upper", "paper")[self._n % 3]
        return word.lower() if case == "lower" else word.upper() if case == "upper" else word

    def line(self, text: str) -> None:
        words = [self.kw(w) if w in KEYWORDS else w for w in text.split(" ")]
        out = "  " * self.depth + " ".join(words)
        if self.c.decorate and len(self.lines) % 4 == 1:
            out += "   # note"
        elif self.c.decorate and len(self.lines) % 5 == 2:
            out += "  \t"
        self.lines.append(out)
        if self.c.decorate and len(self.lines) % 6 == 0:
            self.lines.append("")

    def text(self) -> str:
        c = self.c
        b2b = c.variant == "b2b_gemm"
        q, k, v, s = ("A", "B", "C", "S") if b2b else ("Q", "K", "V", "S")
        dq, dv = ("K1", "N2") if b2b else ("DQK", "DV")
        self.lines.append(f"# generated: {c}")
        self.line(f"Param Variant = {c.variant}")
        self.line(f"Param {dq} = {c.d_qk}")
        self.line(f"Param {dv} = {c.d_v}")
        self.line(f"Param BM = {c.bm}")
        self.line(f"Param BN = {c.bn}")
        self.line(f"Param Causal = {'true' if c.causal and not b2b else 'false'}")
        self.line(f"Param Align = {c.align}")
        if c.softcap and not b2b:
            self.line("Param Softcap = 2.5")
        self.line("Input seqlen_q, seqlen_k : int")
        if not b2b:
            self.line("Input scale : float")
        kv = "head_idx" if b2b else c.kv
        kshape = f"({dq}, seqlen_k)" if c.transpose == "K" else f"(seqlen_k, {dq})"
        vshape = f"({dv}, seqlen_k)" if c.transpose == "V" else f"(seqlen_k, {dv})"
        self.line(f"Allocate {q} in global (seqlen_q, {dq}) with offset head_idx")
        self.line(f"Allocate {k} in global {kshape} with offset {kv}")
        self.line(f"Allocate {v} in global {vshape} with offset {kv}")
        self.line(f"Allocate O in global (seqlen_q, {dv}) with offset head_idx")
        ktile = f"({dq}, BN)" if c.transpose == "K" else f"(BN, {dq})"
        vtile = f"({dv}, BN)" if c.transpose == "V" else f"(BN, {dv})"
        self.line(f"Allocate {q} in shared (BM, {dq})")
        self.line(f"Allocate {k} in shared {ktile}")
        self.line(f"Allocate {v} in shared {vtile}")
        self.line(f"Allocate O in register (BM, {dv})")
        rows = "block_idx from end" if c.rows_from_end else "block_idx"
        self.line(f"Copy {q} (BM, {dq}) in coordinate [L = {rows}] from global to shared")
        if c.register_copies:
            self.line(f"Copy {q} from shared to register")
        bound = "seqlen_k / BN" if c.bound == "div" else "cdiv(seqlen_k, BN)"
        self.line(f"for n in 0:{bound}:" if c.loop == "indented" else f"for n = 0:{bound}")
        self.depth += 1
        kcoord = "C" if c.transpose == "K" else "L"
        vcoord = "C" if c.transpose == "V" else "L"
        self.line(f"Copy {k} {ktile} in coordinate [{kcoord} = n] from global to shared")
        self.line(f"Copy {v} {vtile} in coordinate [{vcoord} = n] from global to shared")
        if c.register_copies:
            self.line(f"Copy {k} from shared to register")
        self.line(f"Compute GEMM {q}, {k}{'' if c.transpose == 'K' else '.T'} and get {s}")
        if b2b:
            self.line(f"Compute Relu {s} and get new {s}")
            p = s
        else:
            self._scores()
            p = "P"
        if c.reshape:
            self.line(f"Reshape {p} from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N) as bf16")
        if c.register_copies:
            self.line(f"Copy {v} from shared to register")
        self.line(f"Compute GEMM {p}, {v}{'.T' if c.transpose == 'V' else ''} and accumulate O")
        self.depth -= 1
        if c.loop == "end":
            self.line("end")
        if c.named_stats and not b2b:
            self.line("Compute Divide O, l and get new O")
        self.line(f"Copy O (BM, {dv}) in coordinate [L = {rows}] from register to global")
        return "\n".join(self.lines) + "\n"

    def _scores(self) -> None:
        c = self.c
        self.line("Compute Multiply S, scale and get new S")
        if c.softcap:
            self.line("Compute Divide S, Softcap and get new S")
            self.line("Compute Tanh S and get new S")
            self.line("Compute Multiply S, Softcap and get new S")
        if c.mask_style == "guard":
            self.line("Compute Mask S causal Align and get new S when Causal")
        elif c.causal:
            self.line(f"Compute Mask S causal {c.align} and get new S")
        if c.named_stats:
            self.line("Compute Softmax S with max m, sum l and get P")
        else:
            self.line("Compute Softmax S and get P")


def _maybe(value: Any, strategy: st.SearchStrategy) -> st.SearchStrategy:
    return strategy if value is None else st.just(value)


@st.composite
def program_choices(draw, variant: str | None = None, causal: bool | None = None, with_reshape: bool | None = None,
                    transposes: bool | None = None, kv: str | None = None) -> ProgramChoices:
    v = draw(_maybe(variant, st.sampled_from(["attention", "b2b_gemm"])))
    d_qk = draw(st.integers(1, 6))
    same_dv = draw(st.booleans())
    transpose = ""
    if transposes is not False:
        transpose = draw(st.sampled_from(["K", "V"]) if transposes else st.sampled_from(["", "K", "V"]))
    return ProgramChoices(
        variant=v,
        bm=draw(st.integers(1, 5)),
        bn=draw(st.integers(1, 5)),
        d_qk=d_qk,
        d_v=d_qk if same_dv else draw(st.integers(1, 6)),
        kv=draw(_maybe(kv, st.sampled_from(["head_idx / group", "head_idx", "0"]))),
        causal=draw(_maybe(causal, st.booleans())),
        align=draw(st.sampled_from(["top_left", "bottom_right"])),
        mask_style=draw(st.sampled_from(["guard", "explicit"])),
        softcap=draw(st.booleans()),
        reshape=draw(_maybe(with_reshape, st.booleans())),
        transpose=transpose,
        register_copies=draw(st.booleans()),
        named_stats=draw(st.booleans()),
        loop=draw(st.sampled_from(["end", "indented"])),
        bound=draw(st.sampled_from(["div", "cdiv"])),
        rows_from_end=draw(st.booleans()),
        case=draw(st.sampled_from(CASES)),
        decorate=draw(st.booleans()),
    )


def tl_programs(variant: str | None = None, causal: bool | None = None, with_reshape: bool | None = None,
                transposes: bool | None = None, kv: str | None = None) -> st.SearchStrategy[str]:
    """Valid TL program text. Fix a choice by passing it; leave None to vary it.

    variant: "attention" or "b2b_gemm"; kv: the K/V head offset ("head_idx / group" for
    GQA, "head_idx" for strict MHA, "0" for MQA); transposes: True always stores K or V
    transposed in global memory (so the GEMM drops or adds `.T`), False never."""
    return program_choices(variant, causal, with_reshape, transposes, kv).map(ProgramChoices.render)


TILE_MULTIPLES = (1, 2, 4, 8)   # a tile ± 1 at one tile, two, four and eight: where tiled loops and windows turn


def default_max_len(program: ProgramLike, defines: Mapping[str, Any] | None = None) -> int:
    """The longest length `attention_shapes` draws by default: eight tiles of the program's largest
    sequence tile and one more (at least 17), so a loop whose start or stop moves with the length (a
    window a few tiles behind the diagonal) runs every trip it has at some drawn length."""
    return _longest(program_info(as_graph(program, defines)))


def _longest(info: ProgramInfo) -> int:
    return max(TILE_MULTIPLES[-1] * info.max_tile + 1, 17)


def edge_lengths(tiles: Sequence[int], longest: int) -> list[int]:
    """The lengths where tiled code goes wrong, ascending, from 1 to `longest`: 1, a tile ± 1 at
    TILE_MULTIPLES of each tile, and `longest` itself."""
    edges = {1, longest}
    for tile in tiles:
        edges |= {k * tile + d for k in TILE_MULTIPLES for d in (-1, 0, 1)}
    return sorted(n for n in edges if 1 <= n <= longest)


def lengths(tiles: Sequence[int], longest: int) -> st.SearchStrategy[int]:
    """One length: half the time an edge (`edge_lengths`), half any length from 1 to `longest`.
    Shrinks toward 1 (the first edge) and toward short lengths."""
    return st.one_of(st.sampled_from(edge_lengths(tiles, longest)), st.integers(1, longest))


def attention_shapes(program: ProgramLike, *, max_batch: int = 2, max_kv_heads: int = 2, max_group: int = 2,
                     max_len: int | None = None, defines: Mapping[str, Any] | None = None) -> st.SearchStrategy[Shapes]:
    """Problem sizes for `program`: batch, heads, KV heads (a divisor of heads when K/V are
    offset by `head_idx / group`), every int `Input` (the sequence lengths),
    every float `Input` (the scale) in [0.05, 1.5]. Shrinks toward 1s.
    Each length is drawn by itself (`lengths`): 1, a tile ± 1 at one, two, four and eight tiles of the
    tiles that step over it, and any length up to `max_len` (default: `default_max_len`)."""
    info = program_info(as_graph(program, defines))
    longest = max_len if max_len is not None else _longest(info)
    if longest < 1:
        raise ValueError(f"max_len={longest}: a length is at least 1")
    kinds = {t.heads for t in info.tensors}
    per_input = {n: lengths(info.length_tiles.get(n, (info.max_tile,)), longest) for n in info.int_inputs}

    @st.composite
    def draw_shapes(draw) -> Shapes:
        batch = draw(st.integers(1, max_batch))
        if "kv" in kinds:
            kv_heads = draw(st.integers(1, max_kv_heads))
            heads = kv_heads * draw(st.integers(1, max_group))
        else:
            heads = draw(st.integers(1, max_kv_heads * max_group))
            kv_heads = 1 if "one" in kinds else heads
        ints = {n: draw(per_input[n], label=n) for n in info.int_inputs}
        floats = {n: draw(st.floats(0.05, 1.5, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 4)))
                  for n in info.float_inputs}
        return Shapes(batch, heads, kv_heads, ints, floats)

    return draw_shapes()


def with_shapes(program: str, **kw: Any) -> st.SearchStrategy[tuple[str, Shapes]]:
    """`tl_programs().flatmap(with_shapes)`: a program together with sizes for it."""
    return attention_shapes(program, **kw).map(lambda s: (program, s))


def inputs(shape: tuple[int, ...], dtype: torch.dtype = torch.float64) -> st.SearchStrategy[torch.Tensor]:
    """Random normal tensors of `shape` in `dtype`, every element at least 0.1 away from 0."""
    return st.integers(0, 2**31 - 1).map(lambda seed: random_tensor(tuple(shape), seed, dtype))


__all__ = ["ProgramChoices", "program_choices", "tl_programs", "attention_shapes", "with_shapes", "inputs",
           "default_max_len", "edge_lengths", "lengths", "TILE_MULTIPLES"]

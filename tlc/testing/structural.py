"""Structurally varied TL programs for differential testing: FlashAttention's loop bent every way the
language allows (tiles narrower than their tensors, coordinates, loop ranges, ops before, inside and
after the loop, GEMM chains, from-end tiles, GQA/MQA), each rendered as readable TL text.

    text, defines, description = structural_program(seed)          # a GPU run names programs by seed
    @given(structural_choices(sizes="small"))                       # hypothesis, shrinking to plain MHA
    def test_mine(choices): text = choices.render() ...

Most programs pass `tlc check`; some are refused by a target (at their line, or that is a bug).
`reference_graph` gives the graph whose interpretation is the program's meaning.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Sequence, TypeVar

from hypothesis import strategies as st

from tlc.ir.graph import Graph

T = TypeVar("T")

# Tile sizes: "target" ones the sm_90 / sm_90a lowerings may accept, "small" ones for fast CPU interpretation.
SIZES = {
    "target": {"d": ([64, 32, 128, 96, 40, 16, 256, 80], [8, 4, 4, 1, 1, 1, 1, 1]),
               "bm": ([64, 128, 192, 256, 32, 16], [10, 6, 1, 1, 1, 1]),
               "bn": ([32, 64, 16, 48, 128, 80], [8, 8, 1, 1, 3, 1]),
               "page": ([16, 64, 32, 128, 48], [4, 3, 2, 1, 1])},
    "small": {"d": ([4, 2, 6, 8, 3], [4, 2, 2, 2, 1]),
              "bm": ([4, 3, 1, 5, 8], [4, 3, 1, 2, 1]),
              "bn": ([4, 3, 1, 5, 8], [4, 3, 1, 2, 1]),
              "page": ([2, 3, 1, 4], [3, 2, 1, 1])},
}
SCORE_OPS = {"softcap": ["Compute Divide S, Softcap and get new S", "Compute Tanh S and get new S",
                         "Compute Multiply S, Softcap and get new S"],
             "add": ["Compute Add S, 0.25 and get new S"],
             "scale_again": ["Compute Multiply S, 1.5 and get new S"],
             "relu": ["Compute Relu S and get new S"],
             "square": ["Compute Square S and get new S"],
             "tanh": ["Compute Tanh S and get new S"],
             "clamp": ["Compute Max S, -1.0 and get new S"]}   # a masked or absent score stays absent
PROB_OPS = {"half": "Compute Multiply P, 0.5 and get new P",    # exact under online softmax (linear in P)
            "square": "Compute Square P and get new P",
            "add": "Compute Add P, 0.1 and get new P",
            "exp": "Compute Exp P and get new P"}
POST_OPS = {"add": "Compute Add O, 1.0 and get new O", "half": "Compute Multiply O, 0.5 and get new O",
            "square": "Compute Square O and get new O", "add_max": "Compute Add O, m and get new O"}
DIVISORS = {"l": [], "l_plus_1": ["Compute Add l, 1 and get l2"], "two_l": ["Compute Multiply l, 2 and get l2"],
            "l_squared": ["Compute Square l and get new l"]}
STARTS = {"0": "0", "1": "1", "window": "max(0, block_idx * BM / BN - 1)"}   # window: from a tile before the row's
STOPS = {"div": "seqlen_k / BN", "cdiv": "cdiv(seqlen_k, BN)", "half": "seqlen_k / BN / 2",
         "min2": "min(seqlen_k / BN, 2)", "minus1": "seqlen_k / BN - 1", "plus1": "seqlen_k / BN + 1",
         "diag": "min(seqlen_k / BN, (block_idx + 1) * BM / BN)"}   # diag: stops at the query tile's diagonal


@dataclass(frozen=True)
class StructuralChoices:
    """One program; the defaults are FlashAttention-2's forward (specs/mha_fwd.tl) at d = 64."""

    family: str = "attention"          # "attention", "b2b" (relu(A·Bᵀ)·C) or "chain3" (specs/chain3_fwd.tl)
    dtype: str = "bf16"
    d_qk: int = 64                     # columns of Q and K in global memory
    d_v: int = 64                      # columns of V and O
    qk_width: int = 64                 # Q/K tile width; narrower than d_qk: the GEMM reads part of the head dim
    q_col: int = 0                     # the Q tile's column coordinate (C =), in tiles of qk_width
    k_col: int = 0
    v_width: int = 64                  # V tile width; narrower than d_v: O gets (and stores) that many columns
    v_col: int = 0                     # the V tile's and O store's column coordinate, in tiles of v_width
    bm: int = 64
    bn: int = 32
    d3: int = 64                       # chain3: columns of D and O
    warps: int | None = None
    stages: int | None = None
    kv_offset: str = "head_idx / group"   # GQA; "head_idx" (MHA) or "0" (MQA)
    causal: str = ""                   # "", "top_left" or "bottom_right"
    mask_param: bool = True            # `causal Align … when Causal` (else the alignment written out)
    mask_first: bool = False           # the mask before the score ops (tanh of -inf is -1: unmasked again)
    q_from_end: bool = False           # `[L = block_idx from end]` on the Q load
    o_from_end: bool = False           # … and on the O store
    kv_coord: str = "n"                # "n", "n + 1", "n - 1", "n / 2" or "0"
    v_coord: str = ""                  # V's row tile when it is not K's: "n + 1" or "0"
    loop_start: str = "0"              # a key of STARTS
    loop_stop: str = "div"             # a key of STOPS
    indented: bool = False
    score_ops: tuple[str, ...] = ()    # keys of SCORE_OPS, after `Multiply S, scale`
    scale: bool = True
    softmax: str = "deferred"          # "deferred" (named + divide after the loop), "normalised", "named"
    prob_ops: tuple[str, ...] = ()     # keys of PROB_OPS, between the softmax and P·V
    divisor: str = "l"                 # a key of DIVISORS
    o_init: bool = False               # `Compute Add O, 0.5` before the loop
    post_ops: tuple[str, ...] = ()     # keys of POST_OPS, after the loop
    reshape: bool = True               # the Reshape to MMA_A before a GEMM's A operand
    register_copies: tuple[str, ...] = ("Q", "K", "V")   # `Copy X from shared to register` hints
    k_stored: str = "rows"             # "rows" (seqlen_k, d) or "cols": K stored transposed, read without .T
    v_stored: str = "rows"
    transpose_slip: str = ""           # "" or "drop": `GEMM Q, K` without .T (resolve-transpose repairs it)
    pv_form: str = "accumulate"        # "accumulate" or "add": `GEMM P, V and get PV` + `Add O, PV`
    defines: bool = False              # tile sizes bound with -D (the file's Params hold other values)
    kv_pages: int = 0                  # K and V read from pages of this many rows through a block table (0: none)
    window: tuple[int | None, int | None] = (None, None)   # a predicate mask keeping keys q - left … q + right

    def render(self) -> str:
        return _Writer(self).text()

    def defines_dict(self) -> dict[str, str] | None:
        return {"BM": str(self.bm), "BN": str(self.bn)} if self.defines else None

    @property
    def as_written_meaningful(self) -> bool:
        """False where the program as written means nothing and a repair gives it its meaning (a slipped
        `.T` does not type-check before `resolve-transpose`)."""
        return not self.transpose_slip

    def describe(self) -> str:
        """One line: how this program departs from FlashAttention-2's forward at d = 64."""
        base = StructuralChoices()
        parts = [f"{self.family} BM={self.bm} BN={self.bn} d={self.d_qk}/{self.d_v}"]
        for f in fields(self):
            if f.name in ("family", "bm", "bn", "d_qk", "d_v"):
                continue
            value = getattr(self, f.name)
            widths = {"qk_width": self.d_qk, "v_width": self.d_v}
            differs = value != widths[f.name] if f.name in widths else value != getattr(base, f.name)
            if differs:
                shown = "+".join(map(str, value)) or "-" if isinstance(value, tuple) else value
                parts.append(f"{f.name}={shown}")
        return " ".join(parts)


# ------------------------------------------------------------------ rendering


class _Writer:
    """Writes one program's lines, indented inside the loop; the tensors are named Q, K, V (attention) or
    A, B, C (GEMM chains), their widths by Params."""

    def __init__(self, c: StructuralChoices):
        self.c, self.lines, self.depth = c, [f"# generated (tlc.testing.structural): {c.describe()}"], 0
        self.q, self.k, self.v = ("Q", "K", "V") if c.family == "attention" else ("A", "B", "C")
        self.dq, self.dv = ("DQK", "DV") if c.d_qk != c.d_v else ("HeadDim", "HeadDim")
        self.qkw = "QKW" if c.qk_width != c.d_qk else self.dq
        self.out_cols = "D3" if c.family == "chain3" else self.dv
        self.vw = "VW" if c.v_width != c.d_v else self.dv
        self.out_tile = "D3" if c.family == "chain3" else self.vw

    def put(self, text: str = "") -> None:
        self.lines.append("  " * self.depth + text if text else "")

    def text(self) -> str:
        self.params()
        self.allocations()
        self.prologue()
        self.loop()
        self.epilogue()
        return "\n".join(self.lines) + "\n"

    def params(self) -> None:
        c, put = self.c, self.put
        put(f"Param dtype = {c.dtype}")
        put(f"Param {self.dq} = {c.d_qk}")
        if self.dv != self.dq:
            put(f"Param {self.dv} = {c.d_v}")
        if self.qkw == "QKW":
            put(f"Param QKW = {c.qk_width}   # Q and K tiles narrower than the tensors: part of the head dim")
        if self.vw == "VW":
            put(f"Param VW = {c.v_width}   # V and O tiles narrower than the tensors: part of the output")
        if c.family == "chain3":
            put(f"Param D3 = {c.d3}")
        put(f"Param BM = {128 if c.defines else c.bm}")   # with -D, the file holds other tile sizes
        put(f"Param BN = {64 if c.defines else c.bn}")
        for name, value in (("Warps", c.warps), ("Stages", c.stages)):
            if value is not None:
                put(f"Param {name} = {value}")
        if c.causal and c.mask_param:
            put("Param Causal = true")
            put(f"Param Align = {c.causal}")
        if "softcap" in c.score_ops:
            put("Param Softcap = 5.0")
        if c.kv_pages:
            put(f"Param PageSize = {c.kv_pages}")
        put()
        put("Input seqlen_q, seqlen_k : int")
        if c.family == "attention" and c.scale:
            put("Input scale : float")
        if c.kv_pages:
            put("Input block_table : int32[batch, cdiv(seqlen_k, PageSize)]")
        put()

    def allocations(self) -> None:
        c, put, q, k, v, dq, dv = self.c, self.put, self.q, self.k, self.v, self.dq, self.dv
        put(f"Allocate {q} in global (seqlen_q, {dq}) with offset head_idx")
        pages = " and rows at block_table[batch_idx, row / PageSize] * PageSize + row % PageSize" if c.kv_pages else ""
        put(f"Allocate {k} in global {_rows_or_cols(c.k_stored, dq, 'seqlen_k')} with offset {c.kv_offset}{pages}")
        put(f"Allocate {v} in global {_rows_or_cols(c.v_stored, dv, 'seqlen_k')} with offset {c.kv_offset}{pages}")
        if c.family == "chain3":
            put(f"Allocate D in global ({dv}, D3) with offset {c.kv_offset}")
        put(f"Allocate O in global (seqlen_q, {self.out_cols}) with offset head_idx")
        put()
        put(f"Allocate {q} in shared (BM, {self.qkw})")
        put(f"Allocate {k} in shared {_rows_or_cols(c.k_stored, self.qkw, 'BN')}")
        put(f"Allocate {v} in shared {_rows_or_cols(c.v_stored, self.vw, 'BN')}")
        if c.family == "chain3":
            put(f"Allocate D in shared ({dv}, D3)")
        put(f"Allocate O in register (BM, {self.out_tile})")
        put()

    def prologue(self) -> None:
        c, put = self.c, self.put
        rows = "block_idx from end" if c.q_from_end else "block_idx"
        put(f"Copy {self.q} (BM, {self.qkw}) in coordinate [L = {rows}{_col(c.q_col)}] from global to shared")
        if c.family == "chain3":
            put(f"Copy D ({self.dv}, D3) in coordinate [L = 0] from global to shared")
        if "Q" in c.register_copies:
            put(f"Copy {self.q} from shared to register")
        if c.o_init:
            put("Compute Add O, 0.5 and get new O")

    def loop(self) -> None:
        c, put, k, v = self.c, self.put, self.k, self.v
        stop = STOPS[c.loop_stop]
        start = STARTS[c.loop_start]
        put(f"for n in {start}:{stop}:" if c.indented else f"for n = {start}:{stop}")
        self.depth += 1
        ktile = _rows_or_cols(c.k_stored, self.qkw, "BN")
        if c.k_stored == "cols":
            put(f"Copy {k} {ktile} in coordinate [L = {c.k_col}, C = {c.kv_coord}] from global to shared")
        else:
            put(f"Copy {k} {ktile} in coordinate [L = {c.kv_coord}{_col(c.k_col)}] from global to shared")
        vrow = c.v_coord or c.kv_coord
        vcoord = f"L = {c.v_col}, C = {vrow}" if c.v_stored == "cols" else f"L = {vrow}{_col(c.v_col)}"
        put(f"Copy {v} {_rows_or_cols(c.v_stored, self.vw, 'BN')} in coordinate [{vcoord}] from global to shared")
        if "K" in c.register_copies:
            put(f"Copy {k} from shared to register")
        kt = k if (c.k_stored == "cols") != bool(c.transpose_slip) else f"{k}.T"
        put(f"Compute GEMM {self.q}, {kt} and get S")
        p = "P" if c.family == "attention" else "S"
        for line in _scores(c) if c.family == "attention" else _activation(c):
            put(line)
        if c.reshape:
            put(f"Reshape {p} from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N) as dtype")
        if "V" in c.register_copies:
            put(f"Copy {v} from shared to register")
        vt = f"{v}.T" if c.v_stored == "cols" else v
        if c.family == "chain3":
            put(f"Compute GEMM S, {vt} and get T")
            put("Compute Relu T and get new T")
            if c.reshape:
                put("Reshape T from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N) as dtype")
            put("Compute GEMM T, D and accumulate O")
        elif c.pv_form == "add":
            put(f"Compute GEMM {p}, {vt} and get PV")
            put("Compute Add O, PV and get new O")
        else:
            put(f"Compute GEMM {p}, {vt} and accumulate O")
        self.depth -= 1
        if not c.indented:
            put("end")

    def epilogue(self) -> None:
        c, put = self.c, self.put
        if c.family == "attention" and c.softmax == "deferred":
            for line in DIVISORS[c.divisor]:
                put(line)
            put(f"Compute Divide O, {'l2' if c.divisor in ('l_plus_1', 'two_l') else 'l'} and get new O")
        for op in c.post_ops:
            put(POST_OPS[op])
        rows = "block_idx from end" if c.o_from_end else "block_idx"
        put(f"Copy O (BM, {self.out_tile}) in coordinate [L = {rows}{_col(c.v_col)}] from register to global")


def _rows_or_cols(stored: str, width: str, length: str) -> str:
    """A tensor or tile stored as (length, width), or transposed: (width, length)."""
    return f"({width}, {length})" if stored == "cols" else f"({length}, {width})"


def _col(col: int) -> str:
    return f", C = {col}" if col else ""


def _scores(c: StructuralChoices) -> list[str]:
    out = ["Compute Multiply S, scale and get new S"] if c.scale else []
    ops = [line for op in c.score_ops for line in SCORE_OPS[op]]
    mask = []
    if c.causal:
        mask = ["Compute Mask S causal Align and get new S when Causal" if c.mask_param
                else f"Compute Mask S causal {c.causal} and get new S"]
    left, right = c.window
    terms = ([f"kv_idx < q_idx - {left}"] if left is not None else []) + (
        [f"kv_idx > q_idx + {right}"] if right is not None else [])
    if terms:   # a window as a predicate (tlc/expr/key_window.py bounds it), beside any causal mask
        mask.append(f"Compute Mask S where {' || '.join(terms)} and get new S")
    out += mask + ops if c.mask_first else ops + mask
    stats = " with max m, sum l" if c.softmax in ("deferred", "named") else ""
    out.append(f"Compute Softmax S{stats} and get P")
    return out + [PROB_OPS[op] for op in c.prob_ops]


def _activation(c: StructuralChoices) -> list[str]:
    return [line for op in c.score_ops for line in SCORE_OPS[op]] or ["Compute Relu S and get new S"]


# ------------------------------------------------------------------ drawing


class _Picker:
    """Draws choices from `random.Random` or from hypothesis; the first option is the plain one
    (hypothesis shrinks toward it)."""

    def __init__(self, one: Callable[[Sequence[Any], Sequence[int]], Any]):
        self._one = one

    def one(self, options: Sequence[T], weights: Sequence[int] | None = None) -> T:
        return self._one(list(options), list(weights or [1] * len(options)))

    def chance(self, percent: int) -> bool:
        return self.one([False, True], [100 - percent, percent])

    def some(self, options: Sequence[str], percent: int, most: int = 2) -> tuple[str, ...]:
        """Up to `most` distinct options, each step taken with `percent` % chance."""
        out: list[str] = []
        while len(out) < most and self.chance(percent):
            pick = self.one([o for o in options if o not in out])
            out.append(pick)
        return tuple(out)


def _from_random(rng: random.Random) -> _Picker:
    return _Picker(lambda options, weights: rng.choices(options, weights)[0])


def _from_hypothesis(draw) -> _Picker:
    def one(options, weights):
        total = draw(st.integers(0, sum(weights) - 1))
        for option, w in zip(options, weights):
            if total < w:
                return option
            total -= w
        raise AssertionError("unreachable")
    return _Picker(one)


def draw_choices(pick: _Picker, sizes: str = "target", paged: bool = False,
                 windowed: bool = False) -> StructuralChoices:
    """One program's choices: each departure from FlashAttention's shape taken with a stated chance; `paged`:
    an attention program's K and V read from pages through a block table (a row map, drawn after every other
    choice, so a seed's other choices are those it has without); `windowed`: its scores also masked outside a
    window of keys around the row (a predicate mask, drawn last too)."""
    table = SIZES[sizes]
    family = pick.one(["attention", "b2b", "chain3"], [8, 1, 1])
    d_qk = pick.one(*table["d"])
    d_v = d_qk if pick.chance(75) else pick.one(*table["d"])
    qk_width, q_col, k_col = d_qk, 0, 0
    if d_qk % 2 == 0 and pick.chance(15):
        qk_width = d_qk // pick.one([2, 4] if d_qk % 4 == 0 else [2])
        q_col = pick.one([0, 1])
        k_col = q_col if pick.chance(80) else pick.one([0, 1])
    v_width, v_col = d_v, 0
    if family != "chain3" and d_v % 2 == 0 and pick.chance(8):
        v_width, v_col = d_v // 2, pick.one([0, 1])
    bm = pick.one(*table["bm"])
    target = sizes == "target"
    if target and max(d_qk, d_v) >= 192 and bm > 64 and pick.chance(70):
        bm = 64   # the accumulator of a wide head dim fits the registers of 64 rows
    causal = "" if family != "attention" or pick.chance(50) else pick.one(["top_left", "bottom_right"])
    start = pick.one(list(STARTS), [17, 2, 1])
    late = start == "1"
    kv_coord = pick.one(["n", "n + 1", "0", "n / 2"] + (["n - 1"] if late else []), [12, 1, 1, 1] + [3] * late)
    softmax = pick.one(["deferred", "normalised", "named"], [6, 3, 1])
    q_from_end = pick.chance(20)   # O is stored from the top in a quarter of these
    choices = StructuralChoices(
        family=family, dtype=pick.one(["bf16", "fp16"], [4, 1]),
        d_qk=d_qk, d_v=d_v, qk_width=qk_width, q_col=q_col, k_col=k_col, v_width=v_width, v_col=v_col,
        bm=bm, bn=pick.one(*table["bn"]), d3=pick.one(*table["d"]),
        warps=pick.one([None, max(4, bm // 64 * 4), 4, 8], [6, 3, 1, 1]) if target else None,
        stages=pick.one([None, 2, 3, 4, 1], [6, 3, 1, 1, 1]) if target else None,
        kv_offset=pick.one(["head_idx / group", "head_idx", "0"], [5, 3, 2]),
        causal=causal, mask_param=not pick.chance(30), mask_first=bool(causal) and pick.chance(10),
        q_from_end=q_from_end, o_from_end=q_from_end and pick.chance(75),
        kv_coord=kv_coord, v_coord=pick.one(["n + 1", "0"]) if pick.chance(4) else "", loop_start=start,
        loop_stop=pick.one(list(STOPS), [10, 3, 1, 1, 1, 1, 2]), indented=pick.chance(15),
        score_ops=pick.some(list(SCORE_OPS) if family == "attention" else ["relu", "tanh", "add", "clamp"], 25),
        scale=not pick.chance(5),
        softmax=softmax,
        prob_ops=pick.some(list(PROB_OPS), 20, most=1) if family == "attention" else (),
        divisor=pick.one(list(DIVISORS), [8, 1, 1, 1]) if softmax == "deferred" else "l",
        o_init=pick.chance(8),
        post_ops=pick.some(_post_ops(family, softmax), 15),
        reshape=not pick.chance(15),
        register_copies=tuple(x for x in ("Q", "K", "V") if not pick.chance(40)),
        k_stored="cols" if pick.chance(3) else "rows", v_stored="cols" if pick.chance(3) else "rows",
        transpose_slip="drop" if pick.chance(3) else "",
        pv_form="add" if family == "attention" and pick.chance(4) else "accumulate",
        defines=pick.chance(10),
    )
    if family != "attention":   # no softmax, scale or mask: keep their fields at the defaults
        choices = replace(choices, softmax="deferred", divisor="l", scale=True, mask_param=True)
    if family != "chain3":
        choices = replace(choices, d3=StructuralChoices.d3)
    if paged and family == "attention":   # pages of rows: K and V stored as rows, no tile taken from their end
        choices = replace(choices, kv_pages=pick.one(*table["page"]), k_stored="rows", v_stored="rows")
    if windowed and family == "attention":   # one edge or both; 0 keeps the diagonal alone
        left = pick.one([None, 0, 1, 37, 300], [2, 1, 1, 2, 2])
        right = pick.one([None, 0, 5, 64], [3, 1, 1, 1]) if left is not None else pick.one([0, 5, 64])
        choices = replace(choices, window=(left, right))
    return choices


def _post_ops(family: str, softmax: str) -> list[str]:
    """Ops on O after the loop: `Add O, m` needs the named max; a GEMM chain's O is an unnormalised sum
    of hundreds, whose square would pass fp16's range (65504) in the kernel but not in the interpreter."""
    if family != "attention":
        return ["add", "half"]
    return [o for o in POST_OPS if o != "add_max" or softmax != "normalised"]


def structural_choices(sizes: str = "target") -> st.SearchStrategy[StructuralChoices]:
    """Hypothesis strategy of programs' choices; `sizes="small"` uses tiles of 1-8 for fast CPU runs."""
    return st.composite(lambda draw: draw_choices(_from_hypothesis(draw), sizes))()


def structural_programs(sizes: str = "target") -> st.SearchStrategy[tuple[str, dict[str, str] | None]]:
    """Hypothesis strategy of (TL text, -D bindings or None)."""
    return structural_choices(sizes).map(lambda c: (c.render(), c.defines_dict()))


def choices_of_seed(seed: int, sizes: str = "target", paged: bool = False, windowed: bool = False) -> StructuralChoices:
    return draw_choices(_from_random(random.Random(seed)), sizes, paged, windowed)


def structural_program(seed: int, sizes: str = "target") -> tuple[str, dict[str, str] | None, str]:
    """(TL text, -D bindings or None, a one-line description) of program number `seed`; the same
    seed gives the same program on every machine (random.Random)."""
    c = choices_of_seed(seed, sizes)
    return c.render(), c.defines_dict(), c.describe()


def reference_graph(text: str | bytes, defines: dict[str, str] | None = None, filename: str = "<generated>",
                    *, meaningful_as_written: bool = True) -> Graph:
    """The graph whose interpretation is the program's meaning: the program as written (frontend only, as
    `tlc interp --no-passes`), or, where it is not meaningful as written (a slipped `.T`), after
    `resolve-transpose`, the repair that gives it one."""
    from tlc.api import lower_source
    from tlc.passes.pipeline import run_pipeline

    graph = lower_source(text, filename, defines=defines)
    if not meaningful_as_written:
        run_pipeline(graph, ["verify", "infer-shapes", "resolve-transpose"])
    return graph


def odd_lengths(c: StructuralChoices, several: int = 3) -> list[tuple[int, int]]:
    """(seqlen_q, seqlen_k) at the edges that matter: 1, 17, a tile ± 1, `several` tiles and one more."""
    return [(1, 1), (17, 17), (c.bm + 1, max(1, c.bn - 1)), (max(1, c.bm - 1), c.bn + 1),
            (several * c.bm + 1, (several + 1) * c.bn + 1)]


def head_counts(c: StructuralChoices, group: int = 2) -> tuple[int, int]:
    """(query heads, KV heads) that exercise the K/V offset: a group of `group` for GQA, one KV head for MQA."""
    if c.kv_offset == "0":
        return group, 1
    return (group, 1) if "group" in c.kv_offset else (2, 2)


def output_difference(got, want) -> tuple[str, float]:
    """(how the written elements differ, '' when `got` is NaN exactly where `want` is — the elements the
    program leaves unwritten —; max |got - want| / max(1, max |want|) over the elements both wrote)."""
    import torch

    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}", math.inf
    got_nan, want_nan = torch.isnan(got), torch.isnan(want)
    both = ~got_nan & ~want_nan
    err = 0.0
    if bool(both.any()):
        g, w = got[both].double(), want[both].double()
        diff = torch.where(g == w, torch.zeros_like(g), (g - w).abs())   # equal infinities are equal
        finite = w[torch.isfinite(w)]
        err = float(diff.max()) / max(1.0, float(finite.abs().max()) if finite.numel() else 1.0)
        err = math.inf if err != err else err
    if torch.equal(got_nan, want_nan):
        return "", err
    unwritten = torch.nonzero(got_nan & ~want_nan)
    overwritten = torch.nonzero(want_nan & ~got_nan)
    rows = sorted({int(r) for r in (unwritten if len(unwritten) else overwritten)[:, 2]})
    return (f"written elements differ: {len(unwritten)} left unwritten that the program writes, {len(overwritten)} "
            f"written that it leaves unwritten (rows {', '.join(map(str, rows[:8]))}{' …' if len(rows) > 8 else ''})",
            err)


__all__ = ["StructuralChoices", "structural_choices", "structural_programs", "structural_program", "choices_of_seed",
           "draw_choices", "reference_graph", "odd_lengths", "head_counts", "output_difference"]

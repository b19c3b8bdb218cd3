"""What `tlc test`, `tlc interp` and `tlc.testing.check_program` compare a program with: the float64
reference of its `Param Variant` (tlc.reference), a reference function the user names, or — for a
program without a known Variant — the program as written, interpreted in float64 before any pass.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from tlc.diagnostics import TlcError, error, fail
from tlc.ir.graph import Graph
from tlc.ir.interpreter import run_program
from tlc.numbers import a_kind, shown
from tlc.reference import known_variant, reference_for

Reference = Callable[..., Any]


class ReferenceProblem(TlcError):
    """The user's reference could not give an output to compare with (it raised, or returned something
    of the wrong kind or shape): a fault of the reference, reported in one line, not a program failure."""

    def __init__(self, message: str):
        super().__init__(error(message))

    @property
    def message(self) -> str:
        return self.diagnostics[0].message


@dataclass(frozen=True)
class Output:
    """One tensor the program stores, as a reference must return it: (batch, heads, rows, cols)."""

    name: str
    shape: tuple[int, ...]
    transposed: bool   # stored (cols, rows): the program's result is transposed back before comparing


@dataclass(frozen=True)
class Oracle:
    """One source of expected outputs, and the words reports use for it (`label`)."""

    label: str
    variant: str | None = None          # a known Variant: tlc.reference's float64 reference
    params: Mapping[str, Any] = field(default_factory=dict)   # the Params that reference reads (Causal, …)
    as_written: Graph | None = None     # the program as written, interpreted in float64
    function: Reference | None = None   # the user's reference
    spec: str = ""                      # how the user named it: `--reference mod:fn` / `reference=mod.fn`
    replay: str = ""                    # `mod:fn` for a replay command line, '' when it has no importable name

    @property
    def compares_written_elements(self) -> bool:
        """The program as written leaves some elements unwritten (NaN) too: those must match, not fail."""
        return self.as_written is not None

    def expected(self, outputs: Sequence[Output], interp_in: Mapping[str, torch.Tensor],
                 ref_in: Mapping[str, torch.Tensor], scalars: Mapping[str, Any], *,
                 check_layouts: bool = False) -> dict[str, torch.Tensor]:
        """The expected outputs by name, each (batch, heads, rows, cols) in float64."""
        if self.function is not None:
            return call_reference(self, outputs, ref_in, scalars)
        if self.as_written is not None:
            got = run_program(self.as_written, interp_in, scalars, check_layouts=check_layouts)
            return {o.name: got[o.name].transpose(-1, -2) if o.transposed else got[o.name] for o in outputs}
        name, ref = reference_for(self.params, ref_in, scalars)
        return {name: ref}


def variant_oracle(params: Mapping[str, Any]) -> Oracle:
    """The float64 reference of the program's `Param Variant` (which must be a known one)."""
    variant = known_variant(params)
    if variant is None:
        raise ValueError(f"no built-in reference for Variant = {params.get('Variant')}")
    return Oracle(f"the {variant} reference (Variant = {variant})", variant=variant, params=dict(params))


def oracle_for(lower: Callable[[], Graph], reference: Reference | str | None = None) -> Oracle:
    """The oracle for the program `lower()` lowers (no pass run): `reference` when given (a callable, or
    `module:function` as the CLI's `--reference` takes it), else its Variant's reference, else the program
    as written (`meaning_as_written`) — never attention for a program that does not say it is attention."""
    if isinstance(reference, str):
        function, spec = load_reference(reference), f"--reference {reference}"
        return Oracle(f"your reference {reference}", function=function, spec=spec, replay=reference)
    if reference is not None:
        if not callable(reference):
            raise fail(f"reference=: {a_kind(reference)} is not callable; pass a function returning the output")
        name = _dotted(reference)
        importable = name if ":" in name and "<" not in name and not name.startswith("__main__:") else ""
        shown_name = name.replace(":", ".")
        return Oracle(f"your reference {shown_name}", function=reference, spec=f"reference={shown_name}",
                      replay=importable)
    graph = lower()
    if known_variant(graph.params) is not None:
        return variant_oracle(graph.params)
    variant = graph.params.get("Variant")
    why = "no Variant" if variant is None else f"Variant = {variant} has no built-in reference"
    meaning, resolved = meaning_as_written(graph, lower)
    return Oracle(f"the program as written ({why}{'; its .T as resolve-transpose reads it' if resolved else ''})",
                  as_written=meaning)


def meaning_as_written(graph: Graph, lower: Callable[[], Graph]) -> tuple[Graph, bool]:
    """(the graph whose float64 interpretation is the program's meaning, whether `.T` was resolved): the
    program as written, or — where a GEMM's `.T` is missing or superfluous so only one reading type-checks
    (specs/LANGUAGE.md) — that reading, as resolve-transpose gives it; a program that does not get through
    resolve-transpose is left as written, for the check to report."""
    from tlc.ir.ops import GemmOp
    from tlc.passes.pipeline import run_pipeline

    def transposes(g: Graph) -> list[tuple[bool, bool]]:
        return [(op.trans_a, op.trans_b) for _, op in g.walk() if isinstance(op, GemmOp)]

    resolved = lower()
    try:
        run_pipeline(resolved, ["verify", "infer-shapes", "resolve-transpose"])
    except Exception:  # noqa: BLE001 - the checks run the same passes and report what they raise
        return graph, False
    return (resolved, True) if transposes(resolved) != transposes(graph) else (graph, False)


def _dotted(fn: Reference) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module}:{qualname}"


def load_reference(spec: str) -> Reference:
    """`module:function` → the function, the module imported by name from the current directory or
    sys.path (code the user named on the command line; nothing named inside a .tl file is imported).
    Every way it can go wrong is a one-line error naming `--reference` and what to write instead."""
    what = f"--reference '{shown(spec, 200)}'"
    module_name, colon, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    missing = ("" if colon and module_name and attr else "no ':'" if not colon else
               "no module before ':'" if not module_name else "no function after ':'")
    if missing:
        raise fail(f"{what}: {missing}; write MODULE:FUNCTION, e.g. --reference myrefs:window_attention "
                   "(myrefs.py in the current directory or on sys.path)")
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise fail(f"{what}: no module named '{shown(exc.name, 200)}' in the current directory or on sys.path; "
                       f"run from the folder that holds {exc.name.split('.')[0]}.py or add it to PYTHONPATH") from None
        raise fail(f"{what}: importing {shown(module_name, 200)} raised {_one_line(exc)}") from None
    except Exception as exc:  # the user's module failed while importing: their error, in one line
        raise fail(f"{what}: importing {shown(module_name, 200)} raised {_one_line(exc)}") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    function: Any = module
    for part in attr.split("."):
        if not hasattr(function, part):
            found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                           and v.__module__ == module.__name__)
            listed = f"; it defines {', '.join(found[:8])}" if found else ""
            raise fail(f"{what}: module {shown(module_name, 200)} has no '{shown(attr, 200)}'{listed}")
        function = getattr(function, part)
    if not callable(function):
        raise fail(f"{what}: {shown(module_name, 200)}.{shown(attr, 200)} is {a_kind(function)}, not a function")
    return function


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {shown(text, 200)}" if text else type(exc).__name__


def call_reference(oracle: Oracle, outputs: Sequence[Output], ref_in: Mapping[str, torch.Tensor],
                   scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Call the user's reference as `fn(*input_tensors, **inputs)`: the program's input tensors in the order
    of its `Allocate … in global` lines, float64 (batch, heads, rows, cols); its runtime `Input`s by keyword,
    those the signature names (all of them for a `**kwargs`). It returns the output tensor, or a tuple or
    dict with one per stored tensor."""
    assert oracle.function is not None
    out_names = {o.name for o in outputs}
    tensors = [t.clone() for name, t in ref_in.items() if name not in out_names]
    try:
        result = oracle.function(*tensors, **_accepted(oracle.function, scalars))
    except Exception as exc:  # the user's code: their error, in one line, never a traceback
        raise ReferenceProblem(f"{oracle.spec} raised {_one_line(exc)}") from None
    return _as_outputs(oracle.spec, result, outputs)


def _accepted(fn: Reference, scalars: Mapping[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: give it every Input
        return dict(scalars)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(scalars)
    named = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                   inspect.Parameter.KEYWORD_ONLY)}
    return {k: v for k, v in scalars.items() if k in named}


def _as_outputs(spec: str, result: Any, outputs: Sequence[Output]) -> dict[str, torch.Tensor]:
    names = ", ".join(o.name for o in outputs)
    if isinstance(result, torch.Tensor):
        items = [result]
    elif isinstance(result, (tuple, list)):
        items = list(result)
    elif isinstance(result, Mapping):
        missing = [o.name for o in outputs if o.name not in result]
        if missing:
            raise ReferenceProblem(f"{spec} returned a dict without '{missing[0]}'; return one tensor per output ({names})")
        items = [result[o.name] for o in outputs]
    else:
        raise ReferenceProblem(f"{spec} returned {a_kind(result)}; return a tensor (or a tuple or dict of tensors, one per "
                   f"output: {names})")
    if len(items) != len(outputs):
        raise ReferenceProblem(f"{spec} returned {len(items)} tensor(s); the program stores {len(outputs)} ({names})")
    expected = {}
    for o, item in zip(outputs, items):
        if not isinstance(item, torch.Tensor):
            raise ReferenceProblem(f"{spec} returned {a_kind(item)} for '{o.name}'; return a torch tensor")
        if tuple(item.shape) != o.shape:
            raise ReferenceProblem(f"{spec} returned shape {tuple(item.shape)} for '{o.name}'; expected (batch, heads, rows, "
                       f"cols) = {o.shape}")
        expected[o.name] = item.detach().to(device="cpu", dtype=torch.float64)
    return expected


__all__ = ["Oracle", "Output", "Reference", "ReferenceProblem", "call_reference", "load_reference",
           "meaning_as_written", "oracle_for", "variant_oracle"]

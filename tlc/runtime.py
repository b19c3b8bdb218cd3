"""`tlc.build`: a TL program → a kernel callable on torch tensors, through the build index and the cubin
cache (`compile_spec`, which `tlc precompile` shares), plus what any build asks of the process: the visible
GPU's target (`device_arch`) and -D bindings in one spelling (`normal_defines`). The attention runtime
(tlc.attention) builds its kernels through here.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from tlc.diagnostics import fail
# The environment switches that change what the lowering emits are part of every build key.
from tlc.lowering.switches import LOWERING_SWITCHES  # noqa: F401 - re-exported
from tlc.lowering.switches import switches_key as _switches
from tlc.names import kernel_name
from tlc.numbers import INT32_MAX, a_kind, check_int, shown

_DISPATCH: dict[tuple, Any] = {}   # build's inputs → kernel: a second build of a program is a dict lookup


def _read(path_or_text: str | Path | bytes) -> tuple[bytes, str]:
    """(source, name) of a TL program given as a file or as text: tlc.builder.read_program says which."""
    from tlc.builder import read_program

    return read_program(path_or_text)


def device_arch(device=None) -> str:
    """The sm_80-family target for `device` (default: the current GPU; Hopper runs it compiled for sm_90)."""
    import torch

    if not torch.cuda.is_available():
        raise fail("no CUDA GPU is visible: tlc kernels need one to run (tlc build works without)")
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm_{major}{minor}"
    if arch in ("sm_80", "sm_86", "sm_89", "sm_90"):
        return arch
    raise fail(f"this GPU is {arch}; tlc's kernels target sm_80, sm_86, sm_89 and sm_90")


def normal_defines(defines: Mapping[str, Any] | None, what: str = "defines") -> dict[str, str]:
    """-D bindings as the lowering reads them (bools as true/false): one spelling, one cache entry.
    A mapping of Param names (str) to str, int, float or bool values; anything else is a one-line
    TlcError naming `what`."""
    if defines is None:
        return {}
    if not isinstance(defines, Mapping):
        raise fail(f"{what} must be a mapping of Param names to values, e.g. {{'HeadDim': 128}}, not "
                   f"{a_kind(defines)}")
    out = {}
    for k, v in defines.items():
        if not isinstance(k, str) or not k:
            raise fail(f"{what}: a key is {a_kind(k) if not isinstance(k, str) else 'empty'}; keys are "
                       "Param names such as 'HeadDim'")
        if isinstance(v, int) and not isinstance(v, bool):
            check_int(v, f"{what}['{shown(k)}']", minimum=-INT32_MAX)  # before str(): an int of 5000 digits
        elif not isinstance(v, (str, float, bool)):
            raise fail(f"{what}['{shown(k)}'] is {a_kind(v)}; a value is a str, int, float or bool")
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def build_inputs_key(data: bytes, name: str, defs: Mapping[str, str], arch: str, lse: bool,
                     kernel: str | None = None) -> str:
    """Key of the build index: everything that decides the emitted source and how NVRTC compiles it,
    each input under its name (the defines as a mapping), so no two builds share a key; `kernel` (which
    kernel of a program of several) only where given, so a one-kernel program keeps its key."""
    from tlc.backend_cute import cache
    from tlc.backend_cute.headers import include_dirs, versions

    found = versions()
    nvrtc = found["nvidia-cuda-nvrtc"]
    if nvrtc == "absent":  # NVRTC from a toolkit: ask the library itself
        from tlc.backend_cute.nvrtc import nvrtc_version

        nvrtc = nvrtc_version()
    dirs = include_dirs()
    inputs = {"tl": data, "name": name, "defines": dict(defs), "arch": arch, "lse": bool(lse),
              "nvrtc": nvrtc, "versions": found, "switches": _switches(),
              "include_dirs": [str(dirs.cutlass), str(dirs.cuda), str(dirs.cccl)]}
    if kernel:
        inputs["kernel"] = kernel
    return cache.build_key(inputs)


def compile_spec(path_or_text: str | Path, *, arch: str, defines: Mapping[str, Any] | None = None,
                 lse: bool = False, kernel: str | None = None):
    """TL program → (CompiledKernel, LaunchABI), through the caches: the build index first (a warm
    start skips parsing and lowering), else the TL and lowering passes and `compile_kir` (NVRTC only
    on a miss of the cubin cache). `build` and `tlc precompile` both come through here."""
    import time

    from tlc.backend_cute import cache
    from tlc.backend_cute.compile import CompiledKernel, compile_kir, progress_label
    from tlc.builder import lower_to_kernel_ir, module_kernel_name

    start = time.perf_counter()
    data, name = _read(path_or_text)
    defs = normal_defines(defines)
    index_key = build_inputs_key(data, name, defs, arch, lse, kernel)
    record = cache.lookup_build(index_key)
    hit = cache.lookup(record["cubin_key"]) if record is not None else None
    if record is not None and hit is not None:
        cubin, meta = hit
        program = record["program"]
        return CompiledKernel(program, arch, record["source"], cubin, meta, meta.get("compile_seconds", 0.0), True,
                              [k.name for k in program.kernels()], {"index": time.perf_counter() - start}), record["abi"]
    stem = Path(name).stem if name != "<text>" else "tl_kernel"
    lowered = time.perf_counter()
    state, _ = lower_to_kernel_ir(data, name, arch, defs, name=module_kernel_name(name, kernel), lse=lse,
                                  kernel=kernel)
    lowered = time.perf_counter() - lowered
    label = " ".join([Path(name).stem + (f".{kernel}" if kernel else ""), *(f"{k}={v}" for k, v in sorted(defs.items()))])
    with progress_label(label):
        compiled = compile_kir(state.kir, arch, source_name=Path(name).name, cu_name=f"{stem}.cu")
    compiled.timings["lower"] = lowered
    if "cache_key" in compiled.metadata:
        cache.store_build(index_key, {"cubin_key": compiled.metadata["cache_key"], "program": state.kir,
                                      "abi": state.abi, "source": compiled.source})
    return compiled, state.abi


def build(path_or_text: str | Path, *, arch: str | None = None, defines: Mapping[str, Any] | None = None,
          lse: bool = False):
    """Compile a TL program and return its kernel, callable as `kernel(q, k, v, scale=None)`.

    `path_or_text`: a `.tl` file (a `pathlib.Path`, or a str naming an existing file) or TL text
    (tlc.builder.read_program says how a str is told apart); `arch`: a target of `tlc.arch` (default: the visible GPU's sm_80-family
    one); `defines`: Param names to str, int, float or bool values (-D's bindings); `lse`: a bool. A bad
    argument is a one-line TlcError naming it."""
    from tlc.backend_cute.launch import Kernel
    from tlc.builder import check_target

    if not isinstance(path_or_text, (str, bytes, bytearray, os.PathLike)):
        raise fail(f"tlc.build: path_or_text must be a .tl file (str or pathlib.Path) or TL text, not "
                   f"{a_kind(path_or_text)}")
    if arch is not None:
        check_target(arch, "tlc.build: arch")
    if not isinstance(lse, bool):
        raise fail(f"tlc.build: lse must be True or False, not {a_kind(lse)}")
    defs = normal_defines(defines, "tlc.build: defines")
    data, name = _read(path_or_text)
    arch = arch or device_arch()
    key = (data, name, tuple(sorted(defs.items())), arch, lse, _switches())
    if key in _DISPATCH:
        return _DISPATCH[key]
    from tlc.api import kernel_names
    names = kernel_names(data, name)
    if names:   # a program of several kernels: each built as its own, run in order by one callable
        from tlc.backend_cute.launch_module import ModuleKernel

        kernels = [(k, Kernel(*compile_spec(path_or_text, arch=arch, defines=defs, lse=lse, kernel=k))) for k in names]
        kernel = ModuleKernel.of_launch(kernels)   # as each kernel's program states the launch (its LaunchOp)
        _DISPATCH[key] = kernel
        return kernel
    compiled, abi = compile_spec(path_or_text, arch=arch, defines=defs, lse=lse)
    kernel = Kernel(compiled, abi)
    _DISPATCH[key] = kernel
    return kernel

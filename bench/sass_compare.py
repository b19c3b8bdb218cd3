"""Two builds of one spec, the second under a switch: an environment variable (TLC_…, e.g.
TLC_FOLD_PARTITIONS=0) or else a -D binding (e.g. Persistent=true). Their SASS opcode counts side by
side, biggest differences first, and both listings under $OUT.

    python3 bench/sass_compare.py specs/gqa_fwd.tl --switch TLC_FOLD_PARTITIONS=0 [-D NAME=VALUE ...] [--arch sm_90]
    python3 bench/sass_compare.py specs/gqa_fwd.tl --switch Persistent=true --arch sm_90a

Where a lowering change costs time, the opcode counts say which instructions it added (address
arithmetic, spills, barriers) before anyone reads the listings. `--loops` adds each build's loops that
hold an MMA or a TMA load (bench/sass.py `loops`) with their sizes, and the opcodes that differ most
between the two builds' largest MMA loops that hold no other (the steady KV loops).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--switch", required=True, help="NAME=VALUE set for the second build")
    ap.add_argument("-D", dest="defines", action="append", default=[])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--loops", action="store_true", help="also each build's MMA / TMA loops")
    a = ap.parse_args()
    import tlc
    from bench.sass import loops, opcodes, sass_listing
    from tlc.diagnostics import TlcError

    name, _, value = a.switch.partition("=")
    if not name or any("=" not in d for d in a.defines):
        ap.error("--switch and -D take NAME=VALUE")
    defines = dict(d.split("=", 1) for d in a.defines)
    builds = {}
    is_env = name.startswith("TLC_")
    for label, env in (("default", None), (a.switch, value)):
        if is_env and env is None:
            os.environ.pop(name, None)
        elif is_env:
            os.environ[name] = env
        try:
            kern = tlc.build(a.spec, arch=a.arch, defines=dict(defines, **({name: env} if env and not is_env else {})))
        except TlcError as exc:   # a bad spec or -D, a failed compile: tlc's located message
            print(f"bench/sass_compare.py ({label}): {exc}", file=sys.stderr)
            return 1
        builds[label] = (sass_listing(kern.compiled.cubin), kern.compiled.metadata.get("ptxas", {}))
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for i, (label, (listing, ptxas)) in enumerate(builds.items()):
        (out_dir / f"sass_{i}.txt").write_text(listing)
        counts[label] = opcodes(listing)
        print(f"{label}: {sum(counts[label].values())} instructions, ptxas {ptxas}")
    _table(*counts.values(), a.top)
    if a.loops:
        steady = []
        for label, (listing, _) in builds.items():
            print(f"loops of {label}:")
            found = loops(listing)
            for first, last, ops in found:
                common = ", ".join(f"{k} {n}" for k, n in ops.most_common(8))
                print(f"  {first:#07x}-{last:#07x} {sum(ops.values()):5d} instructions, {ops['R2UR']} R2UR: {common}")
            innermost = [(f, l, o) for f, l, o in found if not any(f < f2 and l2 < l for f2, l2, _ in found)]
            steady.append(max((o for _, _, o in innermost), key=lambda o: sum(o.values()), default=None))
        if all(steady):
            print(f"the steady loops: {sum(steady[0].values())} against {sum(steady[1].values())} instructions")
            _table(*steady, a.top)
    return 0


def _table(a_c, b_c, top: int) -> None:
    keys = sorted(set(a_c) | set(b_c), key=lambda k: -abs(b_c[k] - a_c[k]))
    print(f"{'opcode':28s} {'default':>8s} {'switched':>9s} {'diff':>6s}")
    for k in keys[:top]:
        print(f"{k:28s} {a_c[k]:8d} {b_c[k]:9d} {b_c[k] - a_c[k]:+6d}")


if __name__ == "__main__":
    raise SystemExit(main())

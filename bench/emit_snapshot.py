"""Hashes of the CuTe tlc emits (no NVRTC, no GPU) for every kernel the GPU tests, the benchmarks and
tlc.attention build, plus generated programs: a refactor that must not change any kernel is checked by
taking a snapshot before and comparing after.

    python3 bench/emit_snapshot.py --out /tmp/before.json            # at the old code
    python3 bench/emit_snapshot.py --against /tmp/before.json        # at the new code: lists what differs

Each entry is the sha256 of the emitted source without `#line` directives, or the first line of the
refusal for a program its target refuses (a refusal that changes is a difference too).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SEEDS = range(0, 120)   # tlc.testing.structural programs, both targets


def jobs() -> list[tuple[str, str, str, dict]]:
    """(label, source text, file name, -D bindings, target) of every kernel to hash."""
    from bench.precompile import bar_builds, bench_builds, gpu_test_builds, hopper_attention_builds
    from tlc.testing.structural import structural_program

    out = []
    listed = (gpu_test_builds() + hopper_attention_builds() + bench_builds("sm_90") + bar_builds("sm_90a")
              + bar_builds("sm_90a", short=True))
    for job in listed:
        source, defines = job[0], {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in job[1].items()}
        arch = job[3] if len(job) > 3 else "sm_90"
        if isinstance(source, Path):
            text, name = source.read_text(), source.name
        else:
            text, name = str(source), "kernel.tl"
        # TL text carries its own label (a GPU test's case): two cases may share their -D bindings
        if isinstance(source, str) and len(job) > 2 and job[2]:
            label = f"{job[2]} {arch}"   # where a binding lives (-D or a Param line) is not part of the name
        else:
            label = f"{name} {arch} {sorted(defines.items())}"
        out.append((label, text, name, defines, arch))
    from tests.spec_files import ONE_KERNEL_SPECS
    for spec in ONE_KERNEL_SPECS:   # a program of several kernels is built kernel by kernel elsewhere
        for arch in ("sm_90", "sm_90a"):
            out.append((f"{spec.name} {arch} defaults", spec.read_text(), spec.name, {}, arch))
    for seed in SEEDS:
        text, defines, _ = structural_program(seed)
        for arch in ("sm_90", "sm_90a"):
            out.append((f"seed {seed} {arch}", text, "generated.tl", dict(defines or {}), arch))
    return list({j[0]: j for j in jobs_unique(out)}.values())


def jobs_unique(items):
    seen = set()
    for item in items:
        key = (item[1], item[2], tuple(sorted(item[3].items())), item[4])
        if key not in seen:
            seen.add(key)
            yield item


def digest(job) -> tuple[str, str]:
    from tlc.diagnostics import TlcError
    from tlc.lowering.emit_text import emit_text

    label, text, name, defines, arch = job
    try:
        src = emit_text(text.encode(), name, arch, defines, "cute", line_directives=False)
    except TlcError as exc:
        return label, "refused: " + exc.diagnostics[0].message.splitlines()[0]
    return label, hashlib.sha256(src.encode()).hexdigest()


def snapshot(workers: int) -> dict[str, str]:
    import os
    os.environ.setdefault("TLC_QUIET", "1")
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(digest, jobs(), chunksize=8))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the snapshot here")
    ap.add_argument("--against", help="compare with this snapshot")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if not (args.out or args.against):
        ap.error("give --out, --against or both")
    now = snapshot(args.jobs)
    if args.out:
        Path(args.out).write_text(json.dumps(now, indent=0, sort_keys=True))
    if args.against:
        before = json.loads(Path(args.against).read_text())
        changed = sorted(k for k in before.keys() & now.keys() if before[k] != now[k])
        gone, new = sorted(before.keys() - now.keys()), sorted(now.keys() - before.keys())
        for k in changed:
            print(f"changed: {k}\n   before: {before[k][:100]}\n   now:    {now[k][:100]}")
        for k in gone:
            print(f"only before: {k}")
        for k in new:
            print(f"only now: {k}")
        print(f"{len(now)} kernels: {len(changed)} changed, {len(gone)} gone, {len(new)} new")
        return 1 if changed or gone or new else 0
    print(f"{len(now)} kernels hashed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env bash
# One device call that validates the compiler on a GPU: the carried wheels, then the steps named on the command
# line, each logged under $OUT (a step's failure is recorded and the next still runs). Steps:
#   suite        precompile the GPU tests' kernels (16 jobs), then `pytest -m gpu tests/gpu`
#   hang         the 256-row / 32-key / 4-stage / one-KV-head sm_90a kernel that once hung, at 1x1 and odd sizes
#   diff=A:B     bench/differential_gpu.py on seeds A..B-1 for sm_90 and sm_90a
#   diff-paged=A:B  the same programs with K and V read from pages through a block table (--paged)
#   diff-window=A:B the same programs with their scores also masked outside a key window (--windowed)
#   sanitize     compute-sanitizer memcheck, racecheck and synccheck on bench/sanitize_one.py for both targets
#   sanitize-specs  memcheck and racecheck on bench/sanitize_specs.py (the newer spec constructs), both targets
#   bar          bench/precompile.py --set bar and bench/bench_attention.py --bar --arch sm_90a
#   precompile   bench/precompile.py --set tests alone (before only=…)
#   only=EXPR    `pytest -m gpu tests/gpu -k EXPR` (a rerun of some GPU tests)
#   kv-decode    bench/bench_kv_decode.py --arch sm_90a (decode against a KV cache, tlc's specs and SDPA's backends)
#   varlen       bench/bench_varlen.py (packed sequences against the same tokens as one dense batch)
#   decode-sweep bench/decode_sweep.py (decode_fwd.tl over tiles, splits and targets; per-kernel times)
#   serving-overhead  bench/serving_overhead.py (host µs per serving call, cProfile of the hottest frames)
# usage (device): bash bench/gpu_validate.sh suite hang diff=0:200 sanitize
# Every log and JSON goes to a folder of its own, packed at the end into $OUT/logs.tgz (the device returns a few
# files only); the JSON files are copied to $OUT too.
set -u
RESULTS=${OUT:-/tmp/gpu-validate}
OUT=$(mktemp -d /tmp/gpu-validate-logs.XXXX)
export OUT
mkdir -p "$RESULTS"
pack() { tar czf "$RESULTS/logs.tgz" -C "$OUT" . ; cp "$OUT"/*.json "$RESULTS"/ 2>/dev/null; true; }
trap pack EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.txt" 2>&1 || { echo "wheel install failed"; cat "$OUT/pip.txt"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TLC_CACHE_DIR=${TLC_CACHE_DIR:-/tmp/tlc-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
status=0
step() {  # step NAME COMMAND...: run, log to $OUT/NAME.txt, print the tail
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - t0)) s"; tail -n 15 "$OUT/$name.txt"
    [ $rc -eq 0 ] || status=1
    pack   # after each step: a call stopped at its limit still returns what ran
}
for what in "$@"; do
    case $what in
    suite) step precompile-tests python3 bench/precompile.py --jobs 16 --set tests
           step gpu-suite python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider ;;
    hang)  step hang timeout 120 python3 bench/hang_case.py ;;
    diff=*) step differential python3 bench/differential_gpu.py --seeds "${what#diff=}" --arch sm_90 --arch sm_90a \
               --jobs 16 --timeout 60 --out "$OUT" ;;
    diff-paged=*) mkdir -p "$OUT/paged"
           step differential-paged python3 bench/differential_gpu.py --paged --seeds "${what#diff-paged=}" \
               --arch sm_90 --arch sm_90a --jobs 16 --timeout 60 --out "$OUT/paged" ;;
    diff-window=*) mkdir -p "$OUT/windowed"
           step differential-windowed python3 bench/differential_gpu.py --windowed --seeds "${what#diff-window=}" \
               --arch sm_90 --arch sm_90a --jobs 16 --timeout 60 --out "$OUT/windowed" ;;
    sanitize)
        for arch in sm_90 sm_90a; do
            for tool in memcheck racecheck synccheck; do
                step "$tool-$arch" compute-sanitizer --tool $tool --report-api-errors no \
                    python3 bench/sanitize_one.py --arch $arch
            done
        done ;;
    sanitize-specs)
        for arch in sm_90 sm_90a; do
            step "build-specs-$arch" python3 bench/sanitize_specs.py --arch $arch --build-only
            for tool in memcheck racecheck; do
                step "$tool-specs-$arch" compute-sanitizer --tool $tool --report-api-errors no \
                    python3 bench/sanitize_specs.py --arch $arch
            done
        done ;;
    bar)   step precompile-bar python3 bench/precompile.py --jobs 16 --set bar --arch sm_90a
           step bar python3 bench/bench_attention.py --bar --arch sm_90a ;;
    precompile) step precompile-tests python3 bench/precompile.py --jobs 16 --set tests ;;
    only=*) step only python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "${what#only=}" ;;
    kv-decode) step kv-decode python3 bench/bench_kv_decode.py --arch sm_90a ;;
    varlen) step varlen python3 bench/bench_varlen.py ;;
    decode-sweep) step decode-sweep python3 bench/decode_sweep.py ;;
    serving-overhead) step serving-overhead python3 bench/serving_overhead.py ;;
    *) echo "unknown step '$what'"; status=1 ;;
    esac
done
exit $status

#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repository root, over
# the bundle `cargo xtask gpu-bundle` wrote to target/gpu/:
#
#   bash target/gpu/run.sh kernels examples perf peers
#
#   kernels   every kernel of tests/filetests/cuda/*.dcir against the CPU
#             interpreter (NaN-poisoned outputs), then timed (kernel_check)
#   examples  every ir-example in f32 and f16 through dcir-run --backend cuda
#             --check (whole graph, memory plan, CUDA graph) and --bench
#   models    the imported ONNX models (ResNet-50, MobileNetV2, BERT-base, batch 1,
#             random weights) through dcir-run --backend cuda --check --bench
#   perf      the kernel families at real sizes (kernel_check --no-check)
#   peers     PyTorch (cuBLAS/cuDNN) at the perf shapes (family_peers.py)
#   suite     dcir against PyTorch eager and torch.compile on the suite's
#             workloads, one table of ratios (suite.py --compile)
#   sanitize  every ir-example (f32) under compute-sanitizer memcheck and racecheck
#   test      the GPU test target (crates/dcir-cli/tests/gpu_check.rs)
#
# Logs go to $OUT (the device tool fetches it); the last lines printed are a
# summary. Exit code 1 when any check failed.
set -u
B=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/dcir-gpu}
mkdir -p "$OUT"
status=0
summary=()

kernels() {
    "$B/kernel_check" --reps 50 tests/filetests/cuda/*.dcir >"$OUT/kernels.log" 2>&1 || status=1
    cp "$OUT/kernel_check.md" "$OUT/kernels.md" 2>/dev/null
    summary+=("kernels: $(grep -c '| PASS |' "$OUT/kernels.md") PASS, $(grep -cE '\| (FAIL|ERROR) \|' "$OUT/kernels.md") FAIL/ERROR, $(grep -c '| skip |' "$OUT/kernels.md") skip")
    grep -E 'FAIL|ERROR|skip \(' "$OUT/kernels.log" | head -20
}

examples() {
    : >"$OUT/examples.log"
    for f in ir-examples/*.dcir; do
        for dt in f32 f16; do
            src=$f
            if [ $dt = f16 ]; then src=/tmp/$(basename "$f" .dcir)_f16.dcir; sed 's/f32/f16/g' "$f" >"$src"; fi
            echo "== $f $dt" >>"$OUT/examples.log"
            if "$B/dcir-run" "$src" --backend cuda --check --bench 50 >>"$OUT/examples.log" 2>&1; then
                summary+=("example $(basename "$f" .dcir) $dt: PASS $(grep -A0 '^bench:' "$OUT/examples.log" | tail -1 | sed 's/.*median/median/')")
            else
                status=1; summary+=("example $(basename "$f" .dcir) $dt: FAIL (see examples.log)")
            fi
        done
    done
}

models() {
    : >"$OUT/models.log"
    for m in resnet50 mobilenet_v2 bert_base; do
        "$B/dcir-import" "crates/dcir-onnx/models/$m.onnx" -o "/tmp/$m.dcir" --no-weights >>"$OUT/models.log" 2>&1
        echo "== $m f32" >>"$OUT/models.log"
        if "$B/dcir-run" "/tmp/$m.dcir" --backend cuda --check --bench 20 >>"$OUT/models.log" 2>&1; then
            summary+=("model $m f32: PASS $(grep '^bench:' "$OUT/models.log" | tail -1 | sed 's/.*median/median/')")
        else
            status=1; summary+=("model $m f32: FAIL (see models.log)")
        fi
    done
}

perf() {
    "$B/kernel_check" --no-check --reps 100 crates/dcir-cuda/examples/data/*.dcir >"$OUT/perf.log" 2>&1 || status=1
    cp "$OUT/kernel_check.md" "$OUT/perf.md" 2>/dev/null
    grep -E '^\|' "$OUT/perf.md" | cut -d'|' -f2,3,4,6,10,11,13 | tail -n +2
}

peers() {
    python3 "$B/family_peers.py" 2>&1 | tee "$OUT/peers.log" | tail -25
}

suite() {
    python3 "$B/suite.py" --compile 2>&1 | tee "$OUT/suite.log" | grep -E '^\|' | tail -20
}

sanitize() {
    local cs=/usr/local/cuda/bin/compute-sanitizer
    : >"$OUT/sanitize.log"
    for f in ir-examples/*.dcir; do
        for tool in memcheck racecheck; do
            echo "== $f $tool" >>"$OUT/sanitize.log"
            timeout 45 "$cs" --tool $tool --error-exitcode 3 "$B/dcir-run" "$f" --backend cuda >>"$OUT/sanitize.log" 2>&1
            case $? in
                0) summary+=("sanitize $(basename "$f" .dcir) $tool: clean") ;;
                124) summary+=("sanitize $(basename "$f" .dcir) $tool: not finished in 45 s") ;;
                *) status=1; summary+=("sanitize $(basename "$f" .dcir) $tool: FAIL (see sanitize.log)") ;;
            esac
        done
    done
}

test() {
    if "$B/gpu_check" --nocapture >"$OUT/gpu_check.log" 2>&1; then summary+=("gpu_check: ok"); else status=1; summary+=("gpu_check: FAILED"); fi
    grep -E "test result|SKIP|FAIL" "$OUT/gpu_check.log" | tail -5
}

for step in "$@"; do
    case $step in
        kernels|examples|models|perf|peers|suite|sanitize|test) $step ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
done
printf '%s\n' "${summary[@]}"
exit $status

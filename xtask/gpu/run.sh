#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repository root, over
# the bundle `cargo xtask gpu-bundle` wrote to target/gpu/:
#
#   bash target/gpu/run.sh kernels examples perf peers
#
#   kernels   every kernel of tests/filetests/cuda/*.dcir against the CPU
#             interpreter (NaN-poisoned outputs), then timed (kernel_check)
#   examples  every ir-example in f32, f16 and bf16 through dcir-run --backend cuda
#             --check (whole graph, memory plan, CUDA graph) and --bench
#   export    the ONNX models at batch 32 (export_models.py --batch 32, weights
#             stripped) into crates/dcir-onnx/models/ (and $OUT/models_b32.tgz)
#   models    the imported ONNX models (ResNet-50, MobileNetV2, BERT-base; batch 1,
#             and 32 where exported; f32 and f16 (the f32 graph made f16 by dcir-opt's to-f16 pass); random
#             weights) through dcir-run --backend cuda --check --bench
#   zoo       every model of crates/dcir-onnx/zoo/ (batch 1, random weights) in
#             ZOO_DTYPES (f32 f16 bf16) through dcir-run --backend cuda --check --bench,
#             ZOO_JOBS at once (4), ZOO_ONLY="a b" for some; one line per run in zoo.log.
#             ZOO_BATCH=N runs the zoo exported at batch N ($B/zoo_bN/, see
#             zoo-export); ZOO_CHECK=0 times without --check
#   zoo-export the zoo exported at ZOO_BATCH (32) into $B/zoo_bN/ (export_zoo.py,
#             ZOO_EXPORT_JOBS at once, 8) and $OUT/zoo_bN.tgz
#   zoo-timed the zoo (ZOO_BATCH, ZOO_DTYPES, ZOO_ONLY) timed one model at a time
#             (--bench ZOO_BENCH, 20; no --check) after a parallel pass (ZOO_JOBS)
#             that fills the NVRTC cache; zoo.log as `zoo` writes it, for zoo_table.py
#   tune-share the tuner's library share: each zoo model of ZOO_ONLY (default
#             six: ResNet-50, EfficientNet-B0, DenseNet-121, RegNet-Y-1.6GF,
#             MobileNetV2, Inception-v3) at ZOO_BATCH (32: run zoo-export
#             first) in f16 through dcir-run --tune (candidates timed as
#             CUDA-graph replays; one cache for all), TUNE_TIMEOUT (300 s) a
#             model; the reports under $OUT/tune/, one line a model and the
#             total in tune_share.log (counted from the per-group lines, so a
#             model the timeout cuts off counts what it tuned). TUNE_RUN: another
#             build's dcir-run (e.g. $B/ab/dcir-run); TUNE_CACHE_SEED: a cache
#             an earlier call brought back (only new candidates are measured;
#             xtask/gpu/data/tune_cache_h100_b32_f16.json is 2026-12-07's, H100)
#   zoo-peers PyTorch eager (or torch.compile with ZOO_COMPILE=1, ZOO_PEERS_JOBS
#             compiling at once, 8) on the zoo models, batch ZOO_BATCH (1), f32 and f16
#             (ZOO_PEERS_DTYPES), ZOO_ONLY for some (zoo_peers.py) into zoo_peers.log
#   onnx-node the passing ONNX node tests (the bundle's onnx-node/, written by
#             the node-test harness) through dcir-run --backend cuda --check
#             on the tests' own inputs, in one process (gpu_check's
#             onnx_node test, DCIR_NODE_JOBS threads); the failures in
#             onnx_node.log, every run's output in onnx_node_full.log
#   variants  hand-set kernel variants (examples/data/variants_*.dcir) checked
#             and timed, to fit the cost model
#   hopper    the wgmma mainloop: gemm_wgmma.dcir's and conv_wgmma.dcir's
#             graphs through --check (memcheck and racecheck on five GEMMs and eight convs),
#             then perf_stem.dcir's (ResNet-50's 7x7 stem as planned before
#             and space-to-depth), perf_gemm_wgmma.dcir's graphs (cuBLASLt, wgmma tile widths,
#             mma.sync), perf_conv_wgmma.dcir's (ResNet-50's 3x3 convs at
#             batch 32) and perf_pointwise_wgmma.dcir's (its 1x1 convs as
#             GEMMs, cuBLASLt and wgmma) timed, and cuDNN at the 3x3 convs
#             (conv_peers.py); hopper.log
#   resnet32  ResNet-50 in f16 as planned: batch 1 through --check, batch 32
#             timed kernel by kernel (dcir-run --bench 20 --per-kernel); resnet32.log
#   profile   per-kernel times of ResNet-50 f16, MobileNetV2 f16, the BERT
#             layer f32 and f16 at batch 1 and convblock f16 at batch 32
#             (dcir-run --bench --per-kernel)
#   ncu       Nsight Compute on the depthwise and f16 layernorm kernels
#   perf      the kernel families at real sizes (kernel_check --no-check)
#   peers     PyTorch (cuBLAS/cuDNN) at the perf shapes (family_peers.py)
#   gemm      ViT-B/16 f32 b32's projections through cuBLAS and cuBLASLt, both
#             weight layouts, with and without the bias, and the cuBLASLt
#             heuristic's first eight algorithms each timed (gemm_probe.py)
#   suite     dcir against PyTorch eager and torch.compile on the suite's
#             workloads, one table of ratios (suite.py --compile; more flags
#             in SUITE_ARGS, e.g. "--tune-cache /tmp/t.json --tune-fusion")
#   sanitize  every ir-example (SANITIZE_FILES), with SANITIZE_ZOO=1 every zoo
#             model too, in f32 and f16 under compute-sanitizer's
#             SANITIZE_TOOLS (memcheck racecheck initcheck synccheck),
#             SANITIZE_JOBS at once (4); one line per run in sanitize.log
#   test      the GPU test target (crates/dcir-cli/tests/gpu_check.rs)
#   library   the library calls: every graph of tests/filetests/cuda/cublaslt.dcir
#             and cudnn.dcir through --check and --bench (cuDNN from PyTorch's
#             wheel: its lib folder is put on LD_LIBRARY_PATH); ResNet-50 b32 f16
#             (as written and channels-last), the BERT layer at batch 32
#             (suite.py's graph) and ViT-B/16 at batch 32 (exported here) in
#             f16 checked, then timed per kernel with and without --no-library
#             against the cost model's estimate of every group (fit.py, fit.md;
#             plans, times and --explain-fusion lines under $OUT); with
#             LIBRARY_PEERS=1 also torch eager and torch.compile (CUDA graphs)
#             on ViT-B/16 b32 f16; library.log
#   ab        two builds of dcir-run on zoo models (batch 1, f32 and f16):
#             $B/dcir-run (A) against $AB_RUN (B, default $B/ab/dcir-run, the
#             other build's binary copied there), AB_MODELS (a default list),
#             AB_ROUNDS (3) alternating rounds of --bench 50 after a parallel
#             --check of both (which also fills the NVRTC cache); ab.log has
#             each run's median and the B/A ratio of the medians' medians
#   random    differential testing: RANDOM_CASES (5000) random graphs of
#             dcir-testgen from RANDOM_SEED through dcir-run --check, failures
#             shrunk into $OUT/random/ (crates/dcir-cli/tests/gpu_random.rs);
#             RANDOM_DEADLINE seconds after which no new graph starts;
#             RANDOM_MAX_DIM the largest drawn extent (160)
#
# Logs go to $OUT (the device tool fetches it); the last lines printed are a
# summary. Exit code 1 when any check failed.
set -u
B=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# cuDNN 9 as PyTorch's wheels bring it (dcir loads libcudnn.so.9 by name).
CUDNN_LIB=$(find $(python3 -c 'import site; print(*site.getsitepackages())' 2>/dev/null) -name 'libcudnn.so.9' 2>/dev/null | head -1)
[ -n "$CUDNN_LIB" ] && export LD_LIBRARY_PATH=$(dirname "$CUDNN_LIB"):$LD_LIBRARY_PATH
OUT=${OUT:-/tmp/dcir-gpu}
mkdir -p "$OUT"
status=0
summary=()

# The f16 form of an f32 graph: dcir-opt's to-f16 pass (every f32 value f16;
# constants and clip bounds saturated into f16's range).
to_f16() { "$B/dcir-opt" --pipeline to-f16 "$1" -o "$2"; }
to_bf16() { "$B/dcir-opt" --pipeline to-bf16 "$1" -o "$2"; }

kernels() {
    "$B/kernel_check" --reps 50 tests/filetests/cuda/*.dcir >"$OUT/kernels.log" 2>&1 || status=1
    cp "$OUT/kernel_check.md" "$OUT/kernels.md" 2>/dev/null
    summary+=("kernels: $(grep -c '| PASS |' "$OUT/kernels.md") PASS, $(grep -cE '\| (FAIL|ERROR) \|' "$OUT/kernels.md") FAIL/ERROR, $(grep -c '| skip |' "$OUT/kernels.md") skip")
    grep -E 'FAIL|ERROR|skip \(' "$OUT/kernels.log" | head -20
}

examples() {
    : >"$OUT/examples.log"
    for f in ir-examples/*.dcir; do
        for dt in f32 f16 bf16; do
            src=$f
            if [ $dt != f32 ]; then src=/tmp/$(basename "$f" .dcir)_$dt.dcir; "to_$dt" "$f" "$src"; fi
            echo "== $f $dt" >>"$OUT/examples.log"
            if "$B/dcir-run" "$src" --backend cuda --check --bench 50 >>"$OUT/examples.log" 2>&1; then
                summary+=("example $(basename "$f" .dcir) $dt: PASS $(grep -A0 '^bench:' "$OUT/examples.log" | tail -1 | sed 's/.*median/median/')")
            else
                status=1; summary+=("example $(basename "$f" .dcir) $dt: FAIL (see examples.log)")
            fi
        done
    done
}

export() {
    python3 crates/dcir-onnx/scripts/export_models.py /tmp/onnx_b32 --batch 32 >"$OUT/export.log" 2>&1 || status=1
    cp /tmp/onnx_b32/*.onnx crates/dcir-onnx/models/ 2>/dev/null
    tar czf "$OUT/models_b32.tgz" -C /tmp/onnx_b32 . 2>/dev/null
    summary+=("export: $(ls /tmp/onnx_b32 2>/dev/null | tr '\n' ' ')")
}

models() {
    : >"$OUT/models.log"
    for m in resnet50 mobilenet_v2 bert_base resnet50_b32 mobilenet_v2_b32 bert_base_b32; do
        [ -f "crates/dcir-onnx/models/$m.onnx" ] || continue
        "$B/dcir-import" "crates/dcir-onnx/models/$m.onnx" -o "/tmp/$m.dcir" --no-weights >>"$OUT/models.log" 2>&1
        to_f16 "/tmp/$m.dcir" "/tmp/${m}_f16.dcir"
        for dt in f32 f16; do
            src=/tmp/$m.dcir
            [ $dt = f16 ] && src=/tmp/${m}_f16.dcir
            echo "== $m $dt" >>"$OUT/models.log"
            if timeout 150 "$B/dcir-run" "$src" --backend cuda --check --bench 20 >>"$OUT/models.log" 2>&1; then
                summary+=("model $m $dt: PASS $(grep '^bench:' "$OUT/models.log" | tail -1 | sed 's/.*median/median/')")
            else
                status=1; summary+=("model $m $dt: FAIL (see models.log)")
            fi
        done
    done
}

# The zoo's ONNX files at ZOO_BATCH: the committed ones at batch 1, else zoo-export's.
zoo_dir() { if [ "${ZOO_BATCH:-1}" = 1 ]; then echo crates/dcir-onnx/zoo; else echo "$B/zoo_b$ZOO_BATCH"; fi; }

# One zoo run: `zoo_one MODEL DTYPE` prints `MODEL DTYPE PASS median ...` or FAIL.
zoo_one() {
    local m=$1 dt=$2 src=/tmp/zoo/$1.dcir log=$OUT/zoo/$1_$2.log check=--check
    [ "$dt" != f32 ] && src=/tmp/zoo/${m}_$dt.dcir
    [ "${ZOO_CHECK:-1}" = 0 ] && check=
    # shellcheck disable=SC2086 # $check is one word or none
    if timeout "${ZOO_TIMEOUT:-300}" "$B/dcir-run" "$src" --backend cuda $check --bench "${ZOO_BENCH:-20}" >"$log" 2>&1; then
        echo "$m $dt PASS $(grep '^bench:' "$log" | tail -1 | sed 's/.*median/median/')"
    else
        echo "$m $dt FAIL $(grep -m1 -iE 'error|mismatch|fail' "$log" | head -c 200)"
    fi | tee "$OUT/zoo/${m}_$dt.result"
}

zoo() {
    mkdir -p /tmp/zoo "$OUT/zoo"
    local dir
    dir=$(zoo_dir)
    local models=${ZOO_ONLY:-$(ls "$dir"/*.onnx | xargs -n1 basename | sed 's/\.onnx$//')}
    for m in $models; do
        "$B/dcir-import" "$dir/$m.onnx" -o "/tmp/zoo/$m.dcir" --no-weights >"$OUT/zoo/$m.import.log" 2>&1 &&
            to_f16 "/tmp/zoo/$m.dcir" "/tmp/zoo/${m}_f16.dcir" &&
            to_bf16 "/tmp/zoo/$m.dcir" "/tmp/zoo/${m}_bf16.dcir"
    done
    builtin export -f zoo_one
    builtin export B OUT ZOO_CHECK ZOO_TIMEOUT ZOO_BENCH
    for m in $models; do for dt in ${ZOO_DTYPES:-f32 f16 bf16}; do echo "$m $dt"; done; done |
        xargs -P "${ZOO_JOBS:-4}" -L 1 bash -c 'zoo_one "$0" "$1"' | sort >"$OUT/zoo.log"
    grep -q FAIL "$OUT/zoo.log" && status=1
    summary+=("zoo: $(grep -c ' PASS' "$OUT/zoo.log") PASS, $(grep -c ' FAIL' "$OUT/zoo.log") FAIL (zoo.log)")
}

onnx_node() {
    DCIR_ONNX_NODE_DIR="$B/onnx-node" "$B/gpu_check" onnx_node --nocapture >"$OUT/onnx_node_full.log" 2>&1 || status=1
    grep -E '^(onnx-node:|test_.* FAIL$)' "$OUT/onnx_node_full.log" >"$OUT/onnx_node.log"
    summary+=("$(grep -m1 '^onnx-node:' "$OUT/onnx_node.log") (onnx_node.log)")
    grep ' FAIL$' "$OUT/onnx_node.log" | head -20
}

zoo_timed() {
    (ZOO_CHECK=0 ZOO_BENCH=1 zoo)
    mv "$OUT/zoo.log" "$OUT/zoo_compile.log"
    rm -rf "$OUT/zoo"
    ZOO_CHECK=0 ZOO_JOBS=1 zoo
}

zoo_export() {
    local n=${ZOO_BATCH:-32}
    python3 crates/dcir-onnx/scripts/export_zoo.py "$B/zoo_b$n" --batch "$n" --jobs "${ZOO_EXPORT_JOBS:-8}" \
        ${ZOO_ONLY:+--only "${ZOO_ONLY// /,}"} >"$OUT/zoo_export.log" 2>&1 || status=1
    tar czf "$OUT/zoo_b$n.tgz" -C "$B/zoo_b$n" .
    summary+=("zoo-export: $(tail -1 "$OUT/zoo_export.log")")
}

tune_share() {
    mkdir -p /tmp/zoo "$OUT/tune"
    local dir m src ours=0 lib=0 o l n
    dir=$(ZOO_BATCH=${ZOO_BATCH:-32} zoo_dir)
    : >"$OUT/tune_share.log"
    [ -n "${TUNE_CACHE_SEED:-}" ] && cp "$TUNE_CACHE_SEED" "$OUT/tune/cache.json"
    for m in ${ZOO_ONLY:-resnet50 efficientnet_b0 densenet121 regnet_y_1_6gf mobilenet_v2 inception_v3}; do
        src=/tmp/zoo/${m}_b${ZOO_BATCH:-32}_f16.dcir
        "$B/dcir-import" "$dir/$m.onnx" -o "/tmp/zoo/$m.b.dcir" --no-weights >/dev/null 2>&1 &&
            to_f16 "/tmp/zoo/$m.b.dcir" "$src" || { echo "$m import FAIL" >>"$OUT/tune_share.log"; status=1; continue; }
        timeout "${TUNE_TIMEOUT:-300}" "${TUNE_RUN:-$B/dcir-run}" "$src" --backend cuda --tune --tune-cache "$OUT/tune/cache.json" \
            --tune-report "$OUT/tune/$m.json" >"$OUT/tune/$m.log" 2>&1 || status=1
        # Counted from the per-group lines, so a model cut off by the
        # timeout still counts the groups it tuned.
        o=$(grep -cE '^tune: \[.*\((gemm|conv)\):.* on dcir$' "$OUT/tune/$m.log")
        l=$(grep -cE '^tune: \[.*\((gemm|conv)\):.* on (cublaslt|cudnn)$' "$OUT/tune/$m.log")
        n=$(grep -m1 -o 'tune: \[[0-9]*/[0-9]*\]' "$OUT/tune/$m.log" | sed 's/.*\///; s/\]//')
        echo "$m: $o on dcir's kernels, $l on a library; $(grep -c '^tune: \[' "$OUT/tune/$m.log") of ${n:-?} groups tuned$(grep -q 'GEMM and convolution groups' "$OUT/tune/$m.log" || echo ' (cut off)')" >>"$OUT/tune_share.log"
        ours=$((ours + o))
        lib=$((lib + l))
    done
    echo "total: $ours on dcir's kernels, $lib on a library" >>"$OUT/tune_share.log"
    cat "$OUT/tune_share.log"
    summary+=("tune-share: $ours ours, $lib library (tune_share.log)")
}

zoo_peers() {
    # shellcheck disable=SC2046 # the flag is one word or none
    timeout "${ZOO_PEERS_TIMEOUT:-540}" python3 "$B/zoo_peers.py" $([ "${ZOO_COMPILE:-0}" = 1 ] && echo --compile) \
        --jobs "${ZOO_PEERS_JOBS:-8}" --dtypes "${ZOO_PEERS_DTYPES:-f32,f16}" ${ZOO_ONLY:+--only "${ZOO_ONLY// /,}"} \
        --deadline "${ZOO_PEERS_DEADLINE:-0}" --batch "${ZOO_BATCH:-1}" >"$OUT/zoo_peers.log" 2>"$OUT/zoo_peers.err"
    summary+=("zoo-peers: $(grep -vc ERROR "$OUT/zoo_peers.log") timed, $(grep -c ERROR "$OUT/zoo_peers.log") ERROR (zoo_peers.log)")
}

ncu() {
    local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for kf in depthwise_f32_b32:perf_conv ln_f16_t128_r1:variants_ln; do
        timeout 120 "$ncu" --clock-control none -k "regex:${kf%%:*}" --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
            --section Occupancy --section SchedulerStats \
            "$B/kernel_check" --no-check --reps 3 "crates/dcir-cuda/examples/data/${kf#*:}.dcir" \
            >>"$OUT/ncu.log" 2>&1
    done
}

variants() {
    "$B/kernel_check" --reps 100 crates/dcir-cuda/examples/data/variants_*.dcir >"$OUT/variants.log" 2>&1 || status=1
    cp "$OUT/kernel_check.md" "$OUT/variants.md" 2>/dev/null
    summary+=("variants: $(grep -c '| PASS |' "$OUT/variants.md") PASS, $(grep -cE '\| (FAIL|ERROR) \|' "$OUT/variants.md") FAIL/ERROR")
}

hopper() {
    # The Hopper mainloop: every graph of tests/filetests/cuda/gemm_wgmma.dcir
    # and conv_wgmma.dcir through --check (and memcheck, racecheck on three
    # GEMMs and four convs), then each graph of examples/data/perf_stem.dcir,
    # perf_gemm_wgmma.dcir, perf_conv_wgmma.dcir and perf_pointwise_wgmma.dcir
    # timed, and cuDNN at the conv shapes; hopper.log. HOPPER_SANITIZE
    # (file:graph words) replaces the sanitized list, HOPPER_PERF_ONLY (an
    # extended regex) picks the timed graphs by name.
    local data=crates/dcir-cuda/examples/data f g tool
    : >"$OUT/hopper.log"
    for f in tests/filetests/cuda/gemm_wgmma.dcir tests/filetests/cuda/conv_wgmma.dcir; do
        for g in $(grep -o '^graph @[a-z0-9_]*' "$f" | cut -c8-); do
            if timeout 120 "$B/dcir-run" "$f" --graph "$g" --backend cuda --check >"$OUT/hopper_$g.log" 2>&1; then
                echo "$g check PASS" >>"$OUT/hopper.log"
            else
                echo "$g check FAIL $(grep -m1 -iE 'error|mismatch|differ' "$OUT/hopper_$g.log" | head -c 300)" >>"$OUT/hopper.log"
                status=1
            fi
        done
    done
    for g in ${HOPPER_SANITIZE:-gemm_wgmma:odd_bf16_nt gemm_wgmma:split_bf16 gemm_wgmma:overlapped_bf16 conv_wgmma:strided_bf16 \
        conv_wgmma:split_c3x3_f16 conv_wgmma:n32_c96_f16 conv_wgmma:k1x7_c160_bf16 conv_wgmma:rows192_c3x3_f16 \
        conv_wgmma:rows192_split_bf16 gemm_wgmma:rows192_overlapped_f16 conv_wgmma:swapped_c3x3_f16 \
        conv_wgmma:swapped_split_c32_bf16 gemm_wgmma:swapped_overlapped_f16}; do
        f=tests/filetests/cuda/${g%%:*}.dcir
        for tool in memcheck racecheck; do
            timeout 180 /usr/local/cuda/bin/compute-sanitizer --tool "$tool" --error-exitcode 3 \
                "$B/dcir-run" "$f" --graph "${g#*:}" --backend cuda --check >"$OUT/hopper_${g#*:}_$tool.log" 2>&1
            echo "${g#*:} $tool rc=$? $(tail -1 "$OUT/hopper_${g#*:}_$tool.log")" >>"$OUT/hopper.log"
        done
    done
    for f in "$data/perf_stem.dcir" "$data/perf_gemm_wgmma.dcir" "$data/perf_conv_wgmma.dcir" "$data/perf_pointwise_wgmma.dcir"; do
        for g in $(grep -o '^graph @[a-z0-9_]*' "$f" | cut -c8- | grep -E "${HOPPER_PERF_ONLY:-.}"); do
            echo "$g $(timeout 60 "$B/dcir-run" "$f" --graph "$g" --backend cuda --bench 100 2>&1 | grep -o 'median [0-9.]* ms')" >>"$OUT/hopper.log"
        done
    done
    timeout 300 python3 "$B/conv_peers.py" >>"$OUT/hopper.log" 2>&1
    cat "$OUT/hopper.log"
    summary+=("hopper: $(grep -c PASS "$OUT/hopper.log") checks PASS, $(grep -c FAIL "$OUT/hopper.log") FAIL (hopper.log)")
}

resnet32() {
    local log=$OUT/resnet32.log
    "$B/dcir-import" crates/dcir-onnx/models/resnet50.onnx -o /tmp/r1.dcir --no-weights >/dev/null 2>&1
    "$B/dcir-import" crates/dcir-onnx/models/resnet50_b32.onnx -o /tmp/r32.dcir --no-weights >/dev/null 2>&1
    to_f16 /tmp/r1.dcir /tmp/r1h.dcir
    to_f16 /tmp/r32.dcir /tmp/r32h.dcir
    echo "== resnet50 f16 b1 --check" >"$log"
    timeout 300 "$B/dcir-run" /tmp/r1h.dcir --backend cuda --check >>"$log" 2>&1 || status=1
    echo "== resnet50 f16 b32 --per-kernel" >>"$log"
    timeout 120 "$B/dcir-run" /tmp/r32h.dcir --backend cuda --bench 20 --per-kernel >>"$log" 2>&1 || status=1
    summary+=("resnet32: $(grep -ciE 'mismatch|error' "$log") errors (resnet32.log)")
}

profile() {
    : >"$OUT/profile.log"
    "$B/dcir-import" crates/dcir-onnx/models/resnet50.onnx -o /tmp/p_rn.dcir --no-weights >/dev/null 2>&1
    "$B/dcir-import" crates/dcir-onnx/models/mobilenet_v2.onnx -o /tmp/p_mb.dcir --no-weights >/dev/null 2>&1
    to_f16 /tmp/p_rn.dcir /tmp/p_rn16.dcir
    to_f16 /tmp/p_mb.dcir /tmp/p_mb16.dcir
    to_f16 ir-examples/bert_encoder_layer.dcir /tmp/p_bert16.dcir
    sed 's/\[1,64,56,56\]/[32,64,56,56]/g' ir-examples/convblock_c64_56.dcir | to_f16 - /tmp/p_cb16_b32.dcir
    for f in /tmp/p_rn16.dcir /tmp/p_mb16.dcir ir-examples/bert_encoder_layer.dcir /tmp/p_bert16.dcir /tmp/p_cb16_b32.dcir; do
        echo "== $f" >>"$OUT/profile.log"
        timeout 120 "$B/dcir-run" "$f" --backend cuda --bench 20 --per-kernel >>"$OUT/profile.log" 2>&1 || status=1
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

gemm() {
    python3 "$B/gemm_probe.py" 2>&1 | tee "$OUT/gemm_probe.log" | grep -v Warn
}

suite() {
    # shellcheck disable=SC2086 # SUITE_ARGS is a list of flags
    timeout "${SUITE_TIMEOUT:-900}" python3 "$B/suite.py" --compile --deadline "${SUITE_DEADLINE:-0}" ${SUITE_ARGS:-} 2>&1 | tee "$OUT/suite.log" | grep -E '^\|' | tail -24
}

# One sanitizer run: `sanitize_one FILE TOOL` prints `NAME TOOL clean|FAIL|timeout`.
sanitize_one() {
    local f=$1 tool=$2 name log
    name=$(basename "$f" .dcir)
    log=$OUT/sanitize/${name}_$tool.log
    timeout "${SANITIZE_TIMEOUT:-120}" /usr/local/cuda/bin/compute-sanitizer --tool "$tool" \
        --error-exitcode 3 "$B/dcir-run" "$f" --backend cuda >"$log" 2>&1
    case $? in
        0) echo "$name $tool clean" ;;
        124) echo "$name $tool timeout" ;;
        *) echo "$name $tool FAIL $(grep -m1 -E '=+ (ERROR|Invalid|Race|Uninitialized)' "$log" | head -c 160)" ;;
    esac
}

sanitize() {
    # Every ir-example, or SANITIZE_FILES; with SANITIZE_ZOO=1 every zoo model
    # too; each in f32 and f16 under each of SANITIZE_TOOLS, SANITIZE_JOBS at once.
    mkdir -p "$OUT/sanitize" /tmp/sanitize
    local files=${SANITIZE_FILES:-ir-examples/*.dcir}
    if [ "${SANITIZE_ZOO:-0}" = 1 ]; then
        for m in crates/dcir-onnx/zoo/*.onnx; do
            "$B/dcir-import" "$m" -o "/tmp/sanitize/$(basename "$m" .onnx).dcir" --no-weights >/dev/null 2>&1
        done
        files="$files /tmp/sanitize/*.dcir"
    fi
    local list=()
    for f in $files; do
        list+=("$f")
        local h=/tmp/sanitize/$(basename "$f" .dcir)_f16.dcir
        to_f16 "$f" "$h" && list+=("$h")
    done
    builtin export -f sanitize_one
    builtin export B OUT
    for f in "${list[@]}"; do
        for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do echo "$f $tool"; done
    done | xargs -P "${SANITIZE_JOBS:-4}" -L 1 bash -c 'sanitize_one "$0" "$1"' | sort >"$OUT/sanitize.log"
    grep -q FAIL "$OUT/sanitize.log" && status=1
    summary+=("sanitize: $(grep -c ' clean' "$OUT/sanitize.log") clean, $(grep -c ' FAIL' "$OUT/sanitize.log") FAIL, $(grep -c ' timeout' "$OUT/sanitize.log") timeout (sanitize.log)")
    grep -E ' FAIL| timeout' "$OUT/sanitize.log" | head -20
}

test() {
    if "$B/gpu_check" --nocapture >"$OUT/gpu_check.log" 2>&1; then summary+=("gpu_check: ok"); else status=1; summary+=("gpu_check: FAILED"); fi
    grep -E "test result|SKIP|FAIL" "$OUT/gpu_check.log" | tail -5
}

random() {
    mkdir -p "$OUT/random"
    DCIR_RUN="$B/dcir-run" DCIR_RANDOM_OUT="$OUT/random" DCIR_PROPTEST_CASES="${RANDOM_CASES:-5000}" \
        DCIR_RANDOM_MAX_DIM="${RANDOM_MAX_DIM:-160}" \
        DCIR_PROPTEST_SEED="${RANDOM_SEED:-3700000000}" \
        DCIR_RANDOM_DEADLINE_S="${RANDOM_DEADLINE:-0}" "$B/gpu_random" --nocapture >"$OUT/random.log" 2>&1 || status=1
    summary+=("random: $(grep -m1 '^random graphs' "$OUT/random.log")")
    grep -A3 'FAIL' "$OUT/random.log" | head -30
}

# Two builds of dcir-run on the same models and card, rounds interleaved.
ab_check() {
    local which=$1 m=$2 dt=$3 run=$B/dcir-run src=/tmp/ab/$2.dcir
    [ "$which" = B ] && run=${AB_RUN:-$B/ab/dcir-run}
    [ "$dt" = f16 ] && src=/tmp/ab/${m}_f16.dcir
    if timeout 300 "$run" "$src" --backend cuda --check >"$OUT/ab/${m}_${dt}_$which.check.log" 2>&1; then
        echo "$m $dt $which check PASS"
    else
        echo "$m $dt $which check FAIL"
    fi
}

ab() {
    mkdir -p /tmp/ab "$OUT/ab"
    local models=${AB_MODELS:-efficientnet_b0 resnet50 mobilenet_v2 densenet121 vit_b_16 regnet_y_400mf convnext_tiny mnasnet1_0 bert_base}
    for m in $models; do
        "$B/dcir-import" "crates/dcir-onnx/zoo/$m.onnx" -o "/tmp/ab/$m.dcir" --no-weights >/dev/null 2>&1 &&
            to_f16 "/tmp/ab/$m.dcir" "/tmp/ab/${m}_f16.dcir"
    done
    builtin export -f ab_check
    builtin export B OUT AB_RUN
    for m in $models; do for dt in f32 f16; do echo "A $m $dt"; echo "B $m $dt"; done; done |
        xargs -P "${AB_JOBS:-8}" -L 1 bash -c 'ab_check "$0" "$1" "$2"' | sort >"$OUT/ab.log"
    grep -q FAIL "$OUT/ab.log" && status=1
    local r m dt which run src
    for r in $(seq "${AB_ROUNDS:-3}"); do
        for m in $models; do for dt in f32 f16; do for which in A B; do
            run=$B/dcir-run
            [ $which = B ] && run=${AB_RUN:-$B/ab/dcir-run}
            src=/tmp/ab/$m.dcir
            [ $dt = f16 ] && src=/tmp/ab/${m}_f16.dcir
            echo "$m $dt $which $r $(timeout 120 "$run" "$src" --backend cuda --bench 50 2>&1 | grep '^bench:' | sed 's/.*median \([0-9.]*\) ms.*/\1/')"
        done; done; done
    done >"$OUT/ab_times.log"
    python3 - "$OUT/ab_times.log" >>"$OUT/ab.log" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5:
        runs.setdefault((f[0], f[1]), {}).setdefault(f[2], []).append(float(f[4]))
ratios = []
print("model dtype A_ms B_ms B/A")
for (m, dt), t in runs.items():
    if "A" in t and "B" in t:
        a, b = statistics.median(t["A"]), statistics.median(t["B"])
        ratios.append(b / a)
        print(f"{m} {dt} {a:.4f} {b:.4f} {b / a:.3f}")
if ratios:
    print(f"geomean B/A {statistics.geometric_mean(ratios):.3f} over {len(ratios)}")
PY
    summary+=("ab: $(tail -1 "$OUT/ab.log") (ab.log)")
    tail -25 "$OUT/ab.log"
}

library() {
    local log=$OUT/library.log
    : >"$log"
    lib_run() {
        echo "== $*" >>"$log"
        timeout 300 "$B/dcir-run" "$@" --backend cuda >>"$log" 2>&1 || { status=1; echo "FAIL $*" >>"$log"; }
    }
    for g in lt_bias_relu lt_batched_tb lt_f32_ta lt_residual lt_gelu_tanh lt_odd; do
        lib_run tests/filetests/cuda/cublaslt.dcir --graph "$g" --check --bench 20
    done
    for g in dnn_bias_relu dnn_residual dnn_f32_strided dnn_grouped_bias dnn_depthwise; do
        lib_run tests/filetests/cuda/cudnn.dcir --graph "$g" --check --bench 20
    done
    # ResNet-50 at batch 32 in f16 (as written and channels-last), the BERT
    # layer at batch 32 (suite.py's graph) and ViT-B/16 at batch 32 (exported
    # here), checked with libraries; then each timed per kernel with
    # libraries and with our kernels only (--no-library), against the cost
    # model's estimate of every group (fit.py into fit.md), on the card's
    # preset so that dcir-opt and dcir-run plan alike.
    "$B/dcir-import" crates/dcir-onnx/models/resnet50_b32.onnx -o /tmp/r50b32.dcir --no-weights >>"$log" 2>&1
    to_f16 /tmp/r50b32.dcir /tmp/r50b32_f16.dcir
    python3 -c "import sys; sys.path.insert(0, '$B'); import suite; open('/tmp/bert_b32.dcir', 'w').write(suite.bert_layer_text(32).replace('f32', 'f16'))"
    python3 - <<'PY' >>"$log" 2>&1
import torch, torchvision
torch.onnx.export(torchvision.models.vit_b_16().eval(), (torch.randn(32, 3, 224, 224),),
                  "/tmp/vit_b32.onnx", dynamo=False, opset_version=17)
PY
    "$B/dcir-import" /tmp/vit_b32.onnx -o /tmp/vit_b32_f32.dcir --no-weights >>"$log" 2>&1
    to_f16 /tmp/vit_b32_f32.dcir /tmp/vit_b32.dcir
    local preset=h100
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && preset=h200
    local specs=("r50b32_f16 --layout as-written" "r50b32_f16 --layout channels-last" "bert_b32" "vit_b32")
    for spec in "${specs[@]}"; do
        set -- $spec
        local f=/tmp/$1.dcir label=$1; shift
        [ $# -gt 0 ] && label="$label-$2"
        lib_run "$f" "$@" --check
        for mode in "" --no-library; do
            "$B/dcir-opt" --fuse --emit plan --format json --device $preset "$@" $mode "$f" >/tmp/fit_plan.json 2>>"$log"
            "$B/dcir-opt" --fuse --emit plan --explain-fusion --device $preset "$@" $mode "$f" 2>&1 | grep -E '^  @g|^layout' >"$OUT/explain_$label$mode.txt"
            echo "== $label $mode per kernel" >>"$log"
            timeout 300 "$B/dcir-run" "$f" --backend cuda --device $preset "$@" $mode --bench 20 --per-kernel >/tmp/fit_times.txt 2>>"$log"
            grep -E 'median' /tmp/fit_times.txt >>"$log"
            python3 "$B/fit.py" /tmp/fit_plan.json /tmp/fit_times.txt "$label $mode on $preset" >>"$OUT/fit.md" 2>&1
            cp /tmp/fit_plan.json "$OUT/plan_$label$mode.json"
            cp /tmp/fit_times.txt "$OUT/times_$label$mode.txt"
        done
    done
    if [ -n "${LIBRARY_PEERS:-}" ]; then
        python3 - <<'PY' >>"$log" 2>&1
import torch, torchvision
m = torchvision.models.vit_b_16().eval().cuda().half()
x = torch.randn(32, 3, 224, 224, device="cuda", dtype=torch.half)
def timed(fn, warm=10, iters=30, rounds=5):
    with torch.no_grad():
        for _ in range(warm): fn()
        torch.cuda.synchronize(); ts = []
        for _ in range(rounds):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters): fn()
            e.record(); e.synchronize(); ts.append(s.elapsed_time(e) / iters)
        return sorted(ts)[len(ts) // 2]
print(f"vit_b32 f16 eager {timed(lambda: m(x)):.3f} ms", flush=True)
c = torch.compile(m, mode="reduce-overhead")
print(f"vit_b32 f16 inductor+CG {timed(lambda: c(x)):.3f} ms", flush=True)
PY
    fi
    summary+=("library: $(grep -c '^FAIL' "$log") failed runs; $(grep -cE 'median' "$log") timed (library.log; fit.md)")
    grep -E '^(==|FAIL)|median|check|vit_b32' "$log" | tail -40
}

for step in "$@"; do
    case $step in
        kernels|examples|export|models|zoo|variants|hopper|resnet32|profile|ncu|perf|peers|gemm|suite|sanitize|test|random|ab|library) $step ;;
        zoo-peers) zoo_peers ;;
        zoo-export) zoo_export ;;
        zoo-timed) zoo_timed ;;
        tune-share) tune_share ;;
        onnx-node) onnx_node ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
done
printf '%s\n' "${summary[@]}"
exit $status

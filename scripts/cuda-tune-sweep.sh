#!/usr/bin/env bash
# Times the CUDA contraction kernels' variants (KILN_CUDA_TUNE, docs/cuda.md) on the GPU
# machine in one call:
#
#     scripts/cuda-tune-sweep.sh KILN_BIN MODELS_DIR [f32|mma|elt|all]
#
# KILN_BIN is a kiln binary built with the `cuda` feature; MODELS_DIR a writable folder
# (the models are generated there with scripts/gen_models.py: python3 with onnx and numpy).
# Per variant, one labelled block:
#   - `kiln gpu-check` of a smaller model of the same graph (tune_check_f32: 520x1000x264;
#     tune_check_bf16: 520x1032x392 through casts to bf16), compiled with the variant: every
#     dispatch against the kernel interpreter (the interpreter would take minutes on
#     matmul1024 and hours on gemm4096_bf16, per variant);
#   - `kiln compile` of matmul1024 / gemm4096_bf16 with the variant (`--timings`: the
#     product's note and ptxas's registers, shared memory and spills);
#   - `kiln bench --device cuda --resident` (the whole graph, data on the device) and
#     `kiln bench --profile` (each command alone; the product is the slowest line).
# A summary table (median of the resident bench per variant) is printed last.
# Every step has a timeout; the whole sweep takes about 3-4 minutes on an H100/H200.
set -u

KILN=${1:?usage: cuda-tune-sweep.sh KILN_BIN MODELS_DIR [f32|mma|elt|all]}
DIR=${2:?usage: cuda-tune-sweep.sh KILN_BIN MODELS_DIR [f32|mma|elt|all]}
WHICH=${3:-all}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DIR"

# The variants (docs/cuda.md, "Kernel variants"): "" is today's default.
F32_VARIANTS=("" "f32=128x64s2" "f32=64x128s2" "f32=128x128s4" "f32=128x128s2" "f32=64x64" "f32=128x64s4")
# On gemm4096_bf16 "" is the default (the warpgroup kernel, cuda/wgmma.rs, where it
# applies); every other variant adds wgmma=off so that it times mma.sync.
MMA_VARIANTS=("" "mma=bk32s3" "mma=bk32s4t128x128w4v2" "mma=bk32s3t128x128" "mma=bk32s4" "mma=bk64s3" "mma=bk64s4" "mma=bk64s2"
  "mma=bk32s3t128x128w4" "mma=bk32s4t128x128w4" "mma=bk64s3t128x128w4"
  "mma=bk64s3v2" "mma=bk32s4t128x128w4v2"
  "mma=bk32s3t128x256" "mma=bk32s4t256x128" "mma=bk64s3t128x256")
# On eltwise (4M-element Relu(a*b + c)): the streaming cache hint and grid caps.
ELT_VARIANTS=("" "elt=cs" "elt=g1056" "elt=cs+g1056" "elt=g528" "elt=g2112" "")

# KILN_TUNE_VARIANTS="a b …" replaces the chosen sweep's list (the word `default` for
# today's default): one call can time only the variants in question.
if [ -n "${KILN_TUNE_VARIANTS:-}" ]; then
  read -r -a picked <<<"$KILN_TUNE_VARIANTS"
  for i in "${!picked[@]}"; do [ "${picked[$i]}" = default ] && picked[$i]=""; done
  F32_VARIANTS=("${picked[@]}")
  MMA_VARIANTS=("${picked[@]}")
  ELT_VARIANTS=("${picked[@]}")
fi

# ptxas for the cubin (and its register report), as scripts/gpu_test.py looks for it;
# without one the artifacts carry PTX only and the driver compiles it at load.
if [ -z "${KILN_PTXAS:-}" ]; then
  for c in "$(command -v ptxas 2>/dev/null)" /usr/local/cuda/bin/ptxas /usr/local/cuda*/bin/ptxas \
    "$(python3 -c 'import sys; print(sys.prefix)' 2>/dev/null)"/lib/python3*/site-packages/nvidia/*/bin/ptxas; do
    if [ -n "$c" ] && [ -x "$c" ]; then export KILN_PTXAS="$c"; break; fi
  done
fi
echo "cuda-tune-sweep: ptxas: ${KILN_PTXAS:-none found (PTX only: the driver JIT-compiles each variant)}"

python3 "$HERE/gen_models.py" --only matmul1024,gemm4096_bf16,tune_check_f32,tune_check_bf16,eltwise --out "$DIR" \
  || { echo "cuda-tune-sweep: gen_models.py failed"; exit 1; }

SUMMARY=()

# sweep MODEL CHECK_MODEL ULPS VARIANT...
# ULPS: gpu-check's tolerance in ulps of the output (f32 for both products). f32: 64
# (a split-K sums its parts in another order than the interpreter's one loop: about 9
# ulps were seen at K 1024, and the tool's 8 do not grow with K). bf16: 65536 = one
# bf16 step (the product is rounded to bf16 before its cast to f32, and a sum in the
# tensor cores' order may round the other way), as the numpy check of gemm4096_bf16.
sweep() {
  local model=$1 check=$2 ulps=$3
  shift 3
  local v
  for v in "$@"; do
    local label=${v:-default}
    local art="$DIR/${model}.${label//[=,]/_}.kiln"
    echo
    echo "================ ${model} :: KILN_CUDA_TUNE=${label} ================"
    # The check model is small: a tensor-core variant names the 128x128 tile there
    # (t128x128, what gemm4096_bf16 takes anyway) so that it checks the same kernel code.
    local cv=$v
    # (the tile goes before the w4/v2 suffixes: bkKsS[bB][tBMxBN][w4][v2]).
    case "$v" in mma=*t*) ;; mma=*) cv=$(sed -E 's/^(mma=bk[0-9]+s[0-9]+(b[0-9])?)/\1t128x128/' <<<"$v") ;; esac
    if [ "$model" = gemm4096_bf16 ] && [ -n "$v" ]; then v="$v,wgmma=off"; cv="$cv,wgmma=off"; fi
    echo "--- gpu-check ${check} --ulps ${ulps} with KILN_CUDA_TUNE=${cv:-default} (every dispatch against the interpreter)"
    local check_out
    check_out=$(KILN_CUDA_TUNE="$cv" timeout 90 "$KILN" gpu-check "$DIR/${check}.onnx" --ulps "$ulps" 2>&1)
    local check_rc=$?
    echo "$check_out" | tail -6
    local verdict=pass
    [ $check_rc -eq 0 ] || verdict="FAIL(rc=$check_rc)"
    echo "--- compile ${model}"
    export KILN_CUDA_TUNE="$v"
    if ! timeout 60 "$KILN" compile "$DIR/${model}.onnx" --target cuda --timings -o "$art" >"$art.log" 2>&1; then
      tail -5 "$art.log"
      SUMMARY+=("$(printf '%-15s %-26s %-14s %s' "$model" "$label" "$verdict" "compile failed")")
      continue
    fi
    grep -E "ptxas|contraction" "$art.log" | head -5
    "$KILN" inspect "$art" 2>/dev/null | grep -E "^  kernel |^  k[0-9].* contraction "
    echo "--- bench --resident (300 calls)"
    local bench_out
    bench_out=$(timeout 60 "$KILN" bench "$art" --device cuda --resident --warmup 50 --iterations 300 2>&1)
    echo "$bench_out" | tail -8
    echo "--- bench --profile (30 calls, slowest commands first)"
    timeout 60 "$KILN" bench "$art" --device cuda --profile --warmup 5 --iterations 30 2>&1 | head -6
    local median
    median=$(echo "$bench_out" | grep -m1 -oE "median [0-9.]+ ms, p99 [0-9.]+ ms")
    SUMMARY+=("$(printf '%-15s %-26s %-14s %s' "$model" "$label" "$verdict" "$median")")
  done
  unset KILN_CUDA_TUNE
}

case "$WHICH" in
  f32) sweep matmul1024 tune_check_f32 64 "${F32_VARIANTS[@]}" ;;
  mma) sweep gemm4096_bf16 tune_check_bf16 65536 "${MMA_VARIANTS[@]}" ;;
  # eltwise checks itself: 4M elements are quick for the interpreter, and exact.
  elt) sweep eltwise eltwise 8 "${ELT_VARIANTS[@]}" ;;
  *)
    sweep matmul1024 tune_check_f32 64 "${F32_VARIANTS[@]}"
    sweep gemm4096_bf16 tune_check_bf16 65536 "${MMA_VARIANTS[@]}"
    ;;
esac

echo
echo "================ summary (gpu-check verdict, resident bench) ================"
printf '%s\n' "${SUMMARY[@]}"

#!/usr/bin/env bash
# The DeepSpeed parity suite, packed here and run on the GPU machine (docs/deepspeed_parity.md).
# Here:   tests/deepspeed_parity/run_parity.sh pack [MORE_TARGETS...]
#           builds zero_parity (with CUDA) into .carry/ through tools/pack_gpu.sh (which rebuilds
#           .carry/ from scratch: name the other targets of the same device call here) and checks
#           the DeepSpeed wheels in .whl/. Carry: [".carry", ".whl"].
# There:  tests/deepspeed_parity/run_parity.sh run OUTDIR [--filter SUBSTRING]
#           installs DeepSpeed 0.19.8 from .whl/ into /tmp/site (../shared/DEVICE.md), runs every
#           cell through zero_parity (cuda) and ds_parity.py (DeepSpeed, world 1, NCCL), compares,
#           and writes OUTDIR/deepspeed_parity.md (docs/deepspeed_parity.md with the table filled
#           in), OUTDIR/parity.json (per-cell figures), OUTDIR/parity.log. Raw per-cell results go
#           to $PARITY_RAW (default /tmp/parity_raw); PARITY_KEEP_RAW=1 also packs them into
#           OUTDIR/parity_raw.tar.gz.
# Locally (CPU, a venv with torch + deepspeed): run-local OUTDIR PYTHON [--filter S]
set -uo pipefail
cd "$(dirname "$0")/../.."
HERE=tests/deepspeed_parity
WHEELS=(hjson-3.1.0-py3-none-any.whl pydantic-2.14.3-py3-none-any.whl
        pydantic_core-2.50.4-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
        annotated_types-0.8.0-py3-none-any.whl typing_inspection-0.4.5-py3-none-any.whl
        typing_extensions-4.16.0-py3-none-any.whl)
SDIST=deepspeed-0.19.8.tar.gz

check_wheels() {
  local bad=0
  for w in "${WHEELS[@]}" "$SDIST"; do
    if [ ! -s ".whl/$w" ]; then
      echo "run_parity: missing .whl/$w (download it: docs/deepspeed_parity.md, 'Wheels')" >&2
      bad=1
    fi
  done
  return $bad
}

# run_cells OUTDIR DEVICE PYTHON [--filter S]: both sides, then compare. Needs ZERO_PARITY set.
run_cells() {
  local out=$1 device=$2 py=$3; shift 3
  local raw=${PARITY_RAW:-/tmp/parity_raw}
  rm -rf "$raw" && mkdir -p "$raw/zero" "$raw/ds" "$out"
  local rc=0
  step() {
    echo "=== $*"
    local t0; t0=$(date +%s.%N)
    "$@"; local r=$?
    echo "=== exit $r, $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N)-$t0}") s: $1 ..."
    [ $r -eq 0 ] || rc=1
  }
  step "$py" $HERE/cells.py "$raw/cells.json"
  step "$ZERO_PARITY" --cells "$raw/cells.json" --out "$raw/zero" --device "$device" "$@"
  step "$py" $HERE/ds_parity.py --cells "$raw/cells.json" --out "$raw/ds" --device "$device" "$@"
  local header
  header="Recorded $(date -u +%Y-%m-%d) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo "$device"),"
  header="$header DeepSpeed $("$py" -c 'import deepspeed;print(deepspeed.__version__)' 2>/dev/null),"
  header="$header PyTorch $("$py" -c 'import torch;print(torch.__version__)' 2>/dev/null), zero $(git rev-parse --short HEAD 2>/dev/null || echo '?'), device $device."
  step "$py" $HERE/compare.py --cells "$raw/cells.json" --zero "$raw/zero" --ds "$raw/ds" \
       --template docs/deepspeed_parity.md --write "$out/deepspeed_parity.md" --json "$out/parity.json" \
       --header "$header"
  if [ "${PARITY_KEEP_RAW:-0}" = 1 ]; then
    tar -C "$raw" -czf "$out/parity_raw.tar.gz" . && echo "raw results: $out/parity_raw.tar.gz"
  fi
  echo "deepspeed parity: $([ $rc -eq 0 ] && echo all steps ran || echo FAILURES) (table: $out/deepspeed_parity.md)"
  return $rc
}

case "${1:-}" in
  pack)
    shift
    check_wheels || exit 1
    bash tools/pack_gpu.sh //tests/deepspeed_parity:zero_parity "$@" || exit 1
    du -sh .whl
    echo "carry: [\".carry\", \".whl\"]; there: $HERE/run_parity.sh run \$OUT"
    ;;
  run)
    out=${2:?usage: run_parity.sh run OUTDIR [--filter S]}
    shift 2
    mkdir -p "$out"
    {
      date -u
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      check_wheels || exit 1
      site=/tmp/site
      rm -rf "$site"
      python3 -m pip install -q --no-index --no-deps --target "$site" "${WHEELS[@]/#/.whl/}" || exit 1
      DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" \
        ".whl/$SDIST" || exit 1
      export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
      export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29533}
      ZERO_PARITY=.carry/bin/zero_parity run_cells "$out" cuda python3 "$@"
    } 2>&1 | tee "$out/parity.log"
    exit "${PIPESTATUS[0]}"
    ;;
  run-local)
    out=${2:?usage: run_parity.sh run-local OUTDIR PYTHON [--filter S]}
    py=${3:?usage: run_parity.sh run-local OUTDIR PYTHON [--filter S]}
    shift 3
    bazel build //tests/deepspeed_parity:zero_parity || exit 1
    mkdir -p "$out"
    export DS_ACCELERATOR=cpu RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29533}
    ZERO_PARITY=bazel-bin/tests/deepspeed_parity/zero_parity run_cells "$out" cpu "$py" "$@" 2>&1 | tee "$out/parity.log"
    exit "${PIPESTATUS[0]}"
    ;;
  *)
    echo "usage: $0 pack [TARGETS...] | run OUTDIR [--filter S] | run-local OUTDIR PYTHON [--filter S]" >&2
    exit 2
    ;;
esac

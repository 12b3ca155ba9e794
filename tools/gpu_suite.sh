#!/usr/bin/env bash
# Every GPU test and the GPU main-job run, in one go, for the GPU machine (docs/gpu.md).
# Here:   tools/gpu_suite.sh pack      builds and packs the binaries + libgloo into .carry/
# There:  tools/gpu_suite.sh run OUTDIR  runs them and writes OUTDIR/gpu_suite.log (+ plot, JSON log)
set -uo pipefail
cd "$(dirname "$0")/.."
TARGETS=(//runtime:cuda_device_test //comm:nccl_communicator_test //comm:comm_worker
         //models/byte:byte_lm_cuda_test //tests/equivalence:gpu_equivalence //train:zero_train)

case "${1:-}" in
  pack)
    exec bash tools/pack_gpu.sh "${TARGETS[@]}"
    ;;
  run)
    out=${2:?usage: gpu_suite.sh run OUTDIR}
    mkdir -p "$out"
    export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export ZERO_REQUIRE_GPU=1  # a GPU test that finds no GPU fails here instead of skipping
    B=.carry/bin
    rc=0
    step() {
      echo "=== $*"
      local t0=$(date +%s.%N)
      "$@"; local r=$?
      echo "=== exit $r, $(python3 -c "import time;print(round(time.time()-$t0,1))") s: $*"
      [ $r -eq 0 ] || rc=1
    }
    {
      date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      step $B/cuda_device_test
      step $B/nccl_communicator_test
      step $B/byte_lm_cuda_test
      step $B/gpu_equivalence
      step $B/zero_train --device cuda --nproc 1 --steps 600 --no-progress \
           --log-json "$out/zero_train_gpu.jsonl" --plot "$out/zero_train_gpu.svg"
      step $B/zero_train --device cuda --nproc 1 --steps 60 --no-progress --plot none --sample 0 \
           --hidden 1024 --ffn 4096 --layers 4
      echo "gpu suite: $([ $rc -eq 0 ] && echo all passed || echo FAILURES)"
    } 2>&1 | tee "$out/gpu_suite.log"
    exit $rc
    ;;
  *)
    echo "usage: tools/gpu_suite.sh pack | run OUTDIR" >&2
    exit 2
    ;;
esac

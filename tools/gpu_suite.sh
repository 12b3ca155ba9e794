#!/usr/bin/env bash
# Every GPU test and the GPU main-job runs, in one go, for the GPU machine (docs/gpu.md).
# Here:   tools/gpu_suite.sh pack [OLD_DIR]   builds and packs the binaries + libgloo into .carry/;
#                                             with OLD_DIR (a folder holding an earlier build's
#                                             zero_llm and zero_train) those go to .carry/old/; the
#                                             whole is then one .carry/suite.tar.xz (about 14 MB: the
#                                             binaries alone are over the device tool's 64 MiB)
# There:  tools/gpu_suite.sh run OUTDIR       runs them and writes OUTDIR/gpu_suite.log (+ plot, JSON
#                                             logs); with .carry/old/ present, the same zero_llm and
#                                             zero_train runs with the old binaries, and their losses
#                                             and master-weight hashes compared bit for bit with the
#                                             new ones' (what a refactor must leave unchanged)
set -uo pipefail
cd "$(dirname "$0")/.."
TARGETS=(//runtime:cuda_device_test //comm:nccl_communicator_test //comm:comm_worker
         //models/byte:byte_lm_cuda_test //models/llama:cuda_model_test
         //tests/equivalence:gpu_equivalence //train:zero_train //train:zero_llm)

case "${1:-}" in
  pack)
    bash tools/pack_gpu.sh "${TARGETS[@]}" || exit 1
    if [ -n "${2:-}" ]; then
      mkdir -p .carry/old && cp -L "$2/zero_llm" "$2/zero_train" .carry/old/ || exit 1
    fi
    (cd .carry && tar cf - * | xz -T2 -6 > ../.suite.tar.xz) && rm -rf .carry && mkdir .carry &&
      mv .suite.tar.xz .carry/suite.tar.xz || exit 1
    du -sh .carry
    ;;
  run)
    out=${2:?usage: gpu_suite.sh run OUTDIR}
    mkdir -p "$out"
    if [ -f .carry/suite.tar.xz ] && [ ! -d .carry/bin ]; then tar xJf .carry/suite.tar.xz -C .carry || exit 1; fi
    export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export ZERO_REQUIRE_GPU=1  # a GPU test that finds no GPU fails here instead of skipping
    B=.carry/bin
    rm -f "$out/failed"
    step() {
      echo "=== $*"
      local t0=$(date +%s.%N)
      "$@"; local r=$?
      echo "=== exit $r, $(python3 -c "import time;print(round(time.time()-$t0,1))") s: $*"
      [ $r -eq 0 ] || touch "$out/failed"
    }
    # The main-job runs both builds make (OUTDIR/jobs_<build>_*): the transformer at two shapes and the
    # byte model, each with a master-weight hash (zero_llm) and a JSON line per step.
    jobs() {  # jobs BINDIR TAG
      step "$1/zero_llm" --device cuda --nproc 1 --preset qwen3-0.6b --seq 2048 --batch 4 --steps 6 \
           --hash-weights --plot none --print-every 1 --log-json "$out/jobs_$2_qwen.jsonl"
      step "$1/zero_llm" --device cuda --nproc 1 --steps 30 --hash-weights --plot none --print-every 10 \
           --log-json "$out/jobs_$2_tiny.jsonl"
      step "$1/zero_train" --device cuda --nproc 1 --steps 100 --no-progress --plot none --sample 0 \
           --log-json "$out/jobs_$2_byte.jsonl"
    }
    {
      date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      step $B/cuda_device_test
      step $B/nccl_communicator_test
      step $B/byte_lm_cuda_test
      step $B/cuda_model_test
      step $B/gpu_equivalence
      step $B/gpu_equivalence --world 4 --comm same_device
      step $B/zero_train --device cuda --nproc 1 --steps 600 --no-progress \
           --log-json "$out/zero_train_gpu.jsonl" --plot "$out/zero_train_gpu.svg"
      jobs $B new
      if [ -d .carry/old ]; then
        jobs .carry/old old
        # Losses and hashes bit for bit; timings and memory figures may differ.
        step python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
bad = 0
for name in ("qwen", "tiny", "byte"):
    rows = []
    for tag in ("new", "old"):
        with open("%s/jobs_%s_%s.jsonl" % (out, tag, name)) as f:
            rows.append([{k: v for k, v in json.loads(l).items() if re.search("loss|step|norm|scale|lr", k)
                          and not re.search("time|_s$|ms|sec|per_s", k)} for l in f if l.strip()])
    same = rows[0] == rows[1] and len(rows[0]) > 0
    print("%s: %d steps, losses %s" % (name, len(rows[0]), "bitwise equal" if same else "DIFFER"))
    bad += not same
# zero_llm prints master_weights_hash=...: new qwen, new tiny, then old qwen, old tiny (this log so far)
hashes = re.findall(r"master_weights_hash=(\S+)", open(out + "/gpu_suite.log").read())
same = len(hashes) == 4 and hashes[:2] == hashes[2:]
print("master weight hashes (new qwen, tiny; old qwen, tiny): %s: %s" % (" ".join(hashes), "equal" if same else "DIFFER"))
bad += not same
sys.exit(1 if bad else 0)
PY
      fi
      echo "gpu suite: $([ -e "$out/failed" ] && echo FAILURES || echo all passed)"
    } 2>&1 | tee "$out/gpu_suite.log"
    # The master-weight hashes of both builds' zero_llm runs, side by side.
    grep -h "^=== .*zero_llm\|master_weights_hash" "$out/gpu_suite.log" > "$out/hashes.txt"
    [ ! -e "$out/failed" ]
    ;;
  *)
    echo "usage: tools/gpu_suite.sh pack [OLD_DIR] | run OUTDIR" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Issue 21's target 3 on the GPU machine: the largest transformer one H200 machine trains (1 H200,
# 125 GiB of host memory, a 64 GiB disk), with the optimizer states tiered over three places, and
# DeepSpeed ZeRO-Infinity's largest transformer beside it (docs/performance.md, "The largest transformer").
# Here:   bench/run_llm_largest.sh pack     bench/run_llm_bench.sh pack (zero_llm and its libraries into
#                                           .carry/llm/) plus aio_bench and pcie_bench; .whl/ for DeepSpeed
# There:  bash bench/run_llm_largest.sh run OUTDIR [PHASE...]   (device tool; carry [".carry/llm"], plus
#         ".whl" for the deepspeed phase: DeepSpeed 0.19.8, its wheels and Debian's libaio .debs)
#   PHASE floors:    the disk (aio_bench, raw O_DIRECT at 4 io contexts x depth 2) and PCIe (pcie_bench)
#                    of this machine, this call: the floors the step is read against
#   PHASE ours:      zero_llm on PRESET (default llama-2-13b) at seq 2048, MICRO rows x GAS micro steps per
#                    step (default 4 x 32 = 262,144 tokens), activation checkpointing, ZeRO-3, fp32 master
#                    weights and gradients: the first 1-RATIO of the optimizer states (default 28%) on the
#                    GPU, then HOST_GIB GiB (default 78) of them in pinned host memory, the rest on the disk
#                    (offload_optimizer nvme + host_memory_budget + ratio). STEPS steps (default 3); a
#                    zero_trace Chrome trace of step TRACE_STEP (default 3); GPU memory (nvidia-smi, 500 ms),
#                    host memory (free, 1 s) and disk use sampled throughout; ours.meta.json describes the
#                    row for bench/llm_table.py (`llm_table.py OUTDIR [OUTDIR...]`: ours beside DeepSpeed)
#   PHASE deepspeed: bench/llm_peers.py --peer deepspeed_infinity (ZeRO-3, offload_optimizer nvme +
#                    offload_param cpu) on DS_PRESETS (default "qwen3-4b llama-2-13b") in turn, each capped
#                    at DS_LIMIT_S (default 330 s), DS_BATCH rows x DS_GAS (default 128 x 32, as ours), DS_STEPS (default 2)
#   All runs together are bounded by BUDGET_S (default 570 s from the start of `run`).
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.carry/llm
PY=bench/llm_peers.py

case "${1:-}" in
  pack)
    bash bench/run_llm_bench.sh pack || exit 1
    bazel build //bench:aio_bench //bench:pcie_bench || exit 1
    cp -L bazel-bin/bench/aio_bench bazel-bin/bench/pcie_bench "$CARRY/bin/"
    ls "${WHL_DIR:-.whl}"/deepspeed-0.19.8.tar.gz "${WHL_DIR:-.whl}"/libaio*.deb >/dev/null 2>&1 ||
      echo "note: the deepspeed phase needs .whl/ with deepspeed-0.19.8.tar.gz, its wheels and libaio .debs" >&2
    ;;
  config)  # config FILE: writes the tiered config of the ours phase (also used by the dry run here)
    python3 - "${2:?usage: run_llm_largest.sh config FILE}" <<'PY'
import json, os, sys
e = os.environ.get
micro, gas = int(e("MICRO", "4")), int(e("GAS", "32"))
zero = {"stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": e("NVME_DIR", "/root/zero_nvme"), "pin_memory": True,
                              "ratio": float(e("RATIO", "0.72")),
                              "host_memory_budget": int(float(e("HOST_GIB", "78")) * (1 << 30)),
                              "buffer_count": 4},
        "sub_group_size": 134217728}
c = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas, "gradient_clipping": 0.0,
     "bf16": {"enabled": True}, "communication_data_type": "fp32", "steps_per_print": 1000,
     "optimizer": {"type": "AdamW", "params": {"lr": float(e("LR", "1e-4")), "betas": [0.9, 0.95], "eps": 1e-8,
                                               "weight_decay": 0.01}},
     "zero_optimization": zero,
     # 4 io contexts of depth 2: the split this machine's aio sweep put at raw speed (docs/nvme.md)
     "aio": {"queue_depth": 2, "intra_op_parallelism": 4}}
ts = int(e("TRACE_STEP", "3"))
if ts > 0:
    c["zero_trace"] = {"enabled": True, "path": e("TRACE_PATH", "trace.json"), "first_step": ts, "last_step": ts}
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
    ;;
  run)
    out=${2:?usage: run_llm_largest.sh run OUTDIR [PHASE...]}
    shift 2
    phases=("$@")
    [ ${#phases[@]} -gt 0 ] || phases=(floors ours)
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    export LD_LIBRARY_PATH=$PWD/$CARRY/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
    export ZERO_REQUIRE_GPU=1
    B=$PWD/$CARRY/bin
    PRESET=${PRESET:-llama-2-13b}
    NV=${NVME_DIR:-/root/zero_nvme}
    export NVME_DIR=$NV
    SITE=/tmp/site
    start=$(date +%s)
    budget=${BUDGET_S:-570}
    step() {  # step LIMIT_S LOGFILE CMD...: CMD under what is left of the budget (at most LIMIT_S), its
      #         output into LOGFILE and this log, with GPU memory (500 ms), host memory and disk use
      #         (1 s) sampled into LOGFILE's .gpumem and .hostmem
      local limit=$1 log=$2; shift 2
      local left=$((budget - ($(date +%s) - start)))
      [ $left -lt $limit ] && limit=$left
      if [ $limit -lt 5 ]; then echo "=== skipped (BUDGET_S spent): $*" | tee -a "$log"; return 0; fi
      echo "=== $* (limit ${limit}s)"
      local t0=$(date +%s.%N)
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 500 >"${log%.log}.gpumem" 2>/dev/null &
      local gs=$!
      ( while true; do
          echo "$(date +%s) $(free -b | awk '/^Mem:/{print $3, $7}') $(df -B1 --output=used / | tail -1)"
          sleep 1
        done ) >"${log%.log}.hostmem" &
      local hs=$!
      timeout $limit "$@" 2>&1 | tee -a "$log"; local r=${PIPESTATUS[0]}
      kill $gs $hs 2>/dev/null; wait $gs $hs 2>/dev/null
      echo "=== exit $r, $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
      python3 - "${log%.log}" <<'PY'
import sys
p = sys.argv[1]
g = [int(x) for x in open(p + ".gpumem").read().split() if x.strip().isdigit()]
h = [l.split() for l in open(p + ".hostmem") if len(l.split()) == 4]
if g: print(f"=== GPU memory used: {g[0]} MiB before, {max(g)} MiB at most ({max(g) / 1024:.1f} GiB)")
if h:
    used = [int(x[1]) for x in h]; disk = [int(x[3]) for x in h]
    print(f"=== host memory used: {used[0] / 2**30:.1f} GiB before, {max(used) / 2**30:.1f} GiB at most; "
          f"disk used: {disk[0] / 2**30:.1f} GiB before, {max(disk) / 2**30:.1f} GiB at most")
PY
    }
    tokens() {  # tokens PRESET WINDOWS: OUTDIR/tokens_PRESET.bin, random ids below the preset's vocabulary
      local vocab
      vocab=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import llm_peers as l; print(l.PRESETS['$1']['vocab_size'])")
      python3 $PY --make-tokens "$out/tokens_$1.bin" --vocab "$vocab" --seq 2048 --windows "$2"
    }
    {
      date -u
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
      free -g | head -2; nproc; df -h / | tail -1
      for p in "${phases[@]}"; do
        echo "##### phase $p"
        case $p in
          floors)
            mkdir -p "$NV"
            step 40 "$out/floors.log" $B/aio_bench --dir="$NV" --size_mb=4096 --block_sizes=1048576 \
                --queue_depths=2 --threads=4 --reps=1
            step 30 "$out/floors.log" $B/pcie_bench --sizes-mib 256,1024 --reps 3 --warmup 1
            rm -rf "$NV" ;;
          ours)
            micro=${MICRO:-4} gas=${GAS:-32}
            rows=$((micro * gas))
            tokens "$PRESET" $((rows * ${STEPS:-3}))
            rm -rf "$NV" && mkdir -p "$NV"
            TRACE_PATH=$out/trace_ours_step${TRACE_STEP:-3}.json bash bench/run_llm_largest.sh config "$out/ours.json"
            cat "$out/ours.json"
            # The row bench/llm_table.py reads beside ours.jsonl and ours.log (as llm_peers.py --ours writes it)
            python3 - "$out" "$PRESET" "$micro" "$gas" "${STEPS:-3}" <<'PY'
import json, sys
out, preset, micro, gas, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cfg = json.load(open(out + "/ours.json"))
oo = cfg["zero_optimization"]["offload_optimizer"]
meta = {"kind": "ours", "impl": "zero", "name": "tiered",
        "label": f"ours: ZeRO-3, optimizer states {100 * (1 - oo['ratio']):.0f}% GPU / "
                 f"{oo['host_memory_budget'] / 2**30:g} GiB pinned host / rest NVMe",
        "preset": preset, "seq": 2048, "batch": micro * gas, "gas": gas, "tokens_per_step": micro * gas * 2048,
        "steps_planned": steps, "activation_checkpointing": True, "match": "deepspeed_infinity",
        "counterpart": None, "target": None, "jsonl": "ours.jsonl", "log": "ours.log", "config": cfg}
json.dump(meta, open(out + "/ours.meta.json", "w"), indent=1)
PY
            : >"$out/ours.log"
            step 560 "$out/ours.log" stdbuf -oL $B/zero_llm --device cuda --nproc 1 --preset "$PRESET" --seq 2048 \
                --config "$out/ours.json" --steps "${STEPS:-3}" --data "$out/tokens_$PRESET.bin" --sequential-data \
                --holdout 0 --eval-windows 0 --plot none --print-every 1 --activation-checkpointing \
                --log-json "$out/ours.jsonl"
            du -sh "$NV" 2>/dev/null; rm -rf "$NV" ;;
          deepspeed)
            W=${WHL_DIR:-.whl}
            if [ ! -f "$W/deepspeed-0.19.8.tar.gz" ]; then echo "=== no $W/deepspeed-0.19.8.tar.gz: skipped"; continue; fi
            step 60 "$out/ds_install.log" python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$W"/*.whl
            step 90 "$out/ds_install.log" env DS_BUILD_OPS=0 python3 -m pip install --quiet --no-index --no-deps \
                --no-build-isolation --target "$SITE" "$W/deepspeed-0.19.8.tar.gz"
            # DeepSpeed's async_io op JIT-builds against libaio, which the GPU machine lacks: the carried
            # Debian packages, unpacked; CPATH and LIBRARY_PATH because its g++ lines take no CFLAGS
            # (bench/run_offload_h200.sh dsinfinity, run 13).
            AIO=/tmp/libaio && mkdir -p $AIO && for d in "$W"/libaio*.deb; do dpkg -x "$d" $AIO; done
            AL=$AIO/usr/lib/x86_64-linux-gnu
            [ -e $AL/libaio.so ] || ln -sf "$(ls $AL/libaio.so.1* | head -1)" $AL/libaio.so
            for pre in ${DS_PRESETS:-qwen3-4b llama-2-13b}; do
              tok=$out/tokens_$pre.bin
              [ -f "$tok" ] || tokens "$pre" 512
              rm -rf "$NV/ds" && mkdir -p "$NV/ds"
              : >"$out/ds_$pre.log"
              step ${DS_LIMIT_S:-330} "$out/ds_$pre.log" env PYTHONPATH=$SITE TORCH_EXTENSIONS_DIR=/tmp/torch_ext \
                  CPATH=$AIO/usr/include CFLAGS=-I$AIO/usr/include LDFLAGS=-L$AL LIBRARY_PATH=$AL \
                  LD_LIBRARY_PATH=$AL:$LD_LIBRARY_PATH TORCH_CUDA_ARCH_LIST=9.0 \
                  python3 $PY --peer deepspeed_infinity --preset "$pre" --seq 2048 --batch "${DS_BATCH:-128}" \
                  --gas "${DS_GAS:-32}" --steps "${DS_STEPS:-2}" --tokens "$tok" --nvme-path "$NV/ds" \
                  --activation-checkpointing --out "$out/ds_$pre.json"
              du -sh "$NV/ds" 2>/dev/null; rm -rf "$NV/ds"; df -h / | tail -1
            done ;;
          *) echo "unknown phase $p" ;;
        esac
      done
      date -u
    } 2>&1 | tee "$out/largest.log"
    ;;
  *)
    echo "usage: run_llm_largest.sh pack | config FILE | run OUTDIR [floors|ours|deepspeed ...]" >&2
    exit 2 ;;
esac

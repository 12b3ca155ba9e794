#!/usr/bin/env bash
# The transformer benchmark of issue 21: ours (zero_llm) beside PyTorch FSDP2 and DeepSpeed on the same
# model shape and the same token rows, on the GPU machine, in one call (docs/performance.md, "Transformer
# benchmark (issue 21)").
# Here:   bench/run_llm_bench.sh pack      bench/run_llm_h200.sh pack (zero_llm and the libraries the GPU
#                                          machine lacks into .carry/llm/), then the dry run below
#         bench/run_llm_bench.sh dryrun    on the CPU, no GPU: every configuration of ours through
#                                          zero_llm --print-config (flags and config accepted), every peer
#                                          through llm_peers.py --dry-run (no torch needed)
# There:  bash bench/run_llm_bench.sh run OUTDIR [PHASE...]   (device tool: carry [".carry/llm", ".whl"])
#   PHASE tokens:    OUTDIR/tokens.bin: random ids below 128256 (the smallest vocabulary of the presets),
#                    seed 0, 128 windows of seq+1 (llm_peers.py --make-tokens); the other phases make it
#                    when it is missing
#   PHASE ours:      zero_llm --device cuda --nproc 1 per preset and configuration of ours, each with its
#                    config (llm_peers.py --ours): none (ZeRO-3, no offload); cpuadam (offload_optimizer
#                    cpu); cpuadam_param (+ offload_param cpu); cpuadam_r60 / cpuadam_r80 / cpuadam_param_r60 (offload_optimizer
#                    ratio 0.6 / 0.8: partial offload, not in the default list); gpuchunk and gpuoverlap (the chunked GPU
#                    AdamW, overlap_step false and true); gas8_acccpu and gas8_accgpu (the same tokens per
#                    step as micro batch batch/8 x GAS 8, both offloads, offload_grad_accumulation cpu/gpu;
#                    only where the rows per step are a multiple of 8: qwen3-0.6b by default)
#   PHASE fsdp2:     llm_peers.py --peer fsdp2, fsdp2_plain, fsdp2_offload, fsdp2_plain_offload per preset
#                    (transformers' classes, and the same shape as a plain PyTorch model)
#   PHASE deepspeed: installs .whl/ into /tmp/site (DeepSpeed 0.19.8, ../shared/DEVICE.md), then
#                    llm_peers.py --peer deepspeed_z3, deepspeed_z2_offload, deepspeed_z3_offload per preset
#                    (the first offload run builds DeepSpeedCPUAdam with ninja, about 60 s)
#   PHASE table:     bench/llm_table.py OUTDIR -> OUTDIR/table.md
# Default phases: tokens ours fsdp2 deepspeed table.
# Settings (environment): PRESETS (default "qwen3-0.6b"; also e.g. "llama-3.2-3b"), BATCH (rows per
# step; default 8 for qwen3-0.6b = 16384 tokens, 4 for the others = 8192), SEQ (2048), STEPS (6), CLIP
# (gradient clipping, 0 = off, the same on every side), AC=1 (activation checkpointing on every side),
# OURS_CONFIGS, FSDP_PEERS, DS_PEERS (subsets of the lists above), BUDGET_S (default 570: every run gets
# at most what is left of it from the start of `run`, and is skipped under 5 s), WHL_DIR (.whl).
# Results: OUTDIR/ours_<preset>_<config>.{ds.json,meta.json,jsonl,log,gpumem},
# OUTDIR/peer_<preset>_<peer>.{json,log,gpumem} (.gpumem: nvidia-smi's used MiB every 200 ms),
# OUTDIR/llm_bench.log, OUTDIR/table.md. Several calls' folders make one table here:
# python3 bench/llm_table.py DIR1 DIR2 --out table.md
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.carry/llm
PY=bench/llm_peers.py
PRESETS=${PRESETS:-qwen3-0.6b}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-6}
CLIP=${CLIP:-0}
OURS_CONFIGS=${OURS_CONFIGS:-none cpuadam cpuadam_param gpuchunk gpuoverlap gas8_acccpu gas8_accgpu}
FSDP_PEERS=${FSDP_PEERS:-fsdp2 fsdp2_plain fsdp2_offload fsdp2_plain_offload}
DS_PEERS=${DS_PEERS:-deepspeed_z3 deepspeed_z2_offload deepspeed_z3_offload}
ACF=""
[ "${AC:-0}" = 1 ] && ACF="--activation-checkpointing"

batch_of() {  # rows per optimizer step of a preset: the tokens per step of issue 21's anchors
  if [ -n "${BATCH:-}" ]; then echo "$BATCH"; return; fi
  case $1 in qwen3-0.6b|tiny) echo 8 ;; *) echo 4 ;; esac
}

common() {  # common PRESET: llm_peers.py's flags shared by ours and the peers
  echo "--preset $1 --seq $SEQ --batch $(batch_of "$1") --steps $STEPS --clip $CLIP $ACF"
}

configs_of() {  # configs_of PRESET: OURS_CONFIGS less the GAS 8 ones where the rows per step are no multiple of 8
  local c
  for c in $OURS_CONFIGS; do
    case $c in gas8_*) [ $(( $(batch_of "$1") % 8 )) -eq 0 ] || continue ;; esac
    echo "$c"
  done
}

zero_llm_here() {  # the zero_llm the dry run uses: $ZERO_LLM, else the packed one, else Bazel's
  if [ -n "${ZERO_LLM:-}" ]; then echo "$ZERO_LLM"; return; fi
  for z in $CARRY/bin/zero_llm bazel-bin/train/zero_llm; do
    [ -x "$z" ] && { echo "$z"; return; }
  done
  echo none
}

dryrun() {  # dryrun DIR: writes every configuration's files under DIR and checks them on the CPU
  local dir=$1 fails=0 z
  z=$(zero_llm_here)
  mkdir -p "$dir"
  python3 $PY --make-tokens "$dir/tokens.bin" --seq "$SEQ" --windows 64 >/dev/null || return 1
  for p in $PRESETS; do
    for c in $(configs_of "$p"); do
      local flags
      if ! flags=$(python3 $PY --ours "$c" $(common "$p") --tokens "$dir/tokens.bin" --prefix "$dir/ours_${p}_$c" | tail -1); then
        echo "dry run FAILED: ours $c on $p (llm_peers.py --ours)"; fails=$((fails + 1)); continue
      fi
      if [ "$z" = none ]; then
        echo "dry run: ours $c on $p: config written; no zero_llm here to check it (ZERO_LLM=none or not built)"
      elif "$z" --device cpu --nproc 1 $flags --print-config >"$dir/ours_${p}_$c.print_config" 2>&1; then
        echo "dry run ok: ours $c on $p (zero_llm --print-config accepts the flags and the config)"
      else
        echo "dry run FAILED: ours $c on $p: $(tail -2 "$dir/ours_${p}_$c.print_config")"; fails=$((fails + 1))
      fi
    done
    for peer in $FSDP_PEERS $DS_PEERS; do
      if python3 $PY --peer "$peer" $(common "$p") --tokens "$dir/tokens.bin" --out "$dir/peer_${p}_$peer.json" \
          --dry-run >"$dir/peer_${p}_$peer.dry" 2>&1; then
        echo "dry run ok: $peer on $p"
      else
        echo "dry run FAILED: $peer on $p: $(tail -2 "$dir/peer_${p}_$peer.dry")"; fails=$((fails + 1))
      fi
    done
  done
  echo "dry run: $fails failure(s)"
  [ $fails -eq 0 ]
}

case "${1:-}" in
  pack)
    bash bench/run_llm_h200.sh pack || exit 1
    d=$(mktemp -d /tmp/llm_bench_dry.XXXXXX)
    PRESETS="qwen3-0.6b llama-3.2-3b" dryrun "$d" || exit 1
    rm -rf "$d"
    ls "${WHL_DIR:-.whl}/deepspeed-0.19.8.tar.gz" >/dev/null 2>&1 ||
      echo "note: no ${WHL_DIR:-.whl}/deepspeed-0.19.8.tar.gz here: the deepspeed phase needs .whl/ (the wheels of" \
           "../shared/DEVICE.md), carried with .carry/llm" >&2
    ;;
  dryrun)
    d=${2:-$(mktemp -d /tmp/llm_bench_dry.XXXXXX)}
    dryrun "$d"
    ;;
  run)
    out=${2:?usage: run_llm_bench.sh run OUTDIR [PHASE...]}
    shift 2
    phases=("$@")
    [ ${#phases[@]} -gt 0 ] || phases=(tokens ours fsdp2 deepspeed table)
    mkdir -p "$out"
    export LD_LIBRARY_PATH=$PWD/$CARRY/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
    export ZERO_REQUIRE_GPU=1
    B=$PWD/$CARRY/bin
    SITE=/tmp/site  # the deepspeed phase's install target
    start=$(date +%s)
    budget=${BUDGET_S:-570}
    step() {  # step LIMIT_S LOGFILE CMD...: CMD with what is left of the budget (at most LIMIT_S), its
      #         output into LOGFILE and this log. With SAMPLE=1: the GPU's used memory every 200 ms
      #         (nvidia-smi, MiB, the first line before CMD starts) into LOGFILE's .gpumem, which
      #         llm_table.py turns into "GPU used" (context and allocator caches included, every side alike)
      local limit=$1 log=$2; shift 2
      local left=$((budget - ($(date +%s) - start)))
      [ $left -lt $limit ] && limit=$left
      if [ $limit -lt 5 ]; then echo "=== skipped (BUDGET_S spent): $*" | tee -a "$log"; return 0; fi
      echo "=== $* (limit ${limit}s)"
      local t0=$(date +%s.%N) sampler=""
      if [ "${SAMPLE:-0}" = 1 ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >"${log%.log}.gpumem" 2>/dev/null
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 >>"${log%.log}.gpumem" 2>/dev/null &
        sampler=$!
      fi
      timeout $limit "$@" 2>&1 | tee -a "$log"; local r=${PIPESTATUS[0]}
      [ -n "$sampler" ] && { kill $sampler 2>/dev/null; wait $sampler 2>/dev/null; }
      echo "=== exit $r, $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
    }
    tokens() {
      python3 $PY --make-tokens "$out/tokens.bin" --seq "$SEQ" --windows "${TOKEN_WINDOWS:-128}"
    }
    ds_install() {  # DeepSpeed 0.19.8 and its wheels into $SITE (../shared/DEVICE.md); 1 if .whl/ lacks it
      local W=${WHL_DIR:-.whl}
      if [ ! -f "$W/deepspeed-0.19.8.tar.gz" ]; then
        echo "=== deepspeed: no $W/deepspeed-0.19.8.tar.gz (carry .whl/, ../shared/DEVICE.md); phase skipped"
        return 1
      fi
      step 60 "$out/ds_install.log" python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$W"/*.whl
      step 90 "$out/ds_install.log" env DS_BUILD_OPS=0 python3 -m pip install --quiet --no-index --no-deps \
          --no-build-isolation --target "$SITE" "$W/deepspeed-0.19.8.tar.gz"
    }
    {
      date -u
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
      free -g | head -2; nproc
      echo "PRESETS=$PRESETS SEQ=$SEQ STEPS=$STEPS CLIP=$CLIP AC=${AC:-0} BUDGET_S=$budget"
      for p in "${phases[@]}"; do
        echo "##### phase $p"
        [ "$p" != table ] && [ "$p" != tokens ] && [ ! -f "$out/tokens.bin" ] && tokens
        case $p in
          tokens) tokens ;;
          ours)
            for pre in $PRESETS; do
              lim=150; [ "$pre" = qwen3-0.6b ] || lim=240
              for c in $(configs_of "$pre"); do
                pfx=$out/ours_${pre}_$c
                if ! flags=$(python3 $PY --ours "$c" $(common "$pre") --tokens "$out/tokens.bin" --prefix "$pfx" | tail -1); then
                  echo "=== ours $c on $pre: llm_peers.py --ours failed"; continue
                fi
                : >"$pfx.log"
                SAMPLE=1 step $lim "$pfx.log" stdbuf -oL "$B/zero_llm" --device cuda --nproc 1 $flags
              done
            done ;;
          fsdp2|deepspeed)
            env_=()
            peers=$FSDP_PEERS
            if [ $p = deepspeed ]; then
              ds_install || continue
              env_=(env PYTHONPATH=$SITE TORCH_EXTENSIONS_DIR=/tmp/torch_ext)
              peers=$DS_PEERS
            fi
            for pre in $PRESETS; do
              for peer in $peers; do
                pfx=$out/peer_${pre}_$peer
                : >"$pfx.log"
                SAMPLE=1 step 240 "$pfx.log" "${env_[@]}" python3 $PY --peer "$peer" $(common "$pre") \
                    --tokens "$out/tokens.bin" --out "$pfx.json"
              done
            done ;;
          table) python3 bench/llm_table.py "$out" ;;
          *) echo "unknown phase $p (tokens ours fsdp2 deepspeed table)" ;;
        esac
      done
      date -u
    } 2>&1 | tee "$out/llm_bench.log"
    ;;
  *)
    echo "usage: $0 pack | dryrun [DIR] | run OUTDIR [tokens|ours|fsdp2|deepspeed|table ...]" >&2
    exit 2
    ;;
esac

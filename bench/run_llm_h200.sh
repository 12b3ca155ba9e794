#!/usr/bin/env bash
# The transformer's runs on the GPU machine (docs/llm.md, docs/gpu.md), in one call.
# Here:   bench/run_llm_h200.sh pack     builds cuda_model_test, zero_llm and gpu_equivalence and copies them
#                                        with the shared libraries the GPU machine lacks into .carry/llm/
# There:  bash bench/run_llm_h200.sh run OUTDIR [PHASE...]   (device tool: carry [".carry/llm"])
#   PHASE kernels:  cuda_model_test: every kernel and the whole CUDA model against the CPU model
#   PHASE profile:  llm_cuda_bench (model only, no engine) on qwen3-0.6b: tokens/s and the device time of
#                   each operation with cuDNN's attention (PROFILE_ATTENTION="kernel cudnn" adds the
#                   model's own kernels), at seq 2048 and 512
#   PHASE breakdown: zero_llm on qwen3-0.6b (16384 tokens per step) with wall_clock_breakdown and a
#                   zero_trace Chrome trace of step 3: no offload, and the optimizer offloaded (CPU AdamW)
#   PHASE trace:    the zero_trace Chrome trace of step 3 alone (no breakdown timers, so nothing is
#                   serialized) with the optimizer offloaded into pinned memory (pin_memory true, as in
#                   run_llm_bench.sh; run 7 traced the unpinned default): OUTDIR/trace_cpuadam_step3.json
#   PHASE equiv:    gpu_equivalence at world 1, then --world 2, 4, 8 (ranks as threads on the one GPU)
#   PHASE hf:       bench/llm_hf_compare.py: the same HF directory and tokens in transformers and zero_llm
#                   (step-1 loss, 100 AdamW steps, our export loaded by from_pretrained)
#   PHASE speed:    zero_llm --device cuda on qwen3-0.6b at 16384 tokens per step (no offload), then with
#                   the optimizer offloaded (CPU AdamW): tokens/s, model TFLOPS, MFU, peak memory
#   PHASE validate: on qwen3-0.6b with optimizer + parameter offload: (i) reverse-text SFT, GAS 4, 10 steps,
#                   offload_grad_accumulation cpu vs gpu; (ii) the chunked GPU AdamW with overlap_step on
#                   vs off, 6 steps, clipping and weight decay: the per-step losses and a hash of the fp32
#                   master weights, which must be equal (validate1: (i) only)
#   PHASE heads:    validations (i) and (iii) with an extra output head (zero_llm --extra-heads 1), both offloads,
#                   GAS 4: (i) the extra head used only in micro step 0 (--heads first-micro), reverse-text SFT,
#                   10 steps, offload_grad_accumulation cpu vs gpu; (iii) the model's own head and the extra
#                   head alternating between windows (--heads alternate), 6 steps, managed vs unmanaged
#                   accumulation: per-step losses and master-weight hashes, which must be equal
#   PHASE rope:     bench/llm_rope_compare.py: Llama 3 rope_scaling, zero_llm vs transformers (fp32)
#   PROFILE_PRESETS (default qwen3-0.6b) and PROFILE_BATCH (default 8) set the profile phase's model runs
# All runs together are bounded by BUDGET_S (default 560 s from the start of `run`).
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.carry/llm

case "${1:-}" in
  pack)
    bazel build //models/llama:cuda_model_test //train:zero_llm //bench:llm_cuda_bench \
                //tests/equivalence:gpu_equivalence || exit 1
    rm -rf "$CARRY" && mkdir -p "$CARRY/bin" "$CARRY/lib"
    cp -L bazel-bin/models/llama/cuda_model_test bazel-bin/train/zero_llm bazel-bin/bench/llm_cuda_bench \
          bazel-bin/tests/equivalence/gpu_equivalence "$CARRY/bin/"
    for lib in /usr/lib/libgloo.so.0 $(ldd /usr/lib/libgloo.so.0 | awk '/=> \//{print $3}' | grep -E 'hiredis|ibverbs|libnl') \
               /usr/lib/x86_64-linux-gnu/libnuma.so.1 /usr/lib/x86_64-linux-gnu/libaio.so.1 /usr/lib/x86_64-linux-gnu/libcrypto.so.3; do
      cp -L "$lib" "$CARRY/lib/"
    done
    du -sh "$CARRY"
    ;;
  run)
    out=${2:?usage: run_llm_h200.sh run OUTDIR [PHASE...]}
    shift 2
    phases=("$@")
    [ ${#phases[@]} -gt 0 ] || phases=(kernels equiv hf speed validate)
    mkdir -p "$out"
    export LD_LIBRARY_PATH=$PWD/$CARRY/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
    export ZERO_REQUIRE_GPU=1
    B=$PWD/$CARRY/bin
    start=$(date +%s)
    budget=${BUDGET_S:-560}
    step() {  # step LIMIT_S CMD...: runs CMD with what is left of the budget, at most LIMIT_S
      local limit=$1; shift
      local left=$((budget - ($(date +%s) - start)))
      [ $left -lt $limit ] && limit=$left
      if [ $limit -lt 5 ]; then echo "=== skipped (budget): $*"; return; fi
      echo "=== $* (limit ${limit}s)"
      local t0=$(date +%s.%N)
      timeout $limit "$@"; local r=$?
      echo "=== exit $r, $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
    }
    Q="--device cuda --nproc 1 --preset qwen3-0.6b --seq 2048 --corpus-bytes 8000000 --plot none --eval-windows 0"
    ds() {  # ds FILE KEY=JSON...: writes a config for qwen3-0.6b runs
      python3 - "$@" <<'PY'
import json, sys
path, extra = sys.argv[1], sys.argv[2:]
c = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
     "bf16": {"enabled": True}, "steps_per_print": 1,
     "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
     "zero_optimization": {"stage": 3}}
for kv in extra:
    k, v = kv.split("=", 1)
    node = c
    keys = k.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = json.loads(v)
json.dump(c, open(path, "w"), indent=1)
PY
    }
    {
      date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      for p in "${phases[@]}"; do
        echo "##### phase $p"
        case $p in
          kernels) step 120 $B/cuda_model_test ;;
          profile)
            for pp in ${PROFILE_PRESETS:-qwen3-0.6b}; do
              for a in ${PROFILE_ATTENTION:-cudnn}; do
                step 90 $B/llm_cuda_bench --preset=$pp --seq=2048 --batch=${PROFILE_BATCH:-8} --steps=5 --attention=$a --profile
              done
            done
            [ -z "${PROFILE_PRESETS:-}" ] && step 90 $B/llm_cuda_bench --preset=qwen3-0.6b --seq=512 --batch=32 --steps=5 --attention=cudnn --profile ;;
          breakdown)
            for cfg in none cpuadam; do
              extra=()
              [ $cfg = cpuadam ] && extra=('zero_optimization.offload_optimizer={"device": "cpu", "pin_memory": true}')
              ds "$out/wcb_$cfg.json" wall_clock_breakdown=true steps_per_print=1 "${extra[@]}" \
                 "zero_trace={\"enabled\": true, \"path\": \"$out/trace_$cfg.json\", \"first_step\": 3, \"last_step\": 3}"
              step 90 $B/zero_llm $Q --corpus-bytes 2000000 --config "$out/wcb_$cfg.json" --steps 5 \
                   --log-json "$out/wcb_$cfg.jsonl"
            done ;;
          trace)
            ds "$out/trace_cpuadam.json.cfg" steps_per_print=1 'zero_optimization.offload_optimizer={"device": "cpu", "pin_memory": true}' \
               "zero_trace={\"enabled\": true, \"path\": \"$out/trace_cpuadam_step3.json\", \"first_step\": 3, \"last_step\": 3}"
            step 90 $B/zero_llm $Q --corpus-bytes 2000000 --config "$out/trace_cpuadam.json.cfg" --steps 4 ;;
          equiv)
            step 120 $B/gpu_equivalence
            for w in 2 4 8; do step 120 $B/gpu_equivalence --world $w --comm same_device; done ;;
          hf) step 240 python3 bench/llm_hf_compare.py --zero-llm $B/zero_llm --out "$out/hf" ;;
          speed)
            ds "$out/s3.json"
            step 90 $B/zero_llm $Q --config "$out/s3.json" --steps 6 --log-json "$out/speed_s3.jsonl"
            ds "$out/s3_ckpt.json"
            step 90 $B/zero_llm $Q --config "$out/s3_ckpt.json" --steps 6 --activation-checkpointing \
                 --log-json "$out/speed_s3_ckpt.jsonl"
            ds "$out/s3_cpuadam.json" 'zero_optimization.offload_optimizer={"device": "cpu"}'
            step 120 $B/zero_llm $Q --config "$out/s3_cpuadam.json" --steps 6 --log-json "$out/speed_cpuadam.jsonl" ;;
          validate|validate1)
            for acc in cpu gpu; do
              ds "$out/v1_$acc.json" train_micro_batch_size_per_gpu=2 gradient_accumulation_steps=4 \
                 'zero_optimization.offload_optimizer={"device": "cpu"}' 'zero_optimization.offload_param={"device": "cpu", "buffer_size": 200000000}' \
                 "zero_optimization.offload_grad_accumulation=\"$acc\""
              step 120 $B/zero_llm $Q --corpus-bytes 2000000 --seq 512 --task reverse-text --config "$out/v1_$acc.json" --steps 10 \
                   --hash-weights --log-json "$out/v1_$acc.jsonl"
            done
            [ $p = validate1 ] && { for f in v1_cpu v1_gpu; do echo "$f: $(python3 -c "import json;print([round(json.loads(l)['loss'],6) for l in open('$out/$f.jsonl')])" 2>&1)"; done; continue; }
            for ov in false true; do
              ds "$out/v2_$ov.json" gradient_clipping=1.0 \
                 "zero_optimization.offload_optimizer={\"device\": \"cpu\", \"update_device\": \"gpu\", \"overlap_step\": $ov}"
              step 120 $B/zero_llm $Q --corpus-bytes 2000000 --seq 1024 --config "$out/v2_$ov.json" --steps 6 --hash-weights \
                   --log-json "$out/v2_$ov.jsonl"
            done
            for f in v1_cpu v1_gpu v2_false v2_true; do echo "$f: $(python3 -c "import json;print([round(json.loads(l)['loss'],6) for l in open('$out/$f.jsonl')])" 2>&1)"; done ;;
          heads)
            OFF=('zero_optimization.offload_optimizer={"device": "cpu"}' 'zero_optimization.offload_param={"device": "cpu", "buffer_size": 200000000}')
            for acc in cpu gpu; do
              ds "$out/h1_$acc.json" train_micro_batch_size_per_gpu=2 gradient_accumulation_steps=4 "${OFF[@]}" \
                 "zero_optimization.offload_grad_accumulation=\"$acc\""
              step 120 $B/zero_llm $Q --corpus-bytes 2000000 --seq 512 --task reverse-text --config "$out/h1_$acc.json" --steps 10 \
                   --extra-heads 1 --heads first-micro --hash-weights --log-json "$out/h1_$acc.jsonl"
            done
            for mg in true false; do
              ds "$out/h3_$mg.json" train_micro_batch_size_per_gpu=2 gradient_accumulation_steps=4 "${OFF[@]}" \
                 managed_gradient_accumulation=$mg
              step 120 $B/zero_llm $Q --corpus-bytes 2000000 --seq 512 --task reverse-text --config "$out/h3_$mg.json" --steps 6 \
                   --extra-heads 1 --heads alternate --hash-weights --log-json "$out/h3_$mg.jsonl"
            done
            for f in h1_cpu h1_gpu h3_true h3_false; do echo "$f: $(python3 -c "import json;print([round(json.loads(l)['loss'],6) for l in open('$out/$f.jsonl')])" 2>&1)"; done ;;
          rope) step 120 python3 bench/llm_rope_compare.py --zero-llm $B/zero_llm --out "$out/rope" ;;
          *) echo "unknown phase $p" ;;
        esac
      done
      date -u
    } 2>&1 | tee "$out/llm_h200.log"
    ;;
  *)
    echo "usage: $0 pack | run OUTDIR [PHASE...]" >&2
    exit 2
    ;;
esac

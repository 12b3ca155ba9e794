#!/usr/bin/env bash
# Our engine beside PyTorch FSDP2 on the same job, in one go (docs/performance.md).
# Here:   bench/run_fsdp_compare.sh pack [--head]   builds //bench:mlp_bench and copies it with the
#                                   shared libraries the GPU machine lacks into .carry/bench/. --head
#                                   builds the committed tree (git archive HEAD, plus this bench/) in
#                                   /tmp/zero_bench_head, leaving out uncommitted work elsewhere.
# There:  bash bench/run_fsdp_compare.sh run OUTDIR   (device tool: carry [".carry/bench"])
#         runs ours (mlp_bench), then PyTorch's (fsdp2_reference.py), and writes OUTDIR/fsdp_compare.log
#         and OUTDIR/fsdp_compare.md (the table, also printed last).
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.carry/bench

case "${1:-}" in
  pack)
    set -e
    src=$PWD
    if [ "${2:-}" = "--head" ]; then
      src=/tmp/zero_bench_head
      rm -rf "$src" && mkdir -p "$src"
      git archive HEAD | tar -x -C "$src"
      rm -rf "$src/bench" && cp -r bench "$src/bench"
      echo "building commit $(git rev-parse --short HEAD) + bench/ in $src"
    fi
    (cd "$src" && bazel build //bench:mlp_bench)
    rm -rf "$CARRY" && mkdir -p "$CARRY/bin" "$CARRY/lib"
    cp -L "$src/bazel-bin/bench/mlp_bench" "$CARRY/bin/"
    for lib in /usr/lib/libgloo.so.0 $(ldd /usr/lib/libgloo.so.0 | awk '/=> \//{print $3}' | grep -E 'hiredis|ibverbs|libnl') \
               /usr/lib/x86_64-linux-gnu/libaio.so.1 /usr/lib/x86_64-linux-gnu/libcrypto.so.3; do
      cp -L "$lib" "$CARRY/lib/"
    done
    "$CARRY/bin/mlp_bench" --dry-run >/dev/null
    du -sh "$CARRY"
    ;;
  run)
    out=${2:?usage: run_fsdp_compare.sh run OUTDIR}
    mkdir -p "$out"
    export LD_LIBRARY_PATH=$PWD/$CARRY/lib:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
    log=$out/fsdp_compare.log
    B=$CARRY/bin/mlp_bench
    rc=0
    ours_hung=0
    ours() {  # LABEL ARGS...: one mlp_bench run, skipped after an earlier one hung
      if [ $ours_hung -eq 1 ]; then echo "=== skipped (an earlier run timed out): $*"; rc=1; return; fi
      echo "=== mlp_bench $*"
      local t0=$(date +%s)
      timeout 75 "$B" "$@"; local r=$?
      echo "=== exit $r, $(( $(date +%s) - t0 )) s"
      [ $r -eq 124 ] && ours_hung=1
      [ $r -eq 0 ] || rc=1
    }
    {
      date -u
      nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader
      ours --stage 3 --label stage3
      ours --stage 0 --label stage0
      ours --impl none --label compute
      ours --stage 3 --label stage3 --tokens 65536
      ours --stage 3 --label stage3  # a repeat: the run-to-run spread
      echo "=== fsdp2_reference.py"
      t0=$(date +%s)
      timeout 150 python3 bench/fsdp2_reference.py --config fsdp2 --config fsdp2_noreshard --config plain \
          --config fsdp2@65536 --config fsdp2; r=$?
      echo "=== exit $r, $(( $(date +%s) - t0 )) s"
      [ $r -eq 0 ] || rc=1
      exit $rc  # the braces run in a subshell (the pipeline): hand rc out through the exit status
    } 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    python3 bench/fsdp_table.py "$log" | tee "$out/fsdp_compare.md"
    [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
    exit $rc
    ;;
  *)
    echo "usage: bench/run_fsdp_compare.sh pack | run OUTDIR" >&2
    exit 2
    ;;
esac

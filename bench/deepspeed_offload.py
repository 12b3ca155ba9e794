#!/usr/bin/env python3
"""DeepSpeed 0.19.8 on the 1.07B job, the live peer of docs/performance.md's offload table (issues 8, 11).

The same model, weights and batch as bench/mlp_bench and bench/fsdp2_reference.py (its model code is
imported: fsdp2_reference.build_model, hash_uniform, INPUT_STREAM): 8 residual blocks of
Linear(4096, 16384) -> ReLU -> Linear(16384, 4096), loss = mean(out^2) in fp32, bf16 parameters
with fp32 master weights (DeepSpeed's "bf16": {"enabled": true}), AdamW lr 1e-4, betas (0.9, 0.999),
eps 1e-8, weight decay 0.01, gradient_clipping 0 unless --clip, one process of world size 1 over NCCL.

Configurations (--config, one per process: DeepSpeed engines do not come apart cleanly in one):
  ds_z3                ZeRO-3, no offload, torch.optim.AdamW on the GPU ("torch_adam": true: FusedAdam
                       would JIT-build with nvcc)
  ds_z2_offload        ZeRO-2, offload_optimizer cpu (DeepSpeedCPUAdam, JIT-built with ninja on first use)
  ds_z3_offload        ZeRO-3, offload_optimizer cpu
  ds_z3_offload_param  ZeRO-3, offload_optimizer cpu + offload_param cpu
  ds_z3_nvme           ZeRO-3, offload_optimizer nvme under --nvme-path (ZeRO-Infinity's optimizer side:
                       buffer_count 4, no pipelining: pipeline_read/write crash in 0.19.8, DEVICE.md);
                       needs DeepSpeed's async_io op, so libaio (bench/run_offload_h200.sh, dsinfinity)

Each optimizer step is --gas micro steps (DeepSpeed's engine.backward and engine.step per micro step;
the step applies at the boundary). Prints one line in mlp_bench's format (bench/fsdp_table.py reads it):
  BENCH impl=deepspeed config=.. tokens=.. params=.. steps=.. init_s=.. fwd_s=.. fwd_bwd_s=.. step_s=..
        peak_gib=.. gpu_used_gib=.. loss_first=.. loss_last=.. gas=.. clip=..
Times per optimizer step: median over steps 2..N of wall time after torch.cuda.synchronize(); fwd_s by
CUDA events, summed over the micro steps; fwd_bwd_s includes the off-boundary engine.step() calls;
step_s is the boundary engine.step(); peak_gib: torch.cuda.max_memory_allocated() over the timed steps.

Running it (../shared/DEVICE.md): the wheels of .whl/ installed with --target /tmp/site and
PYTHONPATH=/tmp/site (bench/run_offload_h200.sh, phase deepspeed, does both). --dry-run prints the
DeepSpeed config and imports nothing (works without torch or deepspeed). Importing this file needs
only the standard library.
"""

import argparse
import json
import os
import statistics
import sys
import time

CONFIGS = ("ds_z3", "ds_z2_offload", "ds_z3_offload", "ds_z3_offload_param", "ds_z3_nvme")


def ds_config(name, args):
    """The DeepSpeed config of configuration `name` (DeepSpeed's defaults for everything not named)."""
    if name not in CONFIGS:
        raise ValueError(f"deepspeed_offload: unknown config {name!r} (expected one of {', '.join(CONFIGS)})")
    stage = 2 if name.startswith("ds_z2") else 3
    zero = {"stage": stage}
    opt_params = {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": args.weight_decay}
    if "offload" in name:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    elif name.endswith("_nvme"):
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": args.nvme_path, "pin_memory": True,
                                     "buffer_count": 4}
    else:
        opt_params["torch_adam"] = True
    if name.endswith("_param"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": args.gas,
        "gradient_clipping": args.clip,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": opt_params},
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, choices=CONFIGS)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gas", type=int, default=1)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--nvme-path", default="/root/zero_nvme/ds", help="ds_z3_nvme: DeepSpeed's swap folder")
    ap.add_argument("--label", default="", help="config= in the BENCH line (default: --config)")
    ap.add_argument("--dry-run", action="store_true", help="print the DeepSpeed config, import nothing")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (step 1 is not timed)")
    if args.gas < 1:
        ap.error("--gas must be >= 1")
    if args.clip < 0:
        ap.error("--clip must be >= 0")
    return args


def import_peers():
    """torch, deepspeed and fsdp2_reference (the shared model code), or exit 2 naming what is missing."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import torch  # noqa: F401
    except ImportError as e:
        sys.exit(f"deepspeed_offload: PyTorch is not importable here ({e}); run it on the GPU machine")
    try:
        import deepspeed
    except ImportError as e:
        sys.exit("deepspeed_offload: DeepSpeed is not importable (" + str(e) + "). Install the carried wheels "
                 "first (../shared/DEVICE.md): pip install --no-index --no-deps --target /tmp/site .whl/*.whl; "
                 "DS_BUILD_OPS=0 pip install --no-index --no-deps --no-build-isolation --target /tmp/site "
                 ".whl/deepspeed-0.19.8.tar.gz; then PYTHONPATH=/tmp/site (bench/run_offload_h200.sh run OUT deepspeed)")
    import fsdp2_reference as ref
    return torch, deepspeed, ref


def main(argv=None):
    args = parse_args(argv)
    name = args.config
    cfg = ds_config(name, args)
    if args.dry_run:
        print(f"# {name}: {json.dumps(cfg, sort_keys=True)}")
        print("dry run ok")
        return 0
    torch, deepspeed, ref = import_peers()
    if not torch.cuda.is_available():
        print("deepspeed_offload: no CUDA device", file=sys.stderr)
        return 1
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", str(29500 + os.getpid() % 1000))):
        os.environ.setdefault(k, v)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    deepspeed.init_distributed(dist_backend="nccl")
    print(f"# deepspeed {deepspeed.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(device)}",
          flush=True)
    print(f"# {name}: {json.dumps(cfg, sort_keys=True)}", flush=True)

    torch.cuda.synchronize()
    t_start = time.perf_counter()
    model = ref.build_model(args, device)  # fp32, mlp_bench's values
    nparams = sum(p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    del model
    x = ref.hash_uniform(ref.INPUT_STREAM, args.tokens * args.dim, 1.0, device).view(args.tokens, args.dim)
    x = x.to(torch.bfloat16)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t_start
    print(f"# optimizer: {type(engine.optimizer).__name__} over "
          f"{type(getattr(engine.optimizer, 'optimizer', engine.optimizer)).__name__}; init {init_s:.1f} s", flush=True)
    torch.cuda.reset_peak_memory_stats()

    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)
    fwd, fwd_bwd, step, losses = [], [], [], []
    for s in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fwd_s = 0.0
        for micro in range(args.gas):
            ev0.record()
            out = engine(x)
            loss = out.float().pow(2).mean()
            ev1.record()
            engine.backward(loss)
            ev1.synchronize()
            fwd_s += ev0.elapsed_time(ev1) / 1e3
            if micro + 1 < args.gas:
                engine.step()  # off the boundary: DeepSpeed only counts the micro step
            last = loss.detach()
            del out, loss
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        fwd.append(fwd_s)
        fwd_bwd.append(t1 - t0)
        step.append(t2 - t1)
        losses.append(last.item())
        print(f"# step {s + 1}: fwd {fwd[-1]:.4f} s, fwd+bwd {fwd_bwd[-1]:.4f} s, step {step[-1]:.4f} s, "
              f"loss {losses[-1]:.6g}", flush=True)
    free_b, total_b = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_allocated()
    label = args.label or name
    print(f"BENCH impl=deepspeed config={label} tokens={args.tokens} params={nparams} steps={args.steps} "
          f"init_s={init_s:.2f} fwd_s={statistics.median(fwd[1:]):.4f} "
          f"fwd_bwd_s={statistics.median(fwd_bwd[1:]):.4f} step_s={statistics.median(step[1:]):.4f} "
          f"peak_gib={ref.gib(peak):.2f} gpu_used_gib={ref.gib(total_b - free_b):.2f} "
          f"loss_first={losses[0]:.6g} loss_last={losses[-1]:.6g} gas={args.gas} clip={args.clip:g}", flush=True)
    try:
        torch.distributed.destroy_process_group()
    except Exception:  # noqa: BLE001 - the numbers are out; teardown is best effort
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The PyTorch FSDP2 side of bench/run_fsdp_compare.sh (docs/performance.md).

The job of ../shared/DEVICE.md's FSDP2 reference, and the same model and data as bench/mlp_bench:
a stack of residual blocks x + fc2(relu(fc1(x))) (fc1: Linear(dim, ffn), fc2: Linear(ffn, dim),
with bias), loss = mean(out^2) in fp32, synthetic input, fp32 parameters sharded by fully_shard
(each block, then the root) over a one-rank NCCL process group, with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), and torch.optim.AdamW(fused=True).

Parameters and input use mlp_bench's hash values bit for bit (HashUniform in bench/mlp_cuda.h),
so the two implementations start from the same weights and see the same batch: their losses
should agree to bf16 rounding.

Configurations (--config, repeatable; NAME@TOKENS overrides --tokens for that one):
  fsdp2            fully_shard with reshard_after_forward=True (the DEVICE.md reference)
  fsdp2_noreshard  reshard_after_forward=False (parameters stay gathered from forward to backward)
  plain            no FSDP: bf16 parameters, forward+backward only, no optimizer (compute floor)

Prints one line per configuration in mlp_bench's format:
  BENCH impl=torch config=.. tokens=.. params=.. steps=.. init_s=.. fwd_s=.. fwd_bwd_s=.. step_s=..
        peak_gib=.. gpu_used_gib=.. loss_first=.. loss_last=..
Times: median over steps 2..N of wall time after torch.cuda.synchronize(); fwd_s by CUDA events;
peak_gib: torch.cuda.max_memory_allocated() over the timed steps; gpu_used_gib: used device
memory (torch.cuda.mem_get_info) after the last step, context and allocator cache included.
"""

import argparse
import gc
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # older spellings of FSDP2
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

MASK32 = 0xFFFFFFFF
INPUT_STREAM = 1000


def mul32(x, c):
    """(x * c) mod 2^32 for an int64 tensor x in [0, 2^32) without int64 overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def mix32(x):
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def mix32_int(x):
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def hash_key(stream):
    return mix32_int((stream * 0x9E3779B9 + 0x632BE5AB) & MASK32)


def hash_uniform(stream, n, bound, device, chunk=1 << 26):
    """fp32 values (2u - 1) * bound, u = (mix32(i ^ key) >> 8) / 2^24: HashUniform of mlp_cuda.h."""
    key = hash_key(stream)
    out = torch.empty(n, dtype=torch.float32, device=device)
    for begin in range(0, n, chunk):
        end = min(n, begin + chunk)
        i = torch.arange(begin, end, dtype=torch.int64, device=device)
        u = (mix32(i ^ key) >> 8).to(torch.float32) * (1.0 / 16777216.0)
        out[begin:end] = (u * 2.0 - 1.0) * bound
    return out


class Block(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.fc1 = nn.Linear(dim, ffn, device="meta")
        self.fc2 = nn.Linear(ffn, dim, device="meta")

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, dim, ffn, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, ffn) for _ in range(blocks))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def build_model(args, device):
    """fp32 parameters with mlp_bench's values: parameter index 4l+j (fc1.weight, fc1.bias,
    fc2.weight, fc2.bias), bound 1/sqrt(fan_in)."""
    model = Stack(args.dim, args.ffn, args.blocks).to_empty(device=device)
    with torch.no_grad():
        for l, b in enumerate(model.blocks):
            for j, (lin, fan_in) in enumerate(((b.fc1, args.dim), (b.fc2, args.ffn))):
                bound = 1.0 / math.sqrt(fan_in)  # a power of two here: exact in fp32
                for k, p in enumerate((lin.weight, lin.bias)):
                    idx = 4 * l + 2 * j + k
                    p.copy_(hash_uniform(idx, p.numel(), bound, device).view_as(p))
    return model


def gib(b):
    return b / float(1 << 30)


def run_config(name, tokens, args, device):
    torch.cuda.synchronize()
    t_start = time.perf_counter()
    model = build_model(args, device)
    nparams = sum(p.numel() for p in model.parameters())
    opt = None
    if name == "plain":
        model = model.to(torch.bfloat16)
    elif name in ("fsdp2", "fsdp2_noreshard", "fsdp2_offload"):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        reshard = name != "fsdp2_noreshard"
        kw = {}
        if name == "fsdp2_offload":
            # Parameters, gradients and the optimizer step on the CPU (pinned), as DEVICE.md measured.
            from torch.distributed.fsdp import CPUOffloadPolicy
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        for b in model.blocks:
            fully_shard(b, mp_policy=mp, reshard_after_forward=reshard, **kw)
        fully_shard(model, mp_policy=mp, reshard_after_forward=reshard, **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=args.weight_decay, fused=True)
    else:
        raise SystemExit(f"fsdp2_reference: unknown config {name!r}")
    x = hash_uniform(INPUT_STREAM, tokens * args.dim, 1.0, device).view(tokens, args.dim)
    x = x.to(torch.bfloat16)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t_start
    torch.cuda.reset_peak_memory_stats()

    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)
    fwd, fwd_bwd, step, losses = [], [], [], []
    for s in range(args.steps):
        if opt is None:
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ev0.record()
        out = model(x)
        loss = out.float().pow(2).mean()
        ev1.record()
        loss.backward()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        fwd.append(ev0.elapsed_time(ev1) / 1e3)
        fwd_bwd.append(t1 - t0)
        step.append(t2 - t1)
        losses.append(loss.item())
        del out, loss
        print(f"# step {s + 1}: fwd {fwd[-1]:.4f} s, fwd+bwd {fwd_bwd[-1]:.4f} s, step {step[-1]:.4f} s, "
              f"loss {losses[-1]:.6g}", flush=True)
    free_b, total_b = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_allocated()
    print(f"BENCH impl=torch config={name} tokens={tokens} params={nparams} steps={args.steps} "
          f"init_s={init_s:.2f} fwd_s={statistics.median(fwd[1:]):.4f} "
          f"fwd_bwd_s={statistics.median(fwd_bwd[1:]):.4f} step_s={statistics.median(step[1:]):.4f} "
          f"peak_gib={gib(peak):.2f} gpu_used_gib={gib(total_b - free_b):.2f} "
          f"loss_first={losses[0]:.6g} loss_last={losses[-1]:.6g}", flush=True)
    del model, opt, x
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", help="fsdp2 | fsdp2_noreshard | fsdp2_offload | plain (repeatable)")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2")
    if not torch.cuda.is_available():
        print("fsdp2_reference: no CUDA device", file=sys.stderr)
        return 1
    configs = args.config or ["fsdp2"]
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = tempfile.mktemp(prefix="fsdp2_store_")
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1, device_id=device)
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - informational only
        nccl = "?"
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name(device)}, nccl {nccl}", flush=True)
    rc = 0
    try:
        for spec in configs:
            name, _, tok = spec.partition("@")
            try:
                run_config(name, int(tok) if tok else args.tokens, args, device)
            except Exception as e:  # noqa: BLE001 - report, then go on with the next configuration
                print(f"fsdp2_reference: {spec} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                rc = 1
                gc.collect()
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
        if os.path.exists(store):
            os.unlink(store)
    return rc


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""torch.optim.AdamW on CPU: the peer of bench/cpu_adam_bench.cc for docs/offload.md.

Times torch.optim.AdamW(fused=True) and (foreach=True) steps on N fp32 CPU parameters (split into
--tensors equal tensors), and fused=True followed by a copy of the new weights into a bf16 buffer
(what CpuAdamW with the bf16 output does in one pass). Same hyperparameters as cpu_adam_bench
(lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.01). Each figure is the best of --iters timed
steps after one warm-up step (which also creates the optimizer state). Run it in the same device
call as cpu_adam_bench, with the same --n and --threads. The last line is one summary:

  SUMMARY cpu_adam_torch n=... tensors=... threads=... torch=... fused_params_per_s=...
      fused_bf16_params_per_s=... foreach_params_per_s=...

Usage: python3 bench/cpu_adam_torch.py [--n 268435456] [--threads 16] [--tensors 1] [--iters 5]
"""
import argparse
import os
import time

import torch


def best_seconds(fn, iters):
    fn()  # warm-up: creates exp_avg / exp_avg_sq on the first step
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1 << 28, help="parameters in total")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    ap.add_argument("--tensors", type=int, default=1, help="split the parameters into this many")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    sizes = [args.n // args.tensors] * args.tensors
    sizes[-1] += args.n - sum(sizes)
    gen = torch.Generator().manual_seed(0)
    params = []
    for s in sizes:
        p = torch.nn.Parameter(torch.rand(s, generator=gen) - 0.5)
        p.grad = (p.detach() * 0.01 + 1e-3) / 1024.0
        params.append(p)
    bf16 = [torch.empty(s, dtype=torch.bfloat16) for s in sizes]
    hyper = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)

    results = {}
    for name, kw in (("fused", dict(fused=True)), ("foreach", dict(foreach=True))):
        opt = torch.optim.AdamW(params, **hyper, **kw)
        results[name] = args.n / best_seconds(opt.step, args.iters)
        if name == "fused":
            def step_and_copy():
                opt.step()
                with torch.no_grad():
                    for p, b in zip(params, bf16):
                        b.copy_(p)
            results["fused_bf16"] = args.n / best_seconds(step_and_copy, args.iters)
        del opt
    for k, v in results.items():
        print(f"torch AdamW {k:<10} n={args.n} threads={args.threads} {v / 1e6:10.3f} Mparams/s")
    print(f"SUMMARY cpu_adam_torch n={args.n} tensors={args.tensors} threads={args.threads} "
          f"torch={torch.__version__} fused_params_per_s={results['fused']:.4g} "
          f"fused_bf16_params_per_s={results['fused_bf16']:.4g} "
          f"foreach_params_per_s={results['foreach']:.4g}")


if __name__ == "__main__":
    main()

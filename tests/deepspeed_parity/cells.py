"""The parity suite's shared definitions: the model, its generators and the cell matrix.

Owns what both sides must agree on bit for bit: the six parameters (names, shapes, modules), the
SplitMix64-based generators of their initial values and of every micro step's gradient G, and the
list of cells (a DeepSpeed JSON config plus a schedule). `python3 cells.py OUT.json` writes the
cells file that zero_parity (C++) and ds_parity.py (DeepSpeed) both read; neither side invents a
cell of its own. docs/deepspeed_parity.md describes the suite.

Values are exact in fp32 on both sides:
  - initial values: an 8-bit integer times 2^-7 times a power-of-two scale, so they are exact in
    fp32, bf16 and fp16 alike (DeepSpeed builds its fp32 master from the 16-bit copy; zero from the
    init values: both start from the same master only if the init survives the 16-bit rounding).
  - gradients G: a 24-bit integer u, G = (u * 2^-24 * 2 - 1) * a power-of-two scale, in [-s, s).
The user's contract (engine.h): the gradient written for parameter p is
round_to_model_dtype(G * f) with f = engine.gradient_scale() (the loss scale, times 1/GAS in managed
mode), and in unmanaged mode f = gradient_scale() / n (fp32 division) for a window of n backward
calls: the user averages the loss. DeepSpeed gets the loss sum((p.float() * G)) (divided by n in
unmanaged mode, scale_wrt_gas=False), whose autograd gradient is the same product rounded the same
way.
"""

import json
import sys

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15

# name, shape, module, init scale (power of two), gradient scale (power of two)
PARAMS = [
    ("embed.weight", [64, 48], "embed", 2.0**-1, 2.0**-3),
    ("embed.bias", [48], "embed", 2.0**-2, 2.0**-3),
    ("mid.weight", [1000], "mid", 2.0**-1, 2.0**-4),
    ("odd.weight", [7, 13], "odd", 2.0**0, 2.0**-3),
    ("odd.bias", [3], "odd", 2.0**-3, 2.0**-3),
    ("head.weight", [256, 8], "head", 2.0**-1, 2.0**-4),
]
MODULES = ["embed", "mid", "odd", "head"]
NUM_PARAMS = len(PARAMS)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def splitmix64(x):
    x = (x + GAMMA) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def init_key(p):
    return splitmix64(0x1417000000000000 | p)


def grad_key(step, micro, p):
    return splitmix64(0x6AD0000000000000 | (step << 24) | (micro << 8) | p)


def _stream(key, n):
    """The first n outputs of the SplitMix64 generator started at state `key` (numpy uint64)."""
    import numpy as np
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = np.uint64(key) + i * np.uint64(GAMMA)
        x = x + np.uint64(GAMMA)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def init_values(p):
    """Initial fp32 values of parameter p (numpy float32, flat)."""
    import numpy as np
    shape, scale = PARAMS[p][1], PARAMS[p][3]
    x = _stream(init_key(p), numel(shape))
    k = (x >> np.uint64(56)).astype(np.int64) - 128  # -128..127
    return (k.astype(np.float32) * np.float32(2.0**-7)) * np.float32(scale)


def grad_values(step, micro, p):
    """G(step, micro, p) (numpy float32, flat)."""
    import numpy as np
    shape, scale = PARAMS[p][1], PARAMS[p][4]
    x = _stream(grad_key(step, micro, p), numel(shape))
    u = (x >> np.uint64(40)).astype(np.float32)  # 24-bit, exact
    return ((u * np.float32(2.0**-24)) * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)


# --- the matrix -----------------------------------------------------------------------------------
STEPS = 6
ALL = list(range(NUM_PARAMS))


def ds_config(stage, dtype, gas, clip, managed, loss_scale_window=1000):
    c = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gas,
        "train_batch_size": gas,
        "gradient_clipping": clip,
        "steps_per_print": 1000000,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                       "torch_adam": True},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 3,
                       "warmup_type": "linear"},
        },
        "zero_optimization": {"stage": stage},
    }
    if stage == 3:
        # Every parameter is below the default persistence threshold (1e5): 0 makes stage 3
        # release and re-gather them around each module's use, on both sides.
        c["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if not managed:
        c["managed_gradient_accumulation"] = False
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        c["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                     "loss_scale_window": loss_scale_window, "hysteresis": 2, "min_loss_scale": 1}
    return c


def window(n, params=None, overflow=False, divisor=1):
    """n micro steps, each giving gradients to `params`; `overflow` puts +Inf in the first micro
    step's G of parameter 0."""
    return {"micros": [{"params": list(ALL if params is None else params), "divisor": divisor,
                        "overflow": overflow and j == 0} for j in range(n)]}


def cell_name(stage, dtype, gas, clip, managed, kind="matrix"):
    return "%s_s%d_%s_gas%d_clip%s_%s" % (kind, stage, dtype, gas, "1" if clip else "0",
                                          "managed" if managed else "unmanaged")


def all_cells():
    cells = []
    for stage in range(4):
        for dtype in ("fp32", "bf16", "fp16"):
            for gas in (1, 4):
                for clip in (0.0, 1.0):
                    for managed in (True, False):
                        # Unmanaged: the config's GAS is 1; the user runs `gas` backward calls per
                        # step and divides the loss by that count.
                        cfg = ds_config(stage, dtype, gas if managed else 1, clip, managed)
                        wins = [window(gas, divisor=1 if managed else gas) for _ in range(STEPS)]
                        cells.append({"name": cell_name(stage, dtype, gas, clip, managed),
                                      "stage": stage, "dtype": dtype, "gas": gas, "clip": clip,
                                      "managed": managed, "config": cfg, "windows": wins})
        # fp16 overflow: +Inf at steps 1 and 2 (hysteresis 2: the first only spends the
        # hysteresis, the second halves the scale), scale window 2 (it grows back).
        for gas in (1, 4):
            cfg = ds_config(stage, "fp16", gas, 1.0, True, loss_scale_window=2)
            wins = [window(gas, overflow=s in (1, 2)) for s in range(STEPS)]
            cells.append({"name": cell_name(stage, "fp16", gas, 1.0, True, "overflow"),
                          "stage": stage, "dtype": "fp16", "gas": gas, "clip": 1.0, "managed": True,
                          "config": cfg, "windows": wins})
        # Unmanaged, varying backward counts (2, 5, 3, 2, 5, 3); odd.bias and head.weight are
        # inactive in the 5-backward windows.
        for dtype in ("fp32", "bf16", "fp16"):
            cfg = ds_config(stage, dtype, 1, 1.0, False)
            wins = []
            for s in range(STEPS):
                n = (2, 5, 3)[s % 3]
                wins.append(window(n, params=[0, 1, 2, 3] if n == 5 else ALL, divisor=n))
            cells.append({"name": "varying_s%d_%s_unmanaged" % (stage, dtype), "stage": stage,
                          "dtype": dtype, "gas": 0, "clip": 1.0, "managed": False, "config": cfg,
                          "windows": wins})
    return cells


def model_spec():
    return [{"name": n, "shape": s, "module": m, "init_scale": i, "grad_scale": g}
            for n, s, m, i, g in PARAMS]


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: cells.py OUT.json\n")
        return 2
    with open(argv[1], "w") as f:
        json.dump({"model": model_spec(), "cells": all_cells()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""ds_parity: the DeepSpeed side of the parity suite (docs/deepspeed_parity.md).

Runs every cell of the cells file (cells.py) through DeepSpeed 0.19.8 in this one process (world 1)
and writes OUT/<cell>.ds.json in zero_parity's format: per step the lr and loss scale before it,
was_step_applied(), skipped_steps, global_steps and get_global_grad_norm() after it; at the end
the fp32 master weights, exp_avg, exp_avg_sq and model parameters (float32 little-endian, base64),
and the initial fp32 master (to check that both sides start from the same values).

The model is cells.PARAMS as nn.Parameters, one nn.Module per cells.MODULES entry; its forward
takes {param index: G} and returns sum((p.float() * G).sum()) over the parameters given, so
dL/dp = G (times what DeepSpeed multiplies into the loss: the loss scale, 1/GAS in managed mode;
in unmanaged mode the loss is divided by the window's backward count and scale_wrt_gas=False).
Stage 3 gathers each module's parameters in its forward (DeepSpeed's hooks), which is why the loss
is computed inside the modules.

One deepspeed.initialize per cell, destroyed after it; a failing cell writes its error and
traceback into its JSON and the next cell runs. Set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/
MASTER_PORT or let the script default them (world 1). --device cpu needs DS_ACCELERATOR=cpu (set
by the script before importing deepspeed) and uses gloo.

Usage: ds_parity.py --cells CELLS.json --out DIR [--device cuda|cpu] [--filter SUBSTRING]
"""

import argparse
import base64
import gc
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cells as cells_lib  # noqa: E402


def number(v):
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def floats_b64(t):
    import numpy as np
    a = t.detach().float().cpu().contiguous().reshape(-1).numpy().astype("<f4")
    return base64.b64encode(a.tobytes()).decode("ascii")


def build_model(torch):
    nn = torch.nn

    class Part(nn.Module):
        def __init__(self, entries):
            super().__init__()
            self.attrs = []
            for attr, index, values in entries:
                setattr(self, attr, nn.Parameter(values))
                self.attrs.append((attr, index))

        def forward(self, grads):
            total = None
            for attr, index in self.attrs:
                if index in grads:
                    term = (getattr(self, attr).float() * grads[index]).sum()
                    total = term if total is None else total + term
            return total

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.order = []
            for m in cells_lib.MODULES:
                entries = []
                for i, (name, shape, module, _, _) in enumerate(cells_lib.PARAMS):
                    if module == m:
                        values = torch.from_numpy(cells_lib.init_values(i).copy()).reshape(shape)
                        entries.append((name.split(".", 1)[1], i, values))
                setattr(self, m, Part(entries))
                self.order.append((m, [i for _, i, _ in entries]))

        def forward(self, grads):
            total = None
            for m, indices in self.order:
                if any(i in grads for i in indices):
                    term = getattr(self, m)(grads)
                    total = term if total is None else total + term
            return total

    model = Model()
    names = [n for n, _ in model.named_parameters()]
    expected = [p[0] for p in cells_lib.PARAMS]
    if names != expected:
        raise RuntimeError("model parameter order %s, expected %s" % (names, expected))
    return model


def loss_scale_of(engine):
    opt = engine.optimizer
    for attr in ("loss_scale", "cur_scale"):
        v = getattr(opt, attr, None)
        if v is not None and not callable(v):
            return float(v)
    scaler = getattr(opt, "loss_scaler", None)
    if scaler is not None and getattr(scaler, "cur_scale", None) is not None:
        return float(scaler.cur_scale)
    return 1.0


def fp32_master_and_state(engine, p, torch, with_state=True):
    """(master, exp_avg, exp_avg_sq) of parameter p, full and in fp32 (the moments None unless
    with_state); safe_get_* first, then the stage-0 wrappers' own tables."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    master = m = v = None
    try:
        master = safe_get_full_fp32_param(p)
        if with_state:
            m = safe_get_full_optimizer_state(p, "exp_avg")
            v = safe_get_full_optimizer_state(p, "exp_avg_sq")
    except Exception:  # stage 0 wrappers: fall through to the tables below
        master = m = v = None
    if master is not None and (not with_state or (m is not None and v is not None)):
        return master, m, v
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", opt)
    hp = None
    fp16_groups = getattr(opt, "fp16_groups", None)
    fp32_groups = getattr(opt, "fp32_groups", None)
    if fp16_groups is not None and fp32_groups is not None:
        for gi, group in enumerate(fp16_groups):
            for pi, q in enumerate(group):
                if q is p:
                    hp = fp32_groups[gi][pi]
    if hp is None and p.dtype == torch.float32:
        hp = p  # plain torch optimizer on the fp32 parameters
    if hp is None:
        raise RuntimeError("no fp32 master found for a %s parameter of shape %s in %s" %
                           (p.dtype, tuple(p.shape), type(opt).__name__))
    if not with_state:
        return (master if master is not None else hp.detach()), None, None
    state = inner.state.get(hp, {})
    if "exp_avg" not in state:
        raise RuntimeError("optimizer %s has no exp_avg for the parameter of shape %s" %
                           (type(inner).__name__, tuple(p.shape)))
    return (master if master is not None else hp.detach()), state["exp_avg"], state["exp_avg_sq"]


def model_params(engine, stage, deepspeed):
    params = list(engine.module.parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return [floats_b64(p.data) for p in params]
    return [floats_b64(p.data) for p in params]


def run_cell(cell, device, torch, deepspeed, out):
    stage = cell["config"]["zero_optimization"]["stage"]
    model = build_model(torch)
    engine = None
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=cell["config"])
        out["optimizer_class"] = type(engine.optimizer).__name__
        params = list(engine.module.parameters())
        out["init_master"] = [floats_b64(fp32_master_and_state(engine, p, torch, False)[0]) for p in params]
        managed = cell["managed"]
        steps = []
        for s, win in enumerate(cell["windows"]):
            rec = {"lr": number(engine.get_lr()[0]), "loss_scale": number(loss_scale_of(engine))}
            for j, micro in enumerate(win["micros"]):
                grads = {}
                for i in micro["params"]:
                    g = torch.from_numpy(cells_lib.grad_values(s, j, i).copy())
                    if micro.get("overflow") and i == 0:
                        g[0] = float("inf")
                    grads[i] = g.reshape(cells_lib.PARAMS[i][1]).to(engine.device)
                loss = engine(grads)
                if managed:
                    engine.backward(loss)
                else:
                    n = micro.get("divisor", 1)
                    engine.backward(loss / n if n != 1 else loss, scale_wrt_gas=False)
                if managed:
                    engine.step()
            if not managed:
                engine.step()
            rec["applied"] = bool(engine.was_step_applied())
            rec["skipped_steps"] = int(engine.skipped_steps)
            rec["global_steps"] = int(engine.global_steps)
            rec["grad_norm"] = number(engine.get_global_grad_norm())
            rec["loss_scale_after"] = number(loss_scale_of(engine))
            steps.append(rec)
        out["steps"] = steps
        fin = {"master": [], "exp_avg": [], "exp_avg_sq": []}
        for p in params:
            master, m, v = fp32_master_and_state(engine, p, torch)
            fin["master"].append(floats_b64(master))
            fin["exp_avg"].append(floats_b64(m))
            fin["exp_avg_sq"].append(floats_b64(v))
        fin["model"] = model_params(engine, stage, deepspeed)
        out["final"] = fin
    finally:
        if engine is not None:
            try:
                engine.destroy()
            except Exception as e:  # keep going: the next cell gets a fresh engine anyway
                out.setdefault("notes", []).append("engine.destroy(): %r" % (e,))
        del engine, model
        gc.collect()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--filter", default="")
    args = ap.parse_args()
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29533")):
        os.environ.setdefault(k, v)
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import deepspeed
    deepspeed.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo")
    with open(args.cells) as f:
        doc = json.load(f)
    if doc["model"] != cells_lib.model_spec():
        sys.exit("ds_parity: %s was written for another model than cells.py's" % args.cells)
    os.makedirs(args.out, exist_ok=True)
    ran = failed = 0
    t_all = time.time()
    for cell in doc["cells"]:
        if args.filter and args.filter not in cell["name"]:
            continue
        out = {"name": cell["name"], "side": "deepspeed", "deepspeed": deepspeed.__version__,
               "torch": torch.__version__, "device": args.device}
        if args.device == "cuda":
            torch.cuda.synchronize()
            out["cuda_allocated_before"] = torch.cuda.memory_allocated()
        t0 = time.time()
        try:
            run_cell(cell, args.device, torch, deepspeed, out)
            status = "ok"
        except Exception as e:
            failed += 1
            out.pop("final", None)
            out["error"] = "%s: %s" % (type(e).__name__, e)
            out["traceback"] = traceback.format_exc()
            status = out["error"].splitlines()[0][:200]
        if args.device == "cuda":
            torch.cuda.empty_cache()
        ran += 1
        out["seconds"] = round(time.time() - t0, 3)
        with open(os.path.join(args.out, cell["name"] + ".ds.json"), "w") as f:
            json.dump(out, f)
        mem = (" %.1f MiB allocated before" % (out["cuda_allocated_before"] / 2**20)
               if "cuda_allocated_before" in out else "")
        print("%-44s %s (%.2f s%s)" % (cell["name"], status, out["seconds"], mem), flush=True)
    print("ds_parity: %d cells, %d failed, %.1f s" % (ran, failed, time.time() - t_all), flush=True)
    if ran == 0:
        sys.exit("ds_parity: no cell matched --filter '%s'" % args.filter)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

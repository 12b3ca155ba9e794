#!/usr/bin/env python3
"""The transformer benchmark's plan and its peers (issue 21; bench/run_llm_bench.sh runs it).

One process trains one configuration for a few steps and writes one JSON file. The peers build the
model with Hugging Face transformers' own classes (Qwen3ForCausalLM / LlamaForCausalLM) from a config
with the shape of a zero_llm preset, random weights from a fixed seed, and train it on the rows
zero_llm --sequential-data reads:

  --peer fsdp2                 PyTorch FSDP2: fully_shard on every decoder layer and on the model,
                               MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 parameters
                               (the master weights), torch.optim.AdamW(fused=True) on the GPU
  --peer fsdp2_offload         the same with CPUOffloadPolicy(pin_memory=True): parameters, gradients and
                               AdamW(fused=True) on the CPU
  --peer fsdp2_plain           fsdp2 on a plain PyTorch model of the same shape instead of transformers'
                               classes (plain_model below: torch.nn.functional's rms_norm, SDPA with
                               enable_gqa, rotate-half RoPE, SwiGLU; what a lean training script writes,
                               without transformers' per-call overheads); the table compares ours with
                               the faster of fsdp2 and fsdp2_plain
  --peer fsdp2_plain_offload   the same with CPUOffloadPolicy(pin_memory=True)
  --peer deepspeed_z3          DeepSpeed ZeRO-3, bf16 with fp32 master weights, torch.optim.AdamW on the GPU
                               ("torch_adam": true; FusedAdam would JIT-build with nvcc)
  --peer deepspeed_z2_offload  DeepSpeed ZeRO-2, offload_optimizer cpu (DeepSpeedCPUAdam, built by ninja on
                               first use)
  --peer deepspeed_z3_offload  DeepSpeed ZeRO-3, offload_optimizer cpu
  --peer deepspeed_infinity    DeepSpeed ZeRO-Infinity (issue 21's target 3, the largest transformer): ZeRO-3,
                               offload_optimizer nvme under --nvme-path DIR (required; pin_memory, buffer_count 4,
                               DeepSpeed's aio defaults, as bench/deepspeed_offload.py's ds_z3_nvme) + offload_param
                               cpu (pinned), DeepSpeedCPUAdam; the model is built inside deepspeed.zero.Init(
                               config_dict_or_path=<its config>, remote_device="cpu", pin_memory=True), so it is
                               never whole on the GPU nor unpartitioned in fp32. Its --dry-run prints what goes to
                               the disk (12 bytes per parameter) against the free space there.

--gas N (--peer runs; default 1) splits each step's --batch rows into N micro batches of batch/N rows
(micro batch k of step s: rows s*batch + k*batch/N ..; the same rows in the same order as GAS 1):
DeepSpeed gets gradient_accumulation_steps N with engine.backward and engine.step per micro batch (the
update at the boundary); FSDP2 runs N backward passes of loss/N (reduce-scatter each time: a copy at
world size 1), then one optimizer step. The step's loss is the mean of its micro batches' losses.

Our side is zero_llm; `--ours NAME --prefix P` writes its DeepSpeed-style config (P.ds.json) and the
row's description (P.meta.json, read by bench/llm_table.py) and prints zero_llm's flags (the caller adds
--device and --nproc). The configurations (OURS below): none, cpuadam, cpuadam_param, cpuadam_r60,
cpuadam_r80, cpuadam_param_r60, gpuchunk, gpuoverlap, gas8_acccpu, gas8_accgpu.

Shared by every configuration: seq 2048 (--seq), AdamW lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.01, constant lr, no gradient clipping (--clip 0; the same value goes to every side), bf16
compute with fp32 master weights, one process of world size 1 over NCCL. Step s reads rows
s*batch .. s*batch+batch-1 of the token file cut into consecutive windows of seq+1 tokens (wrapping),
inputs the first seq tokens of a window and targets the last seq: zero_llm --sequential-data's order
(train/zero_llm.cc, TrainRows), with --holdout 0 so that its rows start at the file's start.
The loss is the mean cross-entropy over every target, in fp32.

Each step is timed from a device synchronize to one after the optimizer step (host->device copy of the
rows, forward, loss, backward, step); tokens/s = tokens per step / step time; model TFLOPS with
zero's formula (LlmConfig::TrainFlopsPerToken, models/llama/config.h): tokens/s x (6 x matmul
parameters + 6 x layers x seq x heads x head_dim). Peak GPU memory: torch.cuda.max_memory_allocated()
from the first step on (set-up excluded); host: the process's peak resident set (ru_maxrss). The
summary is the median of the steps after the first. The JSON (--out) is rewritten after every step, so
a run cut by a timeout still leaves its steps; an exception (out of memory) is recorded in it.
Failures are recorded, never lost: "phase" names where the run was (set-up, model construction,
deepspeed.initialize / fully_shard, "step K [micro batch k/N] forward|backward", "step K optimizer step");
an exception writes status "error", "error" (type: message), "error_type", "error_message" (first 2000
characters) and "traceback"; a run killed (`timeout`'s SIGTERM) or crashed without an exception (a
segmentation fault) leaves status "running" and the last phase written (each step's start;
deepspeed_infinity also writes each micro batch's phases; llm_table.py calls it cut) and faulthandler's
Python stack of every thread in the log. "init_s" is model construction + deepspeed.initialize (or fully_shard) for every peer, "init_model_s"
the construction alone; a run that died in them has the seconds spent so far and "init_done": false.

--dry-run checks the arguments and the token file and prints the plan without importing torch (the
imports are lazy), so it runs on a machine without PyTorch. --make-tokens FILE writes random token
ids (little-endian uint32, Python's Mersenne Twister from --seed: the same bytes on every machine).
"""

import argparse
import array
import json
import os
import random
import resource
import statistics
import sys
import time

# The presets of models/llama/config.cc (Presets()), field by field in its order:
# architecture, vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, head_dim, rope_theta, rms_norm_eps, tie_word_embeddings,
# max_position_embeddings, bos_token_id, eos_token_id. bench/llm_bench_scripts_test.py parses the C++
# file and fails when the two differ.
QWEN3 = "Qwen3ForCausalLM"
LLAMA = "LlamaForCausalLM"
PRESET_FIELDS = ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps",
                 "tie_word_embeddings", "max_position_embeddings", "bos_token_id", "eos_token_id")
PRESETS = {
    name: dict(zip(PRESET_FIELDS, values)) for name, values in (
        ("tiny", (QWEN3, 512, 64, 192, 2, 4, 2, 16, 10000.0, 1e-6, True, 512, -1, -1)),
        ("qwen3-0.6b", (QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 1e6, 1e-6, True, 40960, 151643, 151645)),
        ("qwen3-4b", (QWEN3, 151936, 2560, 9728, 36, 32, 8, 128, 1e6, 1e-6, True, 40960, 151643, 151645)),
        ("qwen3-8b", (QWEN3, 151936, 4096, 12288, 36, 32, 8, 128, 1e6, 1e-6, False, 40960, 151643, 151645)),
        ("qwen3-14b", (QWEN3, 151936, 5120, 17408, 40, 40, 8, 128, 1e6, 1e-6, False, 40960, 151643, 151645)),
        ("llama-2-13b", (LLAMA, 32000, 5120, 13824, 40, 40, 40, 128, 10000.0, 1e-5, False, 4096, 1, 2)),
        ("llama-3.2-1b", (LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 500000.0, 1e-5, True, 131072, 128000, 128001)),
        ("llama-3.2-3b", (LLAMA, 128256, 3072, 8192, 28, 24, 8, 128, 500000.0, 1e-5, True, 131072, 128000, 128001)),
        ("llama-3.1-8b", (LLAMA, 128256, 4096, 14336, 32, 32, 8, 128, 500000.0, 1e-5, False, 131072, 128000, 128001)),
    )
}

# The smallest vocabulary of the real-size presets: a token file of ids below it serves all of them.
# llama-2-13b's 32000 ids are left out (its runs write their own token file, --vocab 32000), so the
# token file of every other run stays the one earlier runs used.
TOKEN_VOCAB = min(p["vocab_size"] for n, p in PRESETS.items() if n not in ("tiny", "llama-2-13b"))

PEERS = {
    "fsdp2": "PyTorch FSDP2",
    "fsdp2_offload": "PyTorch FSDP2 + CPUOffloadPolicy",
    "fsdp2_plain": "PyTorch FSDP2, plain PyTorch model",
    "fsdp2_plain_offload": "PyTorch FSDP2 + CPUOffloadPolicy, plain PyTorch model",
    "deepspeed_z3": "DeepSpeed ZeRO-3",
    "deepspeed_z2_offload": "DeepSpeed ZeRO-2 + offload_optimizer cpu",
    "deepspeed_z3_offload": "DeepSpeed ZeRO-3 + offload_optimizer cpu",
    "deepspeed_infinity": "DeepSpeed 0.19.8 ZeRO-Infinity: ZeRO-3, offload_optimizer nvme + offload_param cpu",
}

# Our configurations: label, the zero_optimization keys beyond stage 3, GAS, the peer the row is
# compared with, the configuration of ours it must beat (counterpart) and issue 21's target.
OURS = {
    "none": dict(label="ours: ZeRO-3, no offload", zero={}, gas=1, match="deepspeed_z3", counterpart=None,
                 target="fsdp2"),
    "cpuadam": dict(label="ours: ZeRO-3, offload_optimizer cpu (CPU AdamW)",
                    zero={"offload_optimizer": {"device": "cpu", "pin_memory": True}}, gas=1,
                    match="deepspeed_z3_offload", counterpart=None, target="fsdp2_offload"),
    "cpuadam_param": dict(label="ours: ZeRO-3, offload_optimizer + offload_param cpu",
                          zero={"offload_optimizer": {"device": "cpu", "pin_memory": True},
                                "offload_param": {"device": "cpu", "pin_memory": True}}, gas=1,
                          match="fsdp2_offload", counterpart=None, target="fsdp2_offload"),
    # Partial offload (offload_optimizer.ratio): the first 40% / 20% of the states stay on the GPU.
    # At 0.6 llama-3.2-3b uses about FSDP2 + CPUOffloadPolicy's GPU memory (docs/performance.md).
    "cpuadam_r60": dict(label="ours: ZeRO-3, offload_optimizer cpu, ratio 0.6 (40% of the states on the GPU)",
                        zero={"offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": 0.6}}, gas=1,
                        match="fsdp2_offload", counterpart="cpuadam", target="fsdp2_offload"),
    "cpuadam_r80": dict(label="ours: ZeRO-3, offload_optimizer cpu, ratio 0.8 (20% of the states on the GPU)",
                        zero={"offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": 0.8}}, gas=1,
                        match="fsdp2_offload", counterpart="cpuadam", target="fsdp2_offload"),
    "cpuadam_param_r60": dict(label="ours: ZeRO-3, offload_optimizer cpu ratio 0.6 + offload_param cpu",
                              zero={"offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": 0.6},
                                    "offload_param": {"device": "cpu", "pin_memory": True}}, gas=1,
                              match="fsdp2_offload", counterpart="cpuadam_param", target="fsdp2_offload"),
    "gpuchunk": dict(label="ours: ZeRO-3, offload_optimizer cpu, chunked GPU AdamW (synchronous)",
                     zero={"offload_optimizer": {"device": "cpu", "pin_memory": True, "update_device": "gpu",
                                                 "overlap_step": False}}, gas=1,
                     match="deepspeed_z3_offload", counterpart=None, target="fsdp2_offload"),
    "gpuoverlap": dict(label="ours: ZeRO-3, offload_optimizer cpu, chunked GPU AdamW, overlap_step",
                       zero={"offload_optimizer": {"device": "cpu", "pin_memory": True, "update_device": "gpu",
                                                   "overlap_step": True}}, gas=1,
                       match="deepspeed_z3_offload", counterpart="gpuchunk", target="fsdp2_offload"),
    "gas8_acccpu": dict(label="ours: ZeRO-3, offload_optimizer + param cpu, GAS 8, offload_grad_accumulation cpu",
                        zero={"offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "offload_param": {"device": "cpu", "pin_memory": True},
                              "offload_grad_accumulation": "cpu"}, gas=8,
                        match="fsdp2_offload", counterpart=None, target=None),
    "gas8_accgpu": dict(label="ours: ZeRO-3, offload_optimizer + param cpu, GAS 8, offload_grad_accumulation gpu",
                        zero={"offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "offload_param": {"device": "cpu", "pin_memory": True},
                              "offload_grad_accumulation": "gpu"}, gas=8,
                        match="fsdp2_offload", counterpart="gas8_acccpu", target=None),
}

# Issue 21's targets: tokens/s of ours over the named peer's, per preset (no entry: no target).
TARGETS = {
    "fsdp2": {"qwen3-0.6b": 1.3, "llama-3.2-3b": 1.1},
    "fsdp2_offload": {"qwen3-0.6b": 2.0, "llama-3.2-3b": 2.0},
}

BETAS = (0.9, 0.95)
EPS = 1e-8
H200_PEAK_TFLOPS = 989.0  # dense bf16: the MFU denominator (zero_llm.cc's kPeakTflopsPerGpu)


# --- the model's counts: LlmConfig::NumParams, MatmulParams, TrainFlopsPerToken -------------------

def num_params(p):
    H, q, kv = p["hidden_size"], p["num_attention_heads"] * p["head_dim"], p["num_key_value_heads"] * p["head_dim"]
    qk_norm = 2 * p["head_dim"] if p["architecture"] == QWEN3 else 0
    per_layer = 2 * H + H * q + 2 * H * kv + q * H + qk_norm + 3 * H * p["intermediate_size"]
    return p["vocab_size"] * H * (1 if p["tie_word_embeddings"] else 2) + p["num_hidden_layers"] * per_layer + H


def matmul_params(p):
    H, q, kv = p["hidden_size"], p["num_attention_heads"] * p["head_dim"], p["num_key_value_heads"] * p["head_dim"]
    per_layer = H * q + 2 * H * kv + q * H + 3 * H * p["intermediate_size"]
    return p["num_hidden_layers"] * per_layer + p["vocab_size"] * H


def train_flops_per_token(p, seq):
    return 6.0 * matmul_params(p) + 6.0 * p["num_hidden_layers"] * seq * (p["num_attention_heads"] * p["head_dim"])


def largest_param(p):
    """Elements of the largest parameter (the embedding, or an MLP matrix): offload_param's buffer_size."""
    return max(p["vocab_size"] * p["hidden_size"], p["hidden_size"] * p["intermediate_size"])


# --- configs -------------------------------------------------------------------------------------

def optimizer_params(a):
    return {"lr": a.lr, "betas": list(BETAS), "eps": EPS, "weight_decay": a.weight_decay}


def deepspeed_config(peer, a):
    """The DeepSpeed config of a deepspeed_* peer (DeepSpeed's defaults for everything not named): --batch
    rows per optimizer step as --gas micro batches of batch/gas rows."""
    zero = {"stage": 2 if peer.startswith("deepspeed_z2") else 3}
    opt = optimizer_params(a)
    if peer == "deepspeed_infinity":
        # ZeRO-Infinity as docs/performance.md ran it on the MLP (bench/deepspeed_offload.py ds_z3_nvme):
        # buffer_count 4, DeepSpeed's aio defaults (pipeline_read/write crash in 0.19.8); the parameters
        # on the CPU (offload_param nvme fails "Not enough buffers" in 0.19.8). DeepSpeedCPUAdam.
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": a.nvme_path, "pin_memory": True,
                                     "buffer_count": 4}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif peer.endswith("_offload"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    else:
        opt["torch_adam"] = True
    gas = getattr(a, "gas", 1)
    return {"train_micro_batch_size_per_gpu": a.batch // gas, "gradient_accumulation_steps": gas,
            "gradient_clipping": a.clip, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": opt}, "zero_optimization": zero,
            "steps_per_print": 1 << 30, "wall_clock_breakdown": False}


def ours_config(name, a):
    """zero_llm's config for our configuration `name` at --batch rows per step (split over its GAS)."""
    o = OURS[name]
    zero = {"stage": 3}
    zero.update(json.loads(json.dumps(o["zero"])))
    if "offload_param" in zero:
        # The largest parameter's shard must fit one buffer (an Initialize error otherwise).
        zero["offload_param"]["buffer_size"] = max(100000000, largest_param(PRESETS[a.preset]))
    return {"train_micro_batch_size_per_gpu": a.batch // o["gas"], "gradient_accumulation_steps": o["gas"],
            "gradient_clipping": a.clip, "bf16": {"enabled": True}, "communication_data_type": "fp32",
            "steps_per_print": 1000, "optimizer": {"type": "AdamW", "params": optimizer_params(a)},
            "zero_optimization": zero}


def fsdp2_plan(peer):
    offload = " + CPUOffloadPolicy(pin_memory=True)" if peer.endswith("_offload") else ""
    where = "CPU" if offload else "GPU"
    model = "the plain PyTorch model" if "_plain" in peer else "transformers' model class"
    return (f"{model}; fully_shard(each decoder layer, then the model; MixedPrecisionPolicy(param_dtype=bfloat16, "
            f"reduce_dtype=float32){offload}); fp32 parameters; torch.optim.AdamW(fused=True) on the {where}")


# --- token file ----------------------------------------------------------------------------------

def make_tokens(path, vocab, count, seed):
    rng = random.Random(seed)
    ids = array.array("I", (rng.randrange(vocab) for _ in range(count)))
    if sys.byteorder != "little":
        ids.byteswap()
    with open(path, "wb") as f:
        ids.tofile(f)
    return count


def check_tokens(path, vocab):
    """(number of ids) of a .bin token file, or raise ValueError naming the file and what is wrong."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ValueError(f"--tokens {path}: cannot read ({e.strerror})") from None
    if size % 4:
        raise ValueError(f"--tokens {path}: {size} bytes, not a multiple of 4 (little-endian uint32 ids)")
    n = size // 4
    with open(path, "rb") as f:
        pos = 0
        while True:
            chunk = array.array("I")
            try:
                chunk.fromfile(f, 1 << 20)
            except EOFError:
                pass  # a short last chunk: fromfile keeps what it read
            if not chunk:
                break
            if sys.byteorder != "little":
                chunk.byteswap()
            top = max(chunk)
            if top >= vocab:
                i = next(k for k, v in enumerate(chunk) if v >= vocab)
                raise ValueError(f"--tokens {path}: id {chunk[i]} at position {pos + i} is outside the "
                                 f"preset's vocabulary of {vocab}")
            pos += len(chunk)
    return n


def window_rows(step, batch, windows):
    """Window indices of step `step` (0-based): zero_llm --sequential-data at world 1, any GAS."""
    return [(step * batch + i) % windows for i in range(batch)]


# --- arguments -----------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--peer", help="|".join(PEERS))
    mode.add_argument("--ours", help="write zero_llm's config and print its flags: " + "|".join(OURS))
    mode.add_argument("--make-tokens", metavar="FILE", help="write random token ids to FILE and exit")
    ap.add_argument("--preset", default="qwen3-0.6b", help="|".join(PRESETS))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8, help="rows per optimizer step")
    ap.add_argument("--gas", type=int, default=1,
                    help="--peer: gradient accumulation: each step's --batch rows as GAS micro batches of batch/GAS")
    ap.add_argument("--nvme-path", metavar="DIR",
                    help="--peer deepspeed_infinity (required there): the folder of DeepSpeed's optimizer swap files")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tokens", help="token file (.bin, little-endian uint32 ids)")
    ap.add_argument("--out", help="--peer: the result JSON")
    ap.add_argument("--prefix", help="--ours: PREFIX.ds.json, PREFIX.meta.json, PREFIX.jsonl, PREFIX.log")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=0.0, help="gradient clipping (0: off)")
    ap.add_argument("--seed", type=int, default=0, help="initial weights (--peer) or the ids (--make-tokens)")
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="recompute each layer in backward (HF gradient_checkpointing / zero_llm's flag)")
    ap.add_argument("--vocab", type=int, default=TOKEN_VOCAB, help="--make-tokens: ids below this")
    ap.add_argument("--windows", type=int, default=128, help="--make-tokens: windows of --seq + 1 tokens")
    ap.add_argument("--dry-run", action="store_true", help="check and print the plan; import no torch")
    a = ap.parse_args(argv)

    def bad(msg):
        ap.error(msg)

    if a.make_tokens:
        if a.vocab < 1 or a.windows < 1 or a.seq < 1:
            bad("--make-tokens needs --vocab, --windows and --seq >= 1")
        return a
    if a.peer is not None and a.peer not in PEERS:
        bad(f"--peer {a.peer!r}: expected one of {', '.join(PEERS)}")
    if a.ours is not None and a.ours not in OURS:
        bad(f"--ours {a.ours!r}: expected one of {', '.join(OURS)}")
    if a.preset not in PRESETS:
        bad(f"--preset {a.preset!r}: expected one of {', '.join(PRESETS)} (models/llama/config.cc)")
    p = PRESETS[a.preset]
    if not 1 <= a.seq <= p["max_position_embeddings"]:
        bad(f"--seq {a.seq}: expected 1..{p['max_position_embeddings']} (max_position_embeddings of {a.preset})")
    if a.batch < 1:
        bad(f"--batch {a.batch}: expected >= 1")
    if a.ours and a.batch % OURS[a.ours]["gas"]:
        bad(f"--batch {a.batch}: --ours {a.ours} splits it over GAS {OURS[a.ours]['gas']}: expected a multiple")
    if a.gas < 1:
        bad(f"--gas {a.gas}: expected >= 1")
    if a.ours and a.gas != 1:
        bad(f"--gas {a.gas}: for --peer runs only (--ours {a.ours} has GAS {OURS[a.ours]['gas']} in OURS)")
    if a.batch % a.gas:
        bad(f"--batch {a.batch} is not a multiple of --gas {a.gas}: each step's rows are split into "
            f"{a.gas} micro batches of equal size")
    if a.peer == "deepspeed_infinity" and not a.nvme_path:
        bad("--peer deepspeed_infinity needs --nvme-path DIR (the folder of DeepSpeed's optimizer swap files, "
            "on the disk it swaps to)")
    if a.nvme_path and a.peer != "deepspeed_infinity":
        bad(f"--nvme-path {a.nvme_path}: only --peer deepspeed_infinity swaps to a disk")
    if a.steps < 2:
        bad(f"--steps {a.steps}: expected >= 2 (the first step is not in the median)")
    if not a.lr > 0 or a.weight_decay < 0 or a.clip < 0:
        bad("--lr must be > 0, --weight-decay and --clip >= 0")
    if not a.tokens:
        bad("--tokens FILE is required (bench/llm_peers.py --make-tokens FILE writes one)")
    if a.peer and not a.out:
        bad("--peer needs --out FILE.json")
    if a.ours and not a.prefix:
        bad("--ours needs --prefix PATH")
    for what, path in (("--out", a.out), ("--prefix", a.prefix)):
        if path:
            d = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(d):
                bad(f"{what} {path}: folder {d} does not exist")
    try:
        a.token_count = check_tokens(a.tokens, p["vocab_size"])
    except ValueError as e:
        bad(str(e))
    a.windows_in_file = a.token_count // (a.seq + 1)
    if a.windows_in_file < 1:
        bad(f"--tokens {a.tokens}: {a.token_count} ids, fewer than --seq + 1 = {a.seq + 1}")
    return a


def plan_text(a):
    p = PRESETS[a.preset]
    need = a.steps * a.batch
    wrap = "" if need <= a.windows_in_file else f" (wraps: the file holds {a.windows_in_file})"
    lines = [
        f"# model: {a.preset}: {p['architecture']} V={p['vocab_size']} H={p['hidden_size']} "
        f"I={p['intermediate_size']} L={p['num_hidden_layers']} heads={p['num_attention_heads']}/"
        f"{p['num_key_value_heads']} head_dim={p['head_dim']} {'tied' if p['tie_word_embeddings'] else 'untied'} "
        f"params={num_params(p)}",
        f"# model FLOPs per token at seq {a.seq}: {train_flops_per_token(p, a.seq):.6g} "
        f"(matmul parameters {matmul_params(p)})",
        f"# data: {a.tokens}: {a.token_count} ids, {a.windows_in_file} windows of {a.seq + 1}; windows "
        f"0..{need - 1} in order, {a.batch} per step{wrap}",
        f"# {a.steps} steps of {a.batch * a.seq} tokens; AdamW lr {a.lr:g} betas {BETAS} eps {EPS:g} "
        f"wd {a.weight_decay:g}, clip {a.clip:g}{', activation checkpointing' if a.activation_checkpointing else ''}",
    ]
    if a.gas > 1:
        m = a.batch // a.gas
        lines.append(f"# gradient accumulation: {a.gas} micro batches of {m} rows per step (micro batch k of step s: "
                     f"windows s*{a.batch} + k*{m} .. + {m - 1}), one optimizer step after the last")
    if a.peer == "deepspeed_infinity":
        lines.append(f"# model built inside deepspeed.zero.Init(config_dict_or_path=<the config below>, "
                     f"remote_device='cpu', pin_memory=True): bf16 shards in pinned host memory, never whole on "
                     f"the GPU; {infinity_disk_text(p, a.nvme_path)}")
    return lines


def infinity_disk_text(p, path):
    """What deepspeed_infinity puts on --nvme-path against the free space of the filesystem it is on."""
    need = 12 * num_params(p)
    text = (f"fp32 weights, exp_avg and exp_avg_sq swap to {path}: 12 bytes x {num_params(p)} parameters = "
            f"{gib(need):.1f} GiB")
    d = os.path.abspath(path)
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    try:
        st = os.statvfs(d)
    except OSError:
        return text
    free = st.f_bavail * st.f_frsize
    short = f": {gib(need - free):.1f} GiB short" if free < need else ""
    return text + f" (the filesystem of {d} has {gib(free):.1f} GiB free here{short})"


# --- our side: files for zero_llm ----------------------------------------------------------------

def write_ours(a):
    """PREFIX.ds.json and PREFIX.meta.json; returns zero_llm's flags (without --device/--nproc)."""
    o = OURS[a.ours]
    cfg = ours_config(a.ours, a)
    base = os.path.basename(a.prefix)
    meta = {"kind": "ours", "impl": "zero", "name": a.ours, "label": o["label"], "preset": a.preset,
            "seq": a.seq, "batch": a.batch, "gas": o["gas"], "tokens_per_step": a.batch * a.seq,
            "steps_planned": a.steps, "activation_checkpointing": a.activation_checkpointing,
            "match": o["match"], "counterpart": o["counterpart"], "target": o["target"],
            "jsonl": base + ".jsonl", "log": base + ".log", "config": cfg}
    flags = ["--preset", a.preset, "--seq", str(a.seq), "--config", a.prefix + ".ds.json", "--steps", str(a.steps),
             "--data", a.tokens, "--sequential-data", "--holdout", "0", "--eval-windows", "0", "--plot", "none",
             "--print-every", "1", "--seed", str(a.seed), "--log-json", a.prefix + ".jsonl"]
    if a.activation_checkpointing:
        flags.append("--activation-checkpointing")
    if not a.dry_run:
        with open(a.prefix + ".ds.json", "w") as f:
            json.dump(cfg, f, indent=1)
        with open(a.prefix + ".meta.json", "w") as f:
            json.dump(meta, f, indent=1)
    return flags, cfg


# --- the peers (torch imported here only) --------------------------------------------------------

def gib(b):
    return b / float(1 << 30)


def host_peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # KiB on Linux


def plain_model(torch, a, device):
    """The preset's transformer in plain PyTorch, as a lean training script writes it (the arithmetic of
    transformers' classes: RMSNorm in fp32 then the weight, rotate-half RoPE, causal GQA attention
    through SDPA, SwiGLU, the tied or untied lm_head; weights normal(0, 0.02), norms ones, fp32)."""
    import types

    import torch.utils.checkpoint
    nn, F = torch.nn, torch.nn.functional
    p = PRESETS[a.preset]
    H, I, V, L = p["hidden_size"], p["intermediate_size"], p["vocab_size"], p["num_hidden_layers"]
    nh, nkv, hd, eps = p["num_attention_heads"], p["num_key_value_heads"], p["head_dim"], p["rms_norm_eps"]
    qk_norm = p["architecture"] == QWEN3

    class Norm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)

    def rope(x, cos, sin):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = Norm(H), Norm(H)
            self.q_proj, self.k_proj = nn.Linear(H, nh * hd, bias=False), nn.Linear(H, nkv * hd, bias=False)
            self.v_proj, self.o_proj = nn.Linear(H, nkv * hd, bias=False), nn.Linear(nh * hd, H, bias=False)
            if qk_norm:
                self.q_norm, self.k_norm = Norm(hd), Norm(hd)
            self.gate_proj, self.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)

        def forward(self, x, cos, sin):
            B, S, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, S, nh, hd)
            k = self.k_proj(h).view(B, S, nkv, hd)
            v = self.v_proj(h).view(B, S, nkv, hd).transpose(1, 2)
            if qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rope(q.transpose(1, 2), cos, sin), rope(k.transpose(1, 2), cos, sin)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o_proj(o.transpose(1, 2).reshape(B, S, nh * hd))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, H)
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm = Norm(H)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            self.lm_head = None if p["tie_word_embeddings"] else nn.Linear(H, V, bias=False)
            inv = 1.0 / (p["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, input_ids, use_cache=False):
            S = input_ids.shape[1]
            x = self.model.embed_tokens(input_ids)
            ang = torch.outer(torch.arange(S, device=x.device, dtype=torch.float32), self.inv_freq)
            emb = torch.cat((ang, ang), dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            for layer in self.model.layers:
                if a.activation_checkpointing:
                    x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False)
                else:
                    x = layer(x, cos, sin)
            x = self.model.norm(x)
            w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            return types.SimpleNamespace(logits=F.linear(x, w))

    torch.manual_seed(a.seed)
    with torch.device(device):
        model = Model()
        for n, q in model.named_parameters():
            if q.dim() == 2:
                nn.init.normal_(q, 0.0, 0.02)
    model = model.to(torch.float32)
    model.train()
    return model, "none (plain PyTorch)", "sdpa (plain)"


def hf_model(torch, a, device, zero_init=None):
    """transformers' model class for the preset: fp32 on `device`, or, with zero_init (a
    deepspeed.zero.Init context), built inside it: each module's parameters partitioned as soon as the
    module is made, in the config's dtype (bf16) on zero.Init's remote device, no fp32 copy of the model."""
    import transformers
    p = PRESETS[a.preset]
    qwen = p["architecture"] == QWEN3
    cls_cfg = transformers.Qwen3Config if qwen else transformers.LlamaConfig
    cls = transformers.Qwen3ForCausalLM if qwen else transformers.LlamaForCausalLM
    kw = dict(vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
              num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_attention_heads"],
              num_key_value_heads=p["num_key_value_heads"], head_dim=p["head_dim"],
              max_position_embeddings=p["max_position_embeddings"], rope_theta=p["rope_theta"],
              rms_norm_eps=p["rms_norm_eps"], tie_word_embeddings=p["tie_word_embeddings"], use_cache=False)
    if p["bos_token_id"] >= 0:
        kw.update(bos_token_id=p["bos_token_id"], eos_token_id=p["eos_token_id"])
    cfg = cls_cfg(**kw)
    try:
        cfg._attn_implementation = "sdpa"  # torch's scaled_dot_product_attention (flash kernels on the H200)
    except Exception:  # noqa: BLE001 - older/newer spellings: transformers then picks its default
        pass
    torch.manual_seed(a.seed)
    if zero_init is not None:
        with zero_init:  # zero.Init makes each tensor on the GPU and moves the module's shard out at once
            model = cls(cfg)
    else:
        with torch.device(device):  # random init runs on the GPU: seconds, not minutes, for billions of weights
            model = cls(cfg)
        model = model.to(torch.float32)
    if a.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, transformers.__version__, getattr(model.config, "_attn_implementation", "?")


def run_peer(a):
    p = PRESETS[a.preset]
    ds = a.peer.startswith("deepspeed")
    infinity = a.peer == "deepspeed_infinity"
    gas, micro = a.gas, a.batch // a.gas
    result = {"kind": "peer", "impl": "deepspeed" if ds else "fsdp2", "name": a.peer, "label": PEERS[a.peer],
              "preset": a.preset, "seq": a.seq, "batch": a.batch, "gas": gas, "micro_batch": micro,
              "tokens_per_step": a.batch * a.seq,
              "steps_planned": a.steps, "activation_checkpointing": a.activation_checkpointing, "clip": a.clip,
              "lr": a.lr, "weight_decay": a.weight_decay, "betas": list(BETAS), "tokens": a.tokens,
              "flops_per_token": train_flops_per_token(p, a.seq), "params_formula": num_params(p),
              "status": "starting", "phase": "set-up", "steps": []}
    if infinity:
        result["nvme_path"] = a.nvme_path
    clock = {"t_start": None}

    def save():
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, a.out)

    def phase(text, write=False):
        result["phase"] = text
        if write:
            save()

    def note_init():
        """init_s so far (model construction + deepspeed.initialize / fully_shard), when it did not finish."""
        if clock["t_start"] is not None and "init_s" not in result:
            result["init_s"] = time.perf_counter() - clock["t_start"]
            result["init_done"] = False

    def fail(msg, exc=None):
        result["status"] = "error"
        result["error"] = msg
        if exc is not None:
            import traceback
            result["error_type"] = type(exc).__name__
            result["error_message"] = str(exc)[:2000]
            result["traceback"] = traceback.format_exc()[-4000:]
        note_init()
        save()
        print(f"llm_peers: {a.peer} on {a.preset} failed in {result['phase']}: {msg}", file=sys.stderr, flush=True)
        return 1

    save()  # a run that dies before its first step still leaves a row
    import faulthandler
    import signal
    # A segmentation fault (DeepSpeed's aio) or `timeout`'s SIGTERM prints every thread's Python stack to the
    # log, from C and at once (no Python handler that a long call holding the GIL could delay past the
    # limit), and the process dies as before; the JSON keeps the steps and the last phase written.
    faulthandler.enable()
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        return fail(f"PyTorch/numpy are not importable here ({e}); run it on the GPU machine")
    if not torch.cuda.is_available():
        return fail("no CUDA device")
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", str(29500 + os.getpid() % 1000))):
        os.environ.setdefault(k, v)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    ids = np.fromfile(a.tokens, dtype="<u4")
    windows = len(ids) // (a.seq + 1)
    rows = torch.from_numpy(ids[: windows * (a.seq + 1)].astype(np.int64)).view(windows, a.seq + 1)
    engine = opt = model = None
    try:
        if ds:
            import deepspeed
            deepspeed.init_distributed(dist_backend="nccl")
            result["versions"] = {"deepspeed": deepspeed.__version__}
        else:
            import tempfile
            import torch.distributed as dist
            store = tempfile.mktemp(prefix="llm_peers_store_")
            dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1, device_id=device)
            result["versions"] = {}
        result["versions"].update(torch=torch.__version__, gpu=torch.cuda.get_device_name(device))
        cfg = deepspeed_config(a.peer, a) if ds else None
        if infinity:
            import shutil
            os.makedirs(a.nvme_path, exist_ok=True)
            result["nvme_free_gib"] = gib(shutil.disk_usage(a.nvme_path).free)
            result["nvme_states_gib"] = gib(12 * num_params(p))
        phase("model construction", write=True)
        t_start = clock["t_start"] = time.perf_counter()
        if a.peer.startswith("fsdp2_plain"):
            model, tv, attn = plain_model(torch, a, device)
        elif infinity:
            try:  # transformers' documented use without its Trainer: it then knows the model is under ZeRO-3
                from transformers.integrations import HfDeepSpeedConfig
                hf_ds = HfDeepSpeedConfig(cfg)  # noqa: F841 - held (transformers keeps a weakref) to the end
                result["hf_deepspeed_config"] = True
            except Exception as e:  # noqa: BLE001 - e.g. its accelerate version check: go on without it
                result["hf_deepspeed_config"] = f"not used: {type(e).__name__}: {e}"[:300]
            zinit = deepspeed.zero.Init(config_dict_or_path=cfg, remote_device="cpu", pin_memory=True)
            model, tv, attn = hf_model(torch, a, device, zero_init=zinit)
        else:
            model, tv, attn = hf_model(torch, a, device)
        torch.cuda.synchronize()
        result["init_model_s"] = time.perf_counter() - t_start
        result["versions"]["transformers"] = tv
        result["attn_implementation"] = attn
        # zero.Init leaves each parameter an empty tensor; ds_numel is its full size
        result["params"] = sum(getattr(q, "ds_numel", q.numel()) for q in model.parameters())
        print(f"# {a.peer}: model built in {result['init_model_s']:.1f} s", flush=True)
        if ds:
            phase("deepspeed.initialize", write=True)
            result["config"] = cfg
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
            model = None
            opt_name = type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__
        else:
            phase("fully_shard", write=True)
            try:
                from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
            except ImportError:
                from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
            kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
            if a.peer.endswith("_offload"):
                kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
            for layer in model.model.layers:
                fully_shard(layer, **kw)
            fully_shard(model, **kw)
            opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=BETAS, eps=EPS,
                                    weight_decay=a.weight_decay, fused=True)
            result["config"] = fsdp2_plan(a.peer)
            opt_name = "AdamW(fused=True)"
        torch.cuda.synchronize()
        result["init_s"] = time.perf_counter() - t_start
        result["init_done"] = True
        result["optimizer"] = opt_name
        print(f"# {a.peer} on {a.preset}: {result['params']} parameters (zero's count {num_params(p)}), "
              f"attention {attn}, optimizer {opt_name}, set-up {result['init_s']:.1f} s; "
              f"versions {json.dumps(result['versions'])}", flush=True)
        import gc
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        result["status"] = "running"
        V = p["vocab_size"]
        fpt = result["flops_per_token"]
        tokens = a.batch * a.seq
        net = engine if ds else model
        for s in range(a.steps):
            # The step's start is written outside the timed part; ZeRO-Infinity's steps (tens of seconds)
            # also write each micro batch's phase, so that a crash (no exception) leaves where it died.
            phase(f"step {s + 1}", write=True)
            batch_rows = rows[window_rows(s, a.batch, windows)]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss_sum = None
            for k in range(gas):
                where = f"step {s + 1}" + (f" micro batch {k + 1}/{gas}" if gas > 1 else "")
                phase(where + " forward", write=infinity)
                x = (batch_rows if gas == 1 else batch_rows[k * micro:(k + 1) * micro]).to(device, non_blocking=False)
                inp, tgt = x[:, :-1], x[:, 1:]
                logits = net(input_ids=inp, use_cache=False).logits
                loss = F.cross_entropy(logits.float().reshape(-1, V), tgt.reshape(-1))
                phase(where + " backward", write=infinity)
                if ds:
                    engine.backward(loss)  # DeepSpeed scales by 1/gradient_accumulation_steps itself
                    if k + 1 < gas:
                        phase(where + " engine.step (off the boundary)", write=infinity)
                        engine.step()  # off the boundary: DeepSpeed counts the micro batch, no update
                elif gas > 1:
                    (loss / gas).backward()  # the step's gradient is the mean over its rows, as at GAS 1
                else:
                    loss.backward()
                if gas > 1:
                    loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
                    del logits, loss, x
                if infinity:  # its micro batches take seconds to minutes: show the pace before a step ends
                    print(f"# {where}: {time.perf_counter() - t0:.1f} s into the step", flush=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            phase(f"step {s + 1} optimizer step", write=infinity)
            if ds:
                engine.step()
            else:
                if a.clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            dt = t2 - t0
            step_loss = loss.item() if gas == 1 else loss_sum.item() / gas  # the mean over the step's rows
            rec = {"step": s + 1, "loss": step_loss, "step_s": dt, "fwd_bwd_s": t1 - t0, "opt_s": t2 - t1,
                   "tokens": tokens, "tokens_per_s": tokens / dt, "model_tflops": tokens * fpt / dt / 1e12,
                   "gpu_peak_gib": gib(torch.cuda.max_memory_allocated()), "host_peak_gib": gib(host_peak_bytes())}
            if gas == 1:
                del logits, loss, x
            result["steps"].append(rec)
            phase(f"after step {s + 1}")
            save()
            print(f"# step {s + 1}: {dt:.3f} s (fwd+bwd {rec['fwd_bwd_s']:.3f}, step {rec['opt_s']:.3f}), "
                  f"{rec['tokens_per_s']:.0f} tok/s, {rec['model_tflops']:.1f} TFLOPS, loss {rec['loss']:.4f}, "
                  f"peak {rec['gpu_peak_gib']:.2f} GiB GPU, {rec['host_peak_gib']:.2f} GiB host", flush=True)
        timed = [r["step_s"] for r in result["steps"][1:]]
        med = statistics.median(timed)
        result["median"] = {"step_s": med, "tokens_per_s": tokens / med, "model_tflops": tokens * fpt / med / 1e12}
        result["peak_gpu_gib"] = gib(torch.cuda.max_memory_allocated())
        result["host_peak_gib"] = gib(host_peak_bytes())
        result["status"] = "ok"
        phase("done")
        save()
        print("LLMPEER " + json.dumps({k: result[k] for k in ("name", "preset", "tokens_per_step", "median",
                                                              "peak_gpu_gib", "host_peak_gib")}), flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - recorded (out of memory is a result), then exit 1
        result["host_peak_gib"] = gib(host_peak_bytes())
        try:
            result["peak_gpu_gib"] = gib(torch.cuda.max_memory_allocated())
        except Exception:  # noqa: BLE001 - a broken CUDA context must not cost the error's record
            pass
        return fail(f"{type(e).__name__}: {str(e)[:2000]}", e)
    finally:
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the numbers are out; teardown is best effort
            pass


def main(argv=None):
    a = parse_args(argv)
    if a.make_tokens:
        n = make_tokens(a.make_tokens, a.vocab, a.windows * (a.seq + 1), a.seed)
        print(f"llm_peers: {a.make_tokens}: {n} random ids below {a.vocab} (seed {a.seed}), "
              f"{a.windows} windows of {a.seq + 1}")
        return 0
    for line in plan_text(a):
        print(line)
    if a.ours:
        flags, cfg = write_ours(a)
        print(f"# ours {a.ours}: {OURS[a.ours]['label']}; config {json.dumps(cfg, sort_keys=True)}")
        print(" ".join(flags))
        if a.dry_run:
            print("dry run ok")
        return 0
    if a.peer.startswith("deepspeed"):
        print(f"# {a.peer}: {PEERS[a.peer]}; config {json.dumps(deepspeed_config(a.peer, a), sort_keys=True)}")
    else:
        print(f"# {a.peer}: {PEERS[a.peer]}; {fsdp2_plan(a.peer)}")
    print(f"# result: {a.out}")
    if a.dry_run:
        print("dry run ok")
        return 0
    return run_peer(a)


if __name__ == "__main__":
    sys.exit(main())

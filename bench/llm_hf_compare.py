"""zero_llm against Hugging Face transformers on the same HF directory and the same tokens.

Run on the GPU machine (transformers, torch, tokenizers there) by bench/run_llm_h200.sh:
  python3 bench/llm_hf_compare.py --zero-llm .carry/bin/zero_llm --out $OUT/hf

1. A Qwen3ForCausalLM with random weights (torch seed 0) saved by save_pretrained (fp32 safetensors),
   and a token stream: the text under /usr/share/common-licenses and Python's standard library,
   tokenized by a byte-level BPE trained with the tokenizers library (vocab 4096), as .bin.
2. Step-1 loss: transformers (bf16 weights, SDPA) and zero_llm --eval-only (--device cuda, bf16 and
   --device cpu, fp32) over the same windows.
3. Training: 100 AdamW steps (lr 1e-3 constant, betas 0.9/0.95, eps 1e-8, wd 0.1, clip 1.0, fp32
   master weights, bf16 compute) on the same rows in the same order (zero_llm --sequential-data);
   both loss curves written to a CSV and an SVG.
4. zero_llm's export after those steps loaded by from_pretrained: its loss on the eval windows next to
   the eval_loss zero_llm printed.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch


def log(*a):
    print(*a, flush=True)


def corpus_text(max_bytes):
    parts, total = [], 0
    roots = ["/usr/share/common-licenses"] + sorted(
        os.path.join("/usr/lib", d) for d in os.listdir("/usr/lib") if d.startswith("python3."))
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "test", "tests"))
            for f in sorted(filenames):
                if root.endswith("licenses") or f.endswith(".py"):
                    p = os.path.join(dirpath, f)
                    if os.path.islink(p):
                        continue
                    try:
                        t = open(p, encoding="utf-8").read()
                    except (UnicodeDecodeError, OSError):
                        continue
                    parts.append(t)
                    total += len(t)
                    if total >= max_bytes:
                        return "\n\n".join(parts)[:max_bytes]
    return "\n\n".join(parts)


def make_data(out, vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    text = corpus_text(8 << 20)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ids = np.array(tok.encode(text).ids, dtype=np.uint32)
    ids.tofile(os.path.join(out, "tokens.bin"))
    log(f"data: {len(text)} bytes -> {len(ids)} tokens (vocab {tok.get_vocab_size()})")
    return ids


def windows(ids, seq):
    n = len(ids) // (seq + 1)
    return torch.from_numpy(ids[: n * (seq + 1)].astype(np.int64)).view(n, seq + 1)


def hf_loss(model, w, batch=8):
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, w.shape[0], batch):
            x = w[i:i + batch].cuda()
            logits = model(input_ids=x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                     reduction="sum")
            tot += loss.item()
            cnt += x[:, 1:].numel()
    return tot / cnt, cnt


def hf_train(model, tw, a, vocab, lr, wd, clip, autocast):
    """a.steps AdamW steps of `model` on rows s * batch + i of `tw` (zero_llm --sequential-data's order)."""
    model = model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    losses = []
    for s in range(a.steps):
        rows = [(s * a.batch + i) % tw.shape[0] for i in range(a.batch)]
        x = tw[rows].cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def run(cmd):
    log("$ " + " ".join(cmd))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    log(p.stdout[-4000:] + p.stderr[-4000:])
    log(f"(exit {p.returncode}, {time.time() - t0:.1f} s)")
    if p.returncode != 0:
        raise SystemExit(f"command failed: {cmd}")
    return p.stdout


def parse_eval(out):
    for line in out.splitlines():
        if line.startswith("eval_loss="):
            return float(line.split()[0].split("=")[1])
    raise SystemExit("no eval_loss line")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zero-llm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--noise-floor", action="store_true",
                    help="only transformers against itself: bf16 autocast vs fp32 over the same steps")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    vocab = 4096
    ids = make_data(a.out, vocab)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="float32")
    model = Qwen3ForCausalLM(cfg)
    hf_dir = os.path.join(a.out, "init")
    model.save_pretrained(hf_dir, safe_serialization=True)
    log("init model: %d parameters saved to %s" % (sum(p.numel() for p in model.parameters()), hf_dir))

    w = windows(ids, a.seq)
    ev = w[-a.eval_windows:]                       # eval: the last windows
    np.asarray(ev.numpy().reshape(-1), dtype=np.uint32).tofile(os.path.join(a.out, "eval.bin"))
    train_ids = ids[: (w.shape[0] - a.eval_windows) * (a.seq + 1)]
    train_ids.tofile(os.path.join(a.out, "train.bin"))
    tw = windows(train_ids, a.seq)

    lr, wd, clip = 1e-3, 0.1, 1.0
    if a.noise_floor:
        # Two transformers runs from the same weights on the same rows, bf16 autocast and fp32: how far
        # bf16 rounding alone moves the 100-step curve (the scale of zero_llm vs transformers).
        bf = hf_train(Qwen3ForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).cuda(), tw, a, vocab, lr, wd,
                      clip, autocast=True)
        fp = hf_train(Qwen3ForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).cuda(), tw, a, vocab, lr, wd,
                      clip, autocast=False)
        rel = [abs(x - y) / y for x, y in zip(bf, fp)]
        res = {"hf_bf16_first_last": [bf[0], bf[-1]], "hf_fp32_first_last": [fp[0], fp[-1]],
               "max_rel_loss_diff": max(rel), "mean_rel_loss_diff_last10": sum(rel[-10:]) / 10}
        with open(os.path.join(a.out, "noise.csv"), "w") as f:
            f.write("step,hf_bf16_loss,hf_fp32_loss\n")
            for s, (x, y) in enumerate(zip(bf, fp)):
                f.write(f"{s + 1},{x:.6f},{y:.6f}\n")
        log("NOISE " + json.dumps(res))
        return

    # --- step-1 loss -------------------------------------------------------------------------
    res = {}
    m16 = Qwen3ForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    res["hf_bf16_init_loss"], cnt = hf_loss(m16, ev)
    m32 = Qwen3ForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="sdpa").cuda()
    res["hf_fp32_init_loss"], _ = hf_loss(m32, ev)
    del m16
    out = run([a.zero_llm, "--model", hf_dir, "--data", os.path.join(a.out, "eval.bin"), "--eval-only",
               "--seq", str(a.seq), "--device", "cuda", "--nproc", "1", "--batch", str(a.batch)])
    res["zero_cuda_bf16_init_loss"] = parse_eval(out)
    out = run([a.zero_llm, "--model", hf_dir, "--data", os.path.join(a.out, "eval.bin"), "--eval-only",
               "--seq", str(a.seq), "--device", "cpu", "--nproc", "1", "--batch", str(a.batch)])
    res["zero_cpu_fp32_init_loss"] = parse_eval(out)
    res["eval_targets"] = cnt
    log(json.dumps(res, indent=1))

    # --- 100 steps ----------------------------------------------------------------------------
    ds = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1, "gradient_clipping": clip,
          "bf16": {"enabled": True}, "steps_per_print": 10,
          "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": wd}},
          "zero_optimization": {"stage": 3}}
    cfg_path = os.path.join(a.out, "ds.json")
    json.dump(ds, open(cfg_path, "w"))
    zero_dir = os.path.join(a.out, "zero_trained")
    out = run([a.zero_llm, "--model", hf_dir, "--data", os.path.join(a.out, "train.bin"), "--sequential-data",
               "--config", cfg_path, "--seq", str(a.seq), "--device", "cuda", "--nproc", "1", "--steps", str(a.steps),
               "--log-json", os.path.join(a.out, "zero.jsonl"), "--plot", "none", "--eval-windows", "0",
               "--print-every", "10", "--export-hf", zero_dir])
    zero_losses = [json.loads(l)["loss"] for l in open(os.path.join(a.out, "zero.jsonl"))]

    t0 = time.time()
    hf_losses = hf_train(m32, tw, a, vocab, lr, wd, clip, autocast=True)
    log(f"hf: {a.steps} steps in {time.time() - t0:.1f} s")
    with open(os.path.join(a.out, "curves.csv"), "w") as f:
        f.write("step,hf_loss,zero_loss\n")
        for s, (h, z) in enumerate(zip(hf_losses, zero_losses)):
            f.write(f"{s + 1},{h:.6f},{z:.6f}\n")
    rel = [abs(h - z) / h for h, z in zip(hf_losses, zero_losses)]
    res["train_steps"] = len(zero_losses)
    res["loss_first"] = [hf_losses[0], zero_losses[0]]
    res["loss_last"] = [hf_losses[-1], zero_losses[-1]]
    res["max_rel_loss_diff"] = max(rel)
    res["mean_rel_loss_diff_last10"] = sum(rel[-10:]) / 10
    res["hf_trained_eval"], _ = hf_loss(model, ev)

    # --- our export, loaded by transformers ----------------------------------------------------------
    out = run([a.zero_llm, "--model", zero_dir, "--data", os.path.join(a.out, "eval.bin"), "--eval-only",
               "--seq", str(a.seq), "--device", "cuda", "--nproc", "1", "--batch", str(a.batch)])
    res["zero_trained_eval_printed"] = parse_eval(out)
    mz = Qwen3ForCausalLM.from_pretrained(zero_dir, torch_dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    res["hf_loads_zero_export_eval"], _ = hf_loss(mz, ev)
    log("RESULT " + json.dumps(res))
    json.dump(res, open(os.path.join(a.out, "result.json"), "w"), indent=1)


if __name__ == "__main__":
    main()

"""Llama 3's rope_scaling ("llama3") in zero_llm against Hugging Face transformers, on the GPU machine.

  python3 bench/llm_rope_compare.py --zero-llm .carry/llm/bin/zero_llm --out $OUT/rope

A LlamaForCausalLM with random weights (torch seed 0, fp32) and rope_scaling llama3 whose
original_max_position_embeddings (32) is far below the sequence (256), so the scaling changes most
of the rotary frequencies inside one window (at Llama 3.1's 8192 it would only touch positions past
8192). Its directory is evaluated by transformers (fp32, eager attention) and by zero_llm --eval-only
(--device cpu, fp32) over the same windows of random token ids. The same weights with rope_scaling
removed from config.json are evaluated the same way: the control that shows the comparison is
sensitive to the scaling (both sides move by far more than they differ). Also prints the largest
difference between transformers' inv_freq buffer and the unscaled frequencies, for scale.
Prints one RESULT json line.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_hf_compare import parse_eval, run  # noqa: E402  (the same command runner and eval-line parser)


def hf_loss(model, w):
    with torch.no_grad():
        logits = model(input_ids=w[:, :-1]).logits.double()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1)).item()


def zero_loss(zero_llm, model_dir, data, seq):
    return parse_eval(run([zero_llm, "--model", model_dir, "--data", data, "--eval-only", "--seq", str(seq),
                           "--device", "cpu", "--nproc", "1", "--batch", "4"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zero-llm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--windows", type=int, default=8)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    vocab = 512
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, rope_scaling=scaling,
                      torch_dtype="float32", attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    # Larger weights than the default init so attention is far from uniform and positions matter.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    scaled_dir, plain_dir = os.path.join(a.out, "scaled"), os.path.join(a.out, "plain")
    model.save_pretrained(scaled_dir, safe_serialization=True)
    shutil.copytree(scaled_dir, plain_dir, dirs_exist_ok=True)
    conf = json.load(open(os.path.join(plain_dir, "config.json")))
    conf.pop("rope_scaling", None)
    if isinstance(conf.get("rope_parameters"), dict):  # transformers 5 writes rope_parameters
        conf["rope_parameters"] = {"rope_type": "default", "rope_theta": conf["rope_parameters"].get("rope_theta", 5e5)}
    json.dump(conf, open(os.path.join(plain_dir, "config.json"), "w"), indent=1)
    print("scaled config:", json.dumps({k: conf_v for k, conf_v in json.load(open(os.path.join(scaled_dir, "config.json"))).items()
                                         if "rope" in k}), flush=True)
    print("plain config:", json.dumps({k: v for k, v in conf.items() if "rope" in k}), flush=True)

    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=a.windows * (a.seq + 1)).astype(np.uint32)
    data = os.path.join(a.out, "tokens.bin")
    ids.tofile(data)
    w = torch.from_numpy(ids.astype(np.int64)).view(a.windows, a.seq + 1)

    res = {}
    for name, d in (("scaled", scaled_dir), ("plain", plain_dir)):
        m = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        inv = m.model.rotary_emb.inv_freq.double()
        res[name + "_inv_freq_first_last"] = [inv[0].item(), inv[-1].item()]
        if name == "scaled":
            base = 1.0 / (5e5 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
            res["scaled_inv_freq_changed"] = int((inv.float() != base.float()).sum().item())
        res["hf_" + name] = hf_loss(m, w)
        res["zero_" + name] = zero_loss(a.zero_llm, d, data, a.seq)
        res[name + "_rel_diff"] = abs(res["zero_" + name] - res["hf_" + name]) / res["hf_" + name]
    res["scaling_moves_hf_by"] = abs(res["hf_scaled"] - res["hf_plain"]) / res["hf_plain"]
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()

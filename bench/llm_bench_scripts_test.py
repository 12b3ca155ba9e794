"""The transformer benchmark's scripts without a GPU or torch (issue 21): bench/llm_peers.py's preset
table against models/llama/config.cc, its counts against the C++ test's and DEVICE.md's figures, the
token file, every peer's and every configuration of ours' dry run and the argument errors, the rows'
order against zero_llm --sequential-data's formula, bench/llm_table.py's figures and ratios on a
fabricated results folder (failed, killed and crashed rows included), bench/run_llm_bench.sh's dry run
(without zero_llm), and run_peer end to end against stand-ins for torch, numpy, deepspeed and transformers
(FAKE_MODULES: GAS's micro batches and calls, zero.Init around the model, the record of a failure and of a
SIGTERM in the middle of a step)."""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEERS_PY = os.path.join(HERE, "llm_peers.py")
TABLE_PY = os.path.join(HERE, "llm_table.py")
RUN_SH = os.path.join(HERE, "run_llm_bench.sh")
sys.path.insert(0, HERE)
import llm_peers  # noqa: E402
import llm_table  # noqa: E402


def run_script(*args, script=PEERS_PY):
    """The script as a command (a few calls: most checks call main() in this process, which is faster)."""
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def run(*args, script=PEERS_PY):
    """main(args) of llm_peers.py or llm_table.py in this process: (exit status, stdout, stderr)."""
    main = llm_table.main if script == TABLE_PY else llm_peers.main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as e:  # argparse's errors
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_text(path):
    with open(path) as f:
        return f.read()


class Tmp(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.tokens = os.path.join(self.dir, "tokens.bin")
        # 24 windows of 2049 ids below 128256: enough for 6 steps of 4 rows, wrapping at 8 rows per step.
        rc, out, err = run("--make-tokens", self.tokens, "--seq", "2048", "--windows", "24", "--seed", "3")
        self.assertEqual(rc, 0, err)

    def tearDown(self):
        self.tmp.cleanup()


class PresetTest(unittest.TestCase):
    def test_presets_are_the_cpp_ones(self):
        src = read_text(os.path.join(ROOT, "models", "llama", "config.cc"))
        body = src[src.index("Presets() {"):]
        body = body[: body.index("return *presets;")]
        cpp = {}
        for name, args in re.findall(r'\{"([^"]+)",\s*Shape\(([^)]*)\)\}', body, re.S):
            vals = [v.strip() for v in args.split(",")]
            arch = {"kQwen3Architecture": llm_peers.QWEN3, "kLlamaArchitecture": llm_peers.LLAMA}[vals[0]]
            ints = [int(v) for v in vals[1:8]]
            cpp[name] = (arch, *ints, float(vals[8]), float(vals[9]), vals[10] == "true", *[int(v) for v in vals[11:14]])
        self.assertEqual(sorted(cpp), sorted(llm_peers.PRESETS))
        for name, values in cpp.items():
            mine = tuple(llm_peers.PRESETS[name][f] for f in llm_peers.PRESET_FIELDS)
            self.assertEqual(mine, values, name)

    def test_counts(self):
        P = llm_peers.PRESETS
        # models/llama/config_test.cc's figures
        self.assertEqual(llm_peers.num_params(P["qwen3-0.6b"]), 596049920)
        self.assertEqual(llm_peers.num_params(P["llama-3.2-3b"]), 3212749824)
        self.assertEqual(llm_peers.num_params(P["llama-3.1-8b"]), 8030261248)
        self.assertEqual(llm_peers.num_params(P["tiny"]), 131456)
        tiny = P["tiny"]
        self.assertEqual(llm_peers.train_flops_per_token(tiny, 128),
                         6.0 * llm_peers.matmul_params(tiny) + 6.0 * 2 * 128 * 4 * 16)
        # q 1024x2048, k and v 1024x1024 each, o 2048x1024, MLP 3x1024x3072: 15728640 per layer, 28 layers,
        # plus the tied lm_head 151936x1024.
        self.assertEqual(llm_peers.matmul_params(P["qwen3-0.6b"]), 28 * 15728640 + 151936 * 1024)
        # DEVICE.md's peers: 66.2k tok/s is 284 model TFLOPS on qwen3-0.6b, 22.2k is 450 on llama-3.2-3b.
        for preset, tps, tflops in (("qwen3-0.6b", 66.2e3, 284), ("llama-3.2-3b", 22.2e3, 450)):
            got = tps * llm_peers.train_flops_per_token(P[preset], 2048) / 1e12
            self.assertLess(abs(got / tflops - 1), 0.01, (preset, got))

    def test_rows_are_zero_llms_sequential_rows(self):
        # zero_llm (TrainRows): micro step m of step s at world 1 reads windows ((s*GAS + m) * micro + i).
        for batch, gas in ((8, 1), (8, 8), (8, 2), (4, 4)):
            micro = batch // gas
            for s in range(4):
                zero = [((s * gas + m) * micro + i) % 30 for m in range(gas) for i in range(micro)]
                self.assertEqual(llm_peers.window_rows(s, batch, 30), zero, (batch, gas, s))


class TokensTest(Tmp):
    def test_make_tokens_is_repeatable(self):
        data = read_bytes(self.tokens)
        self.assertEqual(len(data), 24 * 2049 * 4)
        again = os.path.join(self.dir, "again.bin")
        run("--make-tokens", again, "--seq", "2048", "--windows", "24", "--seed", "3")
        self.assertEqual(read_bytes(again), data)
        run("--make-tokens", again, "--seq", "2048", "--windows", "24", "--seed", "4")
        self.assertNotEqual(read_bytes(again), data)
        self.assertEqual(llm_peers.check_tokens(self.tokens, llm_peers.TOKEN_VOCAB), 24 * 2049)
        self.assertEqual(llm_peers.TOKEN_VOCAB, 128256)

    def test_bad_token_files(self):
        bad = os.path.join(self.dir, "bad.bin")
        with open(bad, "wb") as f:
            f.write(read_bytes(self.tokens)[:4000] + (600000).to_bytes(4, "little") + b"\0\0\0\0")
        rc, out, err = run("--peer", "fsdp2", "--tokens", bad, "--out", os.path.join(self.dir, "r.json"), "--dry-run")
        self.assertEqual(rc, 2)
        self.assertIn("id 600000 at position 1000", err)
        with open(bad, "wb") as f:
            f.write(b"\1\2\3")
        rc, out, err = run("--peer", "fsdp2", "--tokens", bad, "--out", os.path.join(self.dir, "r.json"), "--dry-run")
        self.assertEqual(rc, 2)
        self.assertIn("not a multiple of 4", err)
        rc, out, err = run("--peer", "fsdp2", "--tokens", bad + ".none", "--out", os.path.join(self.dir, "r.json"),
                           "--dry-run")
        self.assertEqual(rc, 2)
        self.assertIn("cannot read", err)


class DryRunTest(Tmp):
    def test_every_peer(self):
        for preset, batch in (("qwen3-0.6b", "8"), ("llama-3.2-3b", "4")):
            for peer in llm_peers.PEERS:
                out_json = os.path.join(self.dir, f"{peer}.json")
                nvme = ["--nvme-path", os.path.join(self.dir, "nvme")] if peer == "deepspeed_infinity" else []
                rc, out, err = run("--peer", peer, "--preset", preset, "--seq", "2048", "--batch", batch,
                                   "--steps", "6", "--tokens", self.tokens, "--out", out_json, "--dry-run", *nvme)
                self.assertEqual(rc, 0, err)
                self.assertIn("dry run ok", out)
                self.assertFalse(os.path.exists(out_json), "a dry run writes no result")
                rows = 6 * int(batch)
                self.assertIn(f"windows 0..{rows - 1} in order, {batch} per step", out)
                if rows > 24:
                    self.assertIn("(wraps: the file holds 24)", out)
                self.assertIn(f"params={llm_peers.num_params(llm_peers.PRESETS[preset])}", out)
                if peer.startswith("deepspeed"):
                    cfg = json.loads(re.search(r"; config (\{.*\})$", out, re.M).group(1))
                    self.assertEqual(cfg["zero_optimization"]["stage"], 2 if "_z2" in peer else 3)
                    offload = peer.endswith("_offload") or peer == "deepspeed_infinity"
                    self.assertEqual("offload_optimizer" in cfg["zero_optimization"], offload)
                    self.assertEqual(cfg["optimizer"]["params"].get("torch_adam", False), not offload)
                    self.assertEqual(cfg["train_micro_batch_size_per_gpu"], int(batch))
                    self.assertEqual(cfg["gradient_accumulation_steps"], 1)
                    self.assertNotIn("gradient accumulation", out)  # GAS 1: the plan of before --gas
                    self.assertTrue(cfg["bf16"]["enabled"])
                    self.assertEqual(cfg["gradient_clipping"], 0.0)
                else:
                    self.assertIn("reduce_dtype=float32", out)
                    self.assertEqual("CPUOffloadPolicy(pin_memory=True)" in out, peer.endswith("_offload"))
                    self.assertEqual("plain PyTorch model" in out, "_plain" in peer)

    def test_every_configuration_of_ours(self):
        V, H = 151936, 1024
        for name, o in llm_peers.OURS.items():
            prefix = os.path.join(self.dir, f"ours_{name}")
            rc, out, err = run("--ours", name, "--preset", "qwen3-0.6b", "--batch", "8", "--clip", "0.5",
                               "--tokens", self.tokens, "--prefix", prefix)
            self.assertEqual(rc, 0, err)
            flags = out.strip().splitlines()[-1].split()
            for f in ("--sequential-data", "--holdout", "--log-json", "--config", "--data"):
                self.assertIn(f, flags)
            self.assertEqual(flags[flags.index("--holdout") + 1], "0")
            self.assertEqual(flags[flags.index("--config") + 1], prefix + ".ds.json")
            cfg = json.loads(read_text(prefix + ".ds.json"))
            meta = json.loads(read_text(prefix + ".meta.json"))
            self.assertEqual(meta["config"], cfg)
            self.assertEqual((meta["kind"], meta["name"], meta["tokens_per_step"]), ("ours", name, 8 * 2048))
            self.assertEqual(cfg["gradient_accumulation_steps"], o["gas"])
            self.assertEqual(cfg["train_micro_batch_size_per_gpu"] * o["gas"], 8)
            self.assertEqual(cfg["gradient_clipping"], 0.5)
            self.assertEqual(cfg["communication_data_type"], "fp32")
            z = cfg["zero_optimization"]
            self.assertEqual(z["stage"], 3)
            if "offload_param" in z:
                self.assertGreaterEqual(z["offload_param"]["buffer_size"], V * H)
            if meta["counterpart"]:
                self.assertIn(meta["counterpart"], llm_peers.OURS)
            self.assertIn(meta["match"], llm_peers.PEERS)
        # GAS 8 needs rows per step in multiples of 8
        rc, out, err = run("--ours", "gas8_accgpu", "--batch", "4", "--tokens", self.tokens, "--prefix",
                           os.path.join(self.dir, "x"))
        self.assertEqual(rc, 2)
        self.assertIn("GAS 8", err)

    def test_deepspeed_infinity(self):
        # llama-2-13b's vocabulary is 32000: a token file of its own, as bench/run_llm_bench.sh writes it
        tok13 = os.path.join(self.dir, "tokens32k.bin")
        rc, out, err = run("--make-tokens", tok13, "--vocab", "32000", "--seq", "2048", "--windows", "8")
        self.assertEqual(rc, 0, err)
        nvme = os.path.join(self.dir, "swap", "ds")  # need not exist yet: the run makes it
        for preset, tokens, batch, gas in (("llama-2-13b", tok13, 128, 32), ("qwen3-4b", self.tokens, 16, 4)):
            out_json = os.path.join(self.dir, f"inf_{preset}.json")
            rc, out, err = run("--peer", "deepspeed_infinity", "--preset", preset, "--seq", "2048", "--batch",
                               str(batch), "--gas", str(gas), "--steps", "3", "--activation-checkpointing",
                               "--tokens", tokens, "--out", out_json, "--nvme-path", nvme, "--dry-run")
            self.assertEqual(rc, 0, err)
            self.assertIn("dry run ok", out)
            self.assertFalse(os.path.exists(out_json))
            self.assertFalse(os.path.exists(nvme), "a dry run makes no folder")
            cfg = json.loads(re.search(r"; config (\{.*\})$", out, re.M).group(1))
            self.assertEqual(cfg, llm_peers.deepspeed_config("deepspeed_infinity", llm_peers.parse_args(
                ["--peer", "deepspeed_infinity", "--preset", preset, "--batch", str(batch), "--gas", str(gas),
                 "--tokens", tokens, "--out", out_json, "--nvme-path", nvme])))
            z = cfg["zero_optimization"]
            self.assertEqual(z["stage"], 3)
            self.assertEqual(z["offload_optimizer"], {"device": "nvme", "nvme_path": nvme, "pin_memory": True,
                                                      "buffer_count": 4})
            self.assertEqual(z["offload_param"], {"device": "cpu", "pin_memory": True})
            self.assertEqual(cfg["train_micro_batch_size_per_gpu"], batch // gas)
            self.assertEqual(cfg["gradient_accumulation_steps"], gas)
            self.assertEqual(cfg["optimizer"]["type"], "AdamW")
            self.assertNotIn("torch_adam", cfg["optimizer"]["params"])  # DeepSpeedCPUAdam
            self.assertTrue(cfg["bf16"]["enabled"])
            self.assertIn(f"# gradient accumulation: {gas} micro batches of {batch // gas} rows per step", out)
            self.assertIn("deepspeed.zero.Init(config_dict_or_path=<the config below>, remote_device='cpu', "
                          "pin_memory=True)", out)
            n = llm_peers.num_params(llm_peers.PRESETS[preset])
            self.assertIn(f"12 bytes x {n} parameters = {12 * n / 2**30:.1f} GiB", out)
            self.assertIn("GiB free here", out)
            self.assertIn(", activation checkpointing", out)
        self.assertEqual(llm_peers.num_params(llm_peers.PRESETS["llama-2-13b"]), 13015864320)
        self.assertNotIn("torch", sys.modules)

    def test_gas_on_every_peer(self):
        for peer in llm_peers.PEERS:
            nvme = ["--nvme-path", os.path.join(self.dir, "nvme")] if peer == "deepspeed_infinity" else []
            rc, out, err = run("--peer", peer, "--batch", "8", "--gas", "4", "--tokens", self.tokens, "--out",
                               os.path.join(self.dir, "r.json"), "--dry-run", *nvme)
            self.assertEqual(rc, 0, err)
            self.assertIn("windows 0..47 in order, 8 per step", out)  # the rows of GAS 1, in the same order
            self.assertIn("# gradient accumulation: 4 micro batches of 2 rows per step (micro batch k of step s: "
                          "windows s*8 + k*2 .. + 1)", out)
            if peer.startswith("deepspeed"):
                cfg = json.loads(re.search(r"; config (\{.*\})$", out, re.M).group(1))
                self.assertEqual((cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]), (2, 4))
        # micro batch k of step s is rows k*micro.. of the step's window_rows: zero_llm's order at GAS 4
        rows = llm_peers.window_rows(2, 8, 30)
        self.assertEqual([rows[k * 2:(k + 1) * 2] for k in range(4)],
                         [[((2 * 4 + k) * 2 + i) % 30 for i in range(2)] for k in range(4)])

    def test_failed_run_is_recorded(self):
        # Without torch (this machine) the run itself fails at once: the JSON says where and why.
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            self.skipTest("torch is importable here: the run would start")
        out_json = os.path.join(self.dir, "inf.json")
        rc, out, err = run_script("--peer", "deepspeed_infinity", "--preset", "qwen3-4b", "--batch", "8", "--gas",
                                  "2", "--tokens", self.tokens, "--out", out_json, "--nvme-path",
                                  os.path.join(self.dir, "nvme"))
        self.assertEqual(rc, 1, out + err)
        r = json.loads(read_text(out_json))
        self.assertEqual((r["status"], r["phase"], r["gas"], r["micro_batch"]), ("error", "set-up", 2, 4))
        self.assertIn("not importable", r["error"])
        self.assertEqual(r["steps"], [])
        self.assertIn("failed in set-up", err)

    def test_as_commands(self):
        # As bench/run_llm_bench.sh calls them: a dry run imports no torch (none here; on a machine with torch
        # the in-process calls below check sys.modules), the table is a script of its own.
        rc, out, err = run_script("--peer", "deepspeed_z3_offload", "--tokens", self.tokens, "--out",
                                  os.path.join(self.dir, "r.json"), "--dry-run")
        self.assertEqual(rc, 0, err)
        self.assertIn("dry run ok", out)
        rc, out, err = run_script("--peer", "nope", "--tokens", self.tokens, "--dry-run")
        self.assertEqual(rc, 2)
        self.assertIn("--peer 'nope'", err)
        rc, out, err = run_script(self.dir, script=TABLE_PY)
        self.assertEqual(rc, 1)  # tokens.bin alone: no result
        self.assertNotIn("torch", sys.modules)

    def test_argument_errors(self):
        o = os.path.join(self.dir, "r.json")
        for args, text in ((["--peer", "fsdp3"], "--peer 'fsdp3'"), (["--peer", "fsdp2", "--preset", "gpt"], "--preset"),
                           (["--peer", "fsdp2", "--preset", "tiny"], "max_position_embeddings of tiny"),
                           (["--peer", "fsdp2", "--steps", "1"], "--steps 1"),
                           (["--peer", "fsdp2", "--batch", "0"], "--batch 0"),
                           (["--ours", "fast"], "--ours 'fast'")):
            rc, out, err = run(*args, "--tokens", self.tokens, "--out", o, "--prefix", o, "--dry-run")
            self.assertEqual(rc, 2, args)
            self.assertIn(text, err, args)
        rc, out, err = run("--peer", "fsdp2", "--tokens", self.tokens, "--out", "/nonexistent/dir/r.json", "--dry-run")
        self.assertEqual(rc, 2)
        self.assertIn("does not exist", err)
        rc, out, err = run("--peer", "fsdp2", "--out", o, "--dry-run")
        self.assertEqual(rc, 2)
        self.assertIn("--tokens FILE is required", err)
        for args, texts in ((["--peer", "deepspeed_infinity"], ["needs --nvme-path DIR"]),
                            (["--peer", "fsdp2", "--nvme-path", self.dir], ["only --peer deepspeed_infinity"]),
                            (["--peer", "deepspeed_z3", "--batch", "6", "--gas", "4"],
                             ["--batch 6 is not a multiple of --gas 4"]),
                            (["--peer", "deepspeed_infinity", "--nvme-path", self.dir, "--batch", "128", "--gas", "48"],
                             ["--batch 128 is not a multiple of --gas 48"]),
                            (["--peer", "fsdp2", "--gas", "0"], ["--gas 0"]),
                            (["--ours", "none", "--gas", "2"], ["--gas 2: for --peer runs only"])):
            rc, out, err = run(*args, "--tokens", self.tokens, "--out", o, "--prefix", o, "--dry-run")
            self.assertEqual(rc, 2, args)
            for text in texts:
                self.assertIn(text, err, args)

    def test_run_script_dry_run(self):
        env = dict(os.environ, ZERO_LLM="none", PRESETS="qwen3-0.6b llama-3.2-3b", OURS_CONFIGS="none gas8_accgpu",
                   FSDP_PEERS="fsdp2", DS_PEERS="deepspeed_z3_offload")
        p = subprocess.run(["bash", RUN_SH, "dryrun", os.path.join(self.dir, "dry")], capture_output=True, text=True,
                           env=env, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("dry run: 0 failure(s)", p.stdout)
        # GAS 8 is skipped where 4 rows per step cannot be split over 8 micro steps
        self.assertIn("ours gas8_accgpu on qwen3-0.6b", p.stdout)
        self.assertNotIn("ours gas8_accgpu on llama-3.2-3b", p.stdout)
        self.assertEqual(p.stdout.count("dry run ok: deepspeed_z3_offload"), 2)
        self.assertEqual(p.stdout.count("ours none on"), 2)


# A stand-in for torch, numpy, deepspeed and transformers (none is on this machine): just enough of their
# API for llm_peers.py's run_peer to run end to end on the CPU, logging each call (FAKE_LOG, JSON lines) so
# the tests see the micro batches' rows, the order of backward/step calls and zero.Init around the model;
# FAKE_FAIL=NAME:N raises in the Nth call of NAME, FAKE_HANG=NAME:N sleeps in it (for a SIGTERM).
FAKE_MODULES = {
    "fakelib.py": """
import json, os, time
COUNTS = {}
def log(name, **kw):
    COUNTS[name] = COUNTS.get(name, 0) + 1
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(dict(kw, call=name, n=COUNTS[name])) + "\\n")
    for var, act in (("FAKE_FAIL", "fail"), ("FAKE_HANG", "hang")):
        spec = os.environ.get(var, "")
        if spec and spec == f"{name}:{COUNTS[name]}":
            if act == "fail":
                raise RuntimeError(f"injected failure in {name} call {COUNTS[name]}")
            time.sleep(120)
STATE = {"in_zero_init": False}
""",
    "numpy.py": """
import array, sys
int64 = "int64"
class A(list):
    def astype(self, t):
        return self
    def __getitem__(self, k):
        r = list.__getitem__(self, k)
        return A(r) if isinstance(k, slice) else r
def fromfile(path, dtype):
    a = array.array("I")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return A(a)
""",
    "torch/__init__.py": """
import types
from fakelib import log
__version__ = "0.0-fake"
float32, bfloat16, int64 = "float32", "bfloat16", "int64"
class T:
    def __init__(self, rows=None, value=None):
        self.rows, self.value = rows, value
    def view(self, n, m):
        return T([list(self.rows[i * m:(i + 1) * m]) for i in range(n)])
    def __getitem__(self, k):
        if isinstance(k, list):
            return T([self.rows[i] for i in k])
        if isinstance(k, tuple):
            return T([r[k[1]] for r in self.rows[k[0]]])
        return T(self.rows[k])
    def to(self, *a, **kw):
        return self
    def float(self):
        return self
    def reshape(self, *a):
        return self
    def item(self):
        return float(self.value)
    def detach(self):
        return self
    def __add__(self, o):
        return T(value=self.value + o.value)
    def __truediv__(self, d):
        return T(value=self.value / d)
    def backward(self):
        log("loss.backward", value=self.value)
def from_numpy(a):
    return T(list(a))
class device:
    def __init__(self, *a):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *e):
        pass
def manual_seed(s):
    pass
class _Cuda:
    def is_available(self): return True
    def set_device(self, d): pass
    def get_device_name(self, d): return "fake GPU"
    def synchronize(self): pass
    def max_memory_allocated(self): return 1 << 30
    def reset_peak_memory_stats(self): pass
    def empty_cache(self): pass
cuda = _Cuda()
class _AdamW:
    def __init__(self, params, **kw): pass
    def step(self): log("opt.step")
    def zero_grad(self, set_to_none=True): pass
optim = types.SimpleNamespace(AdamW=_AdamW)
from . import nn, distributed
""",
    "torch/nn/__init__.py": "from . import functional\n",
    "torch/nn/functional.py": """
from torch import T
def cross_entropy(logits, tgt):
    return T(value=float(sum(r[0] for r in tgt.rows) % 97))
""",
    "torch/distributed/__init__.py": """
_on = [False]
def init_process_group(*a, **kw): _on[0] = True
def is_initialized(): return _on[0]
def destroy_process_group(): _on[0] = False
""",
    "torch/distributed/fsdp/__init__.py": """
class CPUOffloadPolicy:
    def __init__(self, **kw): pass
class MixedPrecisionPolicy:
    def __init__(self, **kw): pass
def fully_shard(m, **kw): pass
""",
    "deepspeed/__init__.py": """
import types
from fakelib import log, STATE
__version__ = "0.19.8-fake"
def init_distributed(dist_backend):
    import torch.distributed as d
    d._on[0] = True
class Init:
    def __init__(self, **kw):
        self.kw = kw
    def __enter__(self):
        log("zero.Init", remote_device=self.kw.get("remote_device"), pin_memory=self.kw.get("pin_memory"),
            config=self.kw.get("config_dict_or_path"))
        STATE["in_zero_init"] = True
    def __exit__(self, *e):
        STATE["in_zero_init"] = False
zero = types.SimpleNamespace(Init=Init)
class Engine:
    def __init__(self, model):
        self.model, self.optimizer = model, types.SimpleNamespace(optimizer=types.SimpleNamespace())
    def __call__(self, **kw):
        return self.model(**kw)
    def backward(self, loss):
        log("engine.backward", value=loss.value)
    def step(self):
        log("engine.step")
def initialize(model, model_parameters, config):
    log("deepspeed.initialize", config=config)
    return Engine(model), None, None, None
""",
    "transformers/__init__.py": """
import types
from fakelib import log, STATE
__version__ = "5.17-fake"
class _Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)
class _Param:
    def __init__(self, n, zero):
        self.n = n
        if zero:
            self.ds_numel = n
    def numel(self):
        return 0 if hasattr(self, "ds_numel") else self.n
class _Model:
    def __init__(self, cfg):
        log("model", in_zero_init=STATE["in_zero_init"], vocab=cfg.vocab_size)
        self.config = cfg
        self.model = types.SimpleNamespace(layers=[object()] * cfg.num_hidden_layers)
        self._p = [_Param(1000, STATE["in_zero_init"]), _Param(24, STATE["in_zero_init"])]
    def to(self, *a):
        return self
    def parameters(self):
        return iter(self._p)
    def gradient_checkpointing_enable(self, **kw):
        log("gradient_checkpointing_enable", **kw)
    def train(self):
        pass
    def __call__(self, input_ids, use_cache=False):
        log("forward", first_ids=[r[0] for r in input_ids.rows], width=len(input_ids.rows[0]))
        from torch import T
        return types.SimpleNamespace(logits=T(value=0))
Qwen3Config = LlamaConfig = _Cfg
class Qwen3ForCausalLM(_Model): pass
class LlamaForCausalLM(_Model): pass
from . import integrations
""",
    "transformers/integrations.py": """
from fakelib import log
class HfDeepSpeedConfig:
    def __init__(self, cfg):
        log("HfDeepSpeedConfig")
""",
}


class FakeTorchRunTest(Tmp):
    """run_peer end to end against the stand-ins above: GAS's micro batches, the calls DeepSpeed and FSDP2
    get, zero.Init around the model, and the record of a failure or a SIGTERM in the middle of a step."""

    def setUp(self):
        super().setUp()
        self.fake = os.path.join(self.dir, "fake")
        for name, src in FAKE_MODULES.items():
            path = os.path.join(self.fake, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write(path, src)
        self.log = os.path.join(self.dir, "calls.jsonl")
        self.out = os.path.join(self.dir, "r.json")

    def start(self, *args, env=None):
        e = dict(os.environ, PYTHONPATH=self.fake, FAKE_LOG=self.log, **(env or {}))
        return subprocess.Popen([sys.executable, PEERS_PY, *args, "--tokens", self.tokens, "--out", self.out],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)

    def peer(self, *args, env=None):
        p = self.start(*args, env=env)
        out, err = p.communicate(timeout=60)
        calls = [json.loads(line) for line in read_text(self.log).splitlines()] if os.path.exists(self.log) else []
        return p.returncode, out, err, json.loads(read_text(self.out)), calls

    def first_ids(self, windows):
        ids = read_bytes(self.tokens)
        return [int.from_bytes(ids[4 * w * 2049: 4 * w * 2049 + 4], "little") for w in windows]

    def test_infinity_gas(self):
        nvme = os.path.join(self.dir, "nvme", "ds")
        rc, out, err, r, calls = self.peer("--peer", "deepspeed_infinity", "--preset", "qwen3-4b", "--batch", "8",
                                           "--gas", "4", "--steps", "3", "--activation-checkpointing",
                                           "--nvme-path", nvme)
        self.assertEqual(rc, 0, out + err)
        self.assertTrue(os.path.isdir(nvme))
        self.assertEqual((r["status"], r["phase"], r["gas"], r["micro_batch"], len(r["steps"])), ("ok", "done", 4, 2, 3))
        self.assertTrue(r["init_done"])
        for k in ("init_s", "init_model_s", "nvme_free_gib", "nvme_states_gib", "median"):
            self.assertIn(k, r)
        self.assertEqual(r["params"], 1024)  # ds_numel, not the empty tensors zero.Init leaves
        names = [c["call"] for c in calls]
        # HfDeepSpeedConfig, then the model built inside zero.Init (with the run's config), then initialize
        self.assertEqual(names[:4], ["HfDeepSpeedConfig", "zero.Init", "model", "gradient_checkpointing_enable"])
        zi = calls[1]
        self.assertEqual((zi["remote_device"], zi["pin_memory"]), ("cpu", True))
        self.assertEqual(zi["config"], r["config"])
        self.assertTrue(calls[2]["in_zero_init"])
        self.assertEqual(names[4], "deepspeed.initialize")
        # per step: 4 x (forward, engine.backward), engine.step after each (3 off the boundary + the update)
        train = names[5:]
        self.assertEqual(train, ["forward", "engine.backward", "engine.step"] * 12)
        fwd = [c for c in calls if c["call"] == "forward"]
        for s in range(3):
            for k in range(4):
                c = fwd[4 * s + k]
                self.assertEqual(c["width"], 2048)
                self.assertEqual(c["first_ids"], self.first_ids(llm_peers.window_rows(s, 8, 24)[2 * k:2 * k + 2]))
        # the step's loss: the mean of its micro batches'
        losses = [c["value"] for c in calls if c["call"] == "engine.backward"]
        for s in range(3):
            self.assertAlmostEqual(r["steps"][s]["loss"], sum(losses[4 * s:4 * s + 4]) / 4)
        self.assertEqual(len(re.findall(r"^# step \d+: ", out, re.M)), 3)  # a progress line per step
        self.assertEqual(len(re.findall(r"^# step \d+ micro batch \d/4: [0-9.]+ s into the step$", out, re.M)), 12)

    def test_gas1_and_fsdp2(self):
        rc, out, err, r, calls = self.peer("--peer", "deepspeed_z3", "--batch", "4", "--steps", "2")
        self.assertEqual(rc, 0, out + err)
        names = [c["call"] for c in calls]
        self.assertNotIn("zero.Init", names)
        self.assertEqual(names, ["model", "deepspeed.initialize"] + ["forward", "engine.backward", "engine.step"] * 2)
        self.assertEqual(r["steps"][1]["loss"], calls[-2]["value"])
        os.remove(self.log)
        rc, out, err, r, calls = self.peer("--peer", "fsdp2", "--batch", "4", "--gas", "2", "--steps", "2")
        self.assertEqual(rc, 0, out + err)
        names = [c["call"] for c in calls]
        self.assertEqual(names, ["model"] + ["forward", "loss.backward", "forward", "loss.backward", "opt.step"] * 2)
        # backward of loss / GAS; the recorded loss is the mean of the micro batches' (unscaled) losses
        bw = [c["value"] for c in calls if c["call"] == "loss.backward"]
        self.assertAlmostEqual(r["steps"][0]["loss"], bw[0] + bw[1])

    def test_failure_mid_step(self):
        rc, out, err, r, calls = self.peer("--peer", "deepspeed_infinity", "--batch", "8", "--gas", "4", "--steps", "3",
                                           "--nvme-path", os.path.join(self.dir, "nvme"),
                                           env={"FAKE_FAIL": "engine.backward:7"})
        self.assertEqual(rc, 1)
        self.assertEqual((r["status"], r["phase"], r["error_type"]), ("error", "step 2 micro batch 3/4 backward",
                                                                     "RuntimeError"))
        self.assertEqual(r["error_message"], "injected failure in engine.backward call 7")
        self.assertIn("injected failure", r["traceback"])
        self.assertEqual(len(r["steps"]), 1)
        self.assertTrue(r["init_done"])
        self.assertIn("failed in step 2 micro batch 3/4 backward", err)
        # and in set-up: deepspeed.initialize
        rc, out, err, r, calls = self.peer("--peer", "deepspeed_infinity", "--batch", "8", "--gas", "4", "--steps", "3",
                                           "--nvme-path", os.path.join(self.dir, "nvme"),
                                           env={"FAKE_FAIL": "deepspeed.initialize:1"})
        self.assertEqual((rc, r["status"], r["phase"], r["init_done"]), (1, "error", "deepspeed.initialize", False))
        self.assertIsInstance(r["init_s"], float)
        self.assertEqual(r["steps"], [])

    def test_sigterm_mid_step(self):
        import time
        p = self.start("--peer", "deepspeed_infinity", "--batch", "8", "--gas", "4", "--steps", "3",
                       "--nvme-path", os.path.join(self.dir, "nvme"), env={"FAKE_HANG": "engine.step:8"})
        deadline = time.time() + 60
        while time.time() < deadline:  # engine.step call 8: step 2's boundary update
            if os.path.exists(self.log) and '"engine.step", "n": 8' in read_text(self.log):
                break
            time.sleep(0.1)
        t0 = time.time()
        p.terminate()  # as `timeout` does: it dies at once, with the Python stack in its log
        out, err = p.communicate(timeout=60)
        self.assertLess(time.time() - t0, 10)
        self.assertEqual(p.returncode, -15, err)
        self.assertIn("deepspeed/__init__.py\", line 26 in step", err)  # faulthandler's stack
        r = json.loads(read_text(self.out))
        self.assertEqual((r["status"], r["phase"]), ("running", "step 2 optimizer step"))
        self.assertEqual(len(r["steps"]), 1)
        rc, table, _ = run(self.dir, script=TABLE_PY)
        self.assertIn("cut: cut after 1 of 3 steps in step 2 optimizer step (killed, timed out or crashed", table)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class TableTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def ours(self, name, tps, peak_line="peak 10.3 GiB device, 203 MiB host per rank", steps=6, gpumem=None):
        o = llm_peers.OURS[name]
        base = f"ours_qwen3-0.6b_{name}"
        meta = {"kind": "ours", "impl": "zero", "name": name, "label": o["label"], "preset": "qwen3-0.6b",
                "seq": 2048, "batch": 8, "gas": o["gas"], "tokens_per_step": 16384, "steps_planned": 6,
                "match": o["match"], "counterpart": o["counterpart"], "target": o["target"],
                "jsonl": base + ".jsonl", "log": base + ".log"}
        write(os.path.join(self.dir, base + ".meta.json"), json.dumps(meta))
        t = 16384 / tps
        # the first step slow (not in the median), the others around the median
        times = [10 * t, t, 1.1 * t, 0.9 * t, t, 1.05 * t][:steps]
        write(os.path.join(self.dir, base + ".jsonl"),
              "".join(json.dumps({"step": i + 1, "loss": 12.0 - i, "step_s": s, "tokens": 16384}) + "\n"
                      for i, s in enumerate(times)))
        write(os.path.join(self.dir, base + ".log"), "zero_llm: Qwen3ForCausalLM ...\nstep 5/6 ... peak 1.00 GiB device, "
              "1 MiB host per rank\nstep 6/6  loss 7.0  " + peak_line + "\ndone\n")
        if gpumem:
            write(os.path.join(self.dir, base + ".gpumem"), "".join(f"{m}\n" for m in gpumem))

    def test_failed_infinity_rows(self):
        self.peer("deepspeed_z3_offload", 1000)
        base = {"kind": "peer", "name": "deepspeed_infinity", "label": llm_peers.PEERS["deepspeed_infinity"],
                "seq": 2048, "batch": 128, "gas": 32, "tokens_per_step": 262144, "steps_planned": 3}
        # an exception in step 2's optimizer step, after one step
        write(os.path.join(self.dir, "peer_llama-2-13b_deepspeed_infinity.json"), json.dumps(dict(
            base, preset="llama-2-13b", status="error", phase="step 2 optimizer step", init_s=181.5, init_done=True,
            error="RuntimeError: file_offset + buffer nbytes > file bytes", error_type="RuntimeError",
            error_message="file_offset + buffer nbytes > file bytes",
            steps=[{"step": 1, "step_s": 400.0, "loss": 10.4}], peak_gpu_gib=30.5, host_peak_gib=101.0)))
        # the disk full in deepspeed.initialize: no step
        write(os.path.join(self.dir, "peer_qwen3-4b_deepspeed_infinity.json"), json.dumps(dict(
            base, preset="qwen3-4b", status="error", phase="deepspeed.initialize", init_s=590.0, init_done=False,
            error="OSError: [Errno 28] No space left on device", steps=[])))
        # a segmentation fault in step 3's micro batch 7: status running, the phase it last wrote
        write(os.path.join(self.dir, "peer_qwen3-8b_deepspeed_infinity.json"), json.dumps(dict(
            base, preset="qwen3-8b", status="running", phase="step 3 micro batch 7/32 backward",
            steps=[{"step": 1, "step_s": 90.0, "loss": 12.1}, {"step": 2, "step_s": 80.0, "loss": 11.9}])))
        rows, out = self.table()
        label = llm_peers.PEERS["deepspeed_infinity"] + " (activation checkpointing)"
        self.assertNotIn(label, out)  # none of the fabricated rows has AC
        lab = llm_peers.PEERS["deepspeed_infinity"]
        self.assertEqual(len([k for k in rows if k == f"{lab} (error, note below)"]), 1)  # labels repeat: a dict
        self.assertIn(f"{lab} (cut, note below)", rows)
        self.assertEqual(out.count(f"| {lab} (error, note below) |"), 2)
        self.assertIn("error: in step 2 optimizer step, 1 of 3 steps done, init 181.5 s: RuntimeError: "
                      "file_offset + buffer nbytes > file bytes", out)
        self.assertIn("error: in deepspeed.initialize, 0 of 3 steps done, init 590.0 s (not finished): "
                      "OSError: [Errno 28] No space left on device", out)
        self.assertIn("cut: cut after 2 of 3 steps in step 3 micro batch 7/32 backward", out)
        one = [c for k, c in rows.items() if c[1] == "llama-2-13b"][0]
        self.assertEqual(one[2:4], ["262144", "655"])  # its one step still gives a speed (noted as such)
        self.assertIn("one step only", out)
        cut = [c for k, c in rows.items() if c[1] == "qwen3-8b"][0]
        self.assertEqual(cut[3], f"{262144 / 80.0 / 1000:.1f}k")

    def peer(self, name, tps, status="ok", error=None, steps=6):
        t = 16384 / tps
        times = [5 * t, 0.95 * t, t, 1.2 * t, t, t][:steps]
        r = {"kind": "peer", "name": name, "label": llm_peers.PEERS[name], "preset": "qwen3-0.6b", "seq": 2048,
             "batch": 8, "tokens_per_step": 16384, "steps_planned": 6, "status": status,
             "steps": [{"step": i + 1, "step_s": s, "loss": 12.5} for i, s in enumerate(times)],
             "peak_gpu_gib": 56.8, "host_peak_gib": 3.25}
        if error:
            r["error"] = error
        write(os.path.join(self.dir, f"peer_qwen3-0.6b_{name}.json"), json.dumps(r))

    def table(self):
        rc, out, err = run(self.dir, script=TABLE_PY)
        self.assertEqual(rc, 0, err)
        self.assertEqual(read_text(os.path.join(self.dir, "table.md")), out)
        rows = {}
        for line in out.splitlines():
            if line.startswith("| ") and not line.startswith("| configuration") and not line.startswith("| ---"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                rows[cells[0]] = cells
        return rows, out

    def test_ratios_and_figures(self):
        self.ours("none", 20000, gpumem=[500, 900, 30000, 12000])
        self.ours("cpuadam", 9000)
        self.ours("gpuchunk", 8000)
        self.ours("gpuoverlap", 10000)
        self.ours("gas8_acccpu", 4000)
        self.ours("gas8_accgpu", 3000, steps=4)  # cut: fewer steps than planned
        self.peer("fsdp2", 10000)
        self.peer("fsdp2_offload", 5000)
        self.peer("deepspeed_z3", 8000)
        self.peer("deepspeed_z3_offload", 1000, status="error", error="OutOfMemoryError: CUDA out of memory", steps=0)
        self.peer("deepspeed_z2_offload", 2000, status="running", steps=2)
        write(os.path.join(self.dir, "ours_qwen3-0.6b_none.ds.json"), json.dumps({"zero_optimization": {}}))
        rows, out = self.table()
        lab = {k: o["label"] for k, o in llm_peers.OURS.items()}
        none = rows[lab["none"]]
        # configuration preset tokens/step tokens/s TFLOPS MFU peak used host vsFSDP2 match counterpart target loss
        self.assertEqual(none[1:4], ["qwen3-0.6b", "16384", "20.0k"])
        tflops = 20000 * llm_peers.train_flops_per_token(llm_peers.PRESETS["qwen3-0.6b"], 2048) / 1e12
        self.assertEqual(none[4], f"{tflops:.1f}")
        self.assertEqual(none[5], f"{100 * tflops / 989:.1f}%")
        self.assertEqual(none[6:9], ["10.30", f"{29500 / 1024:.2f}", f"{203 / 1024:.2f}"])
        self.assertEqual(none[9:13], ["2.00x", "2.50x deepspeed_z3", "-", ">= 1.3x fsdp2: met"])
        self.assertEqual(none[13], "12.0000 / 7.0000")
        cpu = rows[lab["cpuadam"]]
        self.assertEqual(cpu[9:13], ["0.90x", "n/a", "-", ">= 2x fsdp2_offload: not met"])
        ov = rows[lab["gpuoverlap"]]
        self.assertEqual(ov[9:13], ["1.00x", "n/a", "1.25x gpuchunk",
                                    ">= 2x fsdp2_offload: met; faster than gpuchunk: met"])
        cut = [k for k in rows if k.startswith(lab["gas8_accgpu"])][0]
        self.assertIn("(error, note below)", cut)
        self.assertEqual(rows[cut][3], "3.0k")  # its 4 steps still give a speed
        self.assertEqual(rows[cut][11:13], ["0.75x gas8_acccpu", "faster than gas8_acccpu: not met"])
        self.assertEqual(rows[llm_peers.PEERS["fsdp2"]][9], "-")
        self.assertEqual(rows[llm_peers.PEERS["deepspeed_z3"]][9], "0.80x")
        self.assertEqual(rows[llm_peers.PEERS["deepspeed_z3"]][6:9], ["56.80", "n/a", "3.25"])
        self.assertIn("OutOfMemoryError", out)
        self.assertIn("cut after 2 of 6 steps", out)
        self.assertIn("4 of 6 steps", out)
        self.assertEqual(len(rows), 11)  # the .ds.json is not a result
        # ours first in OURS order, then the peers in PEERS order
        order = [k for k in rows]
        self.assertEqual(order[0], lab["none"])
        self.assertEqual(order[6], llm_peers.PEERS["fsdp2"])

    def test_the_faster_fsdp2_is_the_reference(self):
        self.ours("none", 20000)
        self.ours("cpuadam", 9000)
        self.peer("fsdp2", 10000)
        self.peer("fsdp2_plain", 16000)
        self.peer("fsdp2_plain_offload", 4000)
        rows, _ = self.table()
        lab = {k: o["label"] for k, o in llm_peers.OURS.items()}
        self.assertEqual(rows[lab["none"]][9], "1.25x")
        self.assertEqual(rows[lab["none"]][12], ">= 1.3x fsdp2: not met")
        self.assertEqual(rows[lab["cpuadam"]][12], ">= 2x fsdp2_offload: met")  # only the plain twin ran
        self.assertEqual(rows[llm_peers.PEERS["fsdp2"]][9], "-")
        self.assertEqual(rows[llm_peers.PEERS["fsdp2_plain"]][9], "1.00x")

    def test_no_fsdp2_and_empty(self):
        self.ours("none", 20000, peak_line="peak 812 MiB device, 1.50 GiB host per rank")
        rows, out = self.table()
        none = rows[llm_peers.OURS["none"]["label"]]
        self.assertEqual(none[6:13], [f"{812 / 1024:.2f}", "n/a", "1.50", "n/a", "n/a", "-", ">= 1.3x fsdp2: n/a"])
        empty = os.path.join(self.dir, "empty")
        os.mkdir(empty)
        rc, out, err = run(empty, script=TABLE_PY)
        self.assertEqual(rc, 1)
        self.assertIn("no results", err)


if __name__ == "__main__":
    unittest.main()

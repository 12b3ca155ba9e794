"""The transformer benchmark's scripts without a GPU or torch (issue 21): bench/llm_peers.py's preset
table against examples/llm/llm_config.cc, its counts against the C++ test's and DEVICE.md's figures, the
token file, every peer's and every configuration of ours' dry run and the argument errors, the rows'
order against zero_llm --sequential-data's formula, bench/llm_table.py's figures and ratios on a
fabricated results folder, and bench/run_llm_bench.sh's dry run (without zero_llm)."""
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
        src = read_text(os.path.join(ROOT, "examples", "llm", "llm_config.cc"))
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
        # examples/llm/llm_config_test.cc's figures
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
                rc, out, err = run("--peer", peer, "--preset", preset, "--seq", "2048", "--batch", batch,
                                   "--steps", "6", "--tokens", self.tokens, "--out", out_json, "--dry-run")
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
                    self.assertEqual("offload_optimizer" in cfg["zero_optimization"], peer.endswith("_offload"))
                    self.assertEqual(cfg["optimizer"]["params"].get("torch_adam", False), not peer.endswith("_offload"))
                    self.assertEqual(cfg["train_micro_batch_size_per_gpu"], int(batch))
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

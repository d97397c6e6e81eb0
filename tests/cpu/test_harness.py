"""CPU tests of the harness (a pure-torch submission, run in its fresh process on the CPU) and
of a real bundle's import path (unpack, private library file, binding, GPU check message),
which runs without a GPU as far as loading the library."""
import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the harness needs it")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
STUB = os.path.join(ROOT, "bench", "leaderboard", "stub")  # the task.py stand-in
LIB = os.path.join(ROOT, "build", "sm90a", "libmlagen.so")

CPU_SUBMISSION = textwrap.dedent('''\
    #!POPCORN leaderboard amd-mixed-mla
    #!POPCORN gpu MI355X
    from task import input_t, output_t
    import torch

    SCALE = {scale}

    def custom_kernel(data: input_t) -> output_t:
        q, kv_data, qo_indptr, kv_indptr, config = data
        kv, s = kv_data["fp8"]
        b, n = config["batch_size"], config["kv_seq_len"]
        k = (kv.float() * s).reshape(b, n, 576)
        p = torch.softmax(q.float().reshape(b, -1, 576) @ k.transpose(1, 2) * config["sm_scale"], -1)
        return (SCALE * (p @ k[..., :512])).reshape(q.shape[0], 16, 512).to(torch.bfloat16)
    ''')


def _harness(*args):
    return subprocess.run([sys.executable, "-m", "bench.leaderboard.harness", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def cpu_submission(tmp_path):
    def make(scale=1.0):
        path = tmp_path / f"sub_{scale}.py"
        path.write_text(CPU_SUBMISSION.format(scale=scale))
        return str(path)
    return make


def test_harness_test_mode_passes_a_correct_submission(cpu_submission, tmp_path):
    out = tmp_path / "r.json"
    r = _harness(cpu_submission(), "--device", "cpu", "--shapes", "2x128,3x64", "--no-mxfp4", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed, 0 failed" in r.stdout
    res = json.loads(out.read_text())
    assert res["ok"] and [(s["batch"], s["kv_len"]) for s in res["shapes"]] == [(2, 128), (3, 64)]
    assert all(s["passed"] and s["rel_l2"] < 0.06 for s in res["shapes"])


def test_harness_fails_a_wrong_submission(cpu_submission):
    r = _harness(cpu_submission(scale=0.0), "--device", "cpu", "--shapes", "2x128", "--no-mxfp4")
    assert r.returncode == 1 and "0 passed, 1 failed" in r.stdout, r.stdout + r.stderr
    r = _harness(cpu_submission(scale=1.5), "--device", "cpu", "--shapes", "2x128", "--no-mxfp4")
    assert r.returncode == 1, r.stdout + r.stderr


def test_harness_benchmark_mode_on_cpu(cpu_submission, tmp_path):
    out = tmp_path / "b.json"
    r = _harness(cpu_submission(), "--mode", "benchmark", "--device", "cpu", "--shapes", "2x64,1x32", "--reps", "4",
                 "--no-mxfp4", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["ok"] and res["geomean_mean_us"] > 0 and res["geomean_median_us"] > 0
    for s in res["shapes"]:
        assert s["runs"] >= 3 and len(s["times_us"]) == s["runs"] and s["median_us"] > 0
        assert abs(s["mean_us"] - sum(s["times_us"]) / s["runs"]) < 1e-3 * s["mean_us"] + 1e-3
    assert "geomean of means (the rank)" in r.stdout


def test_harness_leaderboard_mode_rechecks_fresh_inputs(cpu_submission, tmp_path):
    """Leaderboard mode: every repetition draws new inputs (seed += 13) and re-checks; a
    submission that is right only on the first seed fails there."""
    out = tmp_path / "l.json"
    r = _harness(cpu_submission(), "--mode", "leaderboard", "--device", "cpu", "--shapes", "2x64", "--reps", "3",
                 "--no-mxfp4", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["ok"] and res["shapes"][0]["runs"] == 3
    path = tmp_path / "first_only.py"
    path.write_text(CPU_SUBMISSION.format(scale=1.0).replace(
        "def custom_kernel(data: input_t) -> output_t:",
        "CALLS = [0]\n\ndef custom_kernel(data: input_t) -> output_t:\n    CALLS[0] += 1\n"
        "    if CALLS[0] > 2:\n        return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16)"))
    r = _harness(str(path), "--mode", "leaderboard", "--device", "cpu", "--shapes", "2x64", "--reps", "3",
                 "--no-mxfp4")
    assert r.returncode == 1 and "FAIL: seed" in r.stdout, r.stdout + r.stderr


def test_harness_applies_the_server_gates_first(cpu_submission, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(CPU_SUBMISSION.format(scale=1.0) + "# torch.cuda.Stream() would be refused\n")
    r = _harness(str(path), "--device", "cpu", "--shapes", "2x64", "--no-mxfp4")
    assert r.returncode == 1 and "gate FAIL: line" in r.stdout and "another stream" in r.stdout, r.stdout
    assert "passed" not in r.stdout.split("gate FAIL")[-1]  # nothing ran
    big = tmp_path / "big.py"
    big.write_text(CPU_SUBMISSION.format(scale=1.0) + "#" * 1_000_001 + "\n")
    r = _harness(str(big), "--device", "cpu", "--shapes", "2x64", "--no-mxfp4")
    assert r.returncode == 1 and "gate FAIL: size" in r.stdout and "too large" in r.stdout, r.stdout
    local = tmp_path / "local.py"
    local.write_text("# LOCAL TEST BUNDLE (cpu)\n" + CPU_SUBMISSION.format(scale=1.0) + "#" * 1_000_001 + "\n")
    r = _harness(str(local), "--device", "cpu", "--shapes", "2x64", "--no-mxfp4")
    assert r.returncode == 0 and "gate WARNING" in r.stdout, r.stdout + r.stderr


def _lib_or_skip():
    if not os.path.exists(LIB):
        pytest.skip(f"no built library at {LIB}: run `make`")
    return LIB


@pytest.fixture(scope="module")
def bundle_file(tmp_path_factory):
    lib = _lib_or_skip()
    L = ctypes.CDLL(lib)
    L.mlagen_build_archs.restype = ctypes.c_char_p
    out = str(tmp_path_factory.mktemp("bundle") / "submission.py")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bundle.py"), "--lib", lib, "--arch",
                    L.mlagen_build_archs().decode(), "--out", out, "--local-test", "--no-kernelguard"], check=True,
                   capture_output=True)
    return out


def _import_bundle(path, prelude=""):
    code = textwrap.dedent(f'''
        import importlib.util, json, os, stat, sys
        sys.path.insert(0, {STUB!r})
        {prelude}
        spec = importlib.util.spec_from_file_location("submission", {path!r})
        m = importlib.util.module_from_spec(spec); sys.modules["submission"] = m
        spec.loader.exec_module(m)
        import torch
        info = {{"bundle": m.MLAGEN_BUNDLE, "why": m._STATE["why"]}}
        if m.mlagen is not None:
            import mlagen
            info["env"] = os.environ["MLAGEN_LIBRARY"]
            info["package_dir_exists"] = os.path.exists(os.path.dirname(mlagen.__file__))
            handle = mlagen._lib.lib()
            m2 = importlib.util.module_from_spec(importlib.util.spec_from_file_location("submission2", {path!r}))
            m2.__spec__.loader.exec_module(m2)
            info["second_import_same_library"] = m2.mlagen is mlagen and sys.modules["mlagen"]._lib.lib() is handle
            info["binding_origin"] = mlagen.__file__
            info["fingerprint_live"] = mlagen.fingerprint()
        torch.manual_seed(0)
        q = torch.randn(2, 16, 576, dtype=torch.bfloat16)
        kv = torch.randn(128, 1, 576).to(torch.float8_e4m3fn)
        ind = torch.tensor([0, 1, 2], dtype=torch.int32)
        cfg = {{"batch_size": 2, "kv_seq_len": 64, "num_heads": 16, "num_kv_heads": 1, "qk_head_dim": 576,
               "v_head_dim": 512, "q_seq_len": 1, "sm_scale": 576 ** -0.5}}
        out = m.custom_kernel((q, {{"fp8": (kv, torch.ones(1))}}, ind, ind * 64, cfg))
        info["out"] = [list(out.shape), str(out.dtype), bool(torch.isfinite(out.float()).all())]
        info["why_after_call"] = m._STATE["why"]
        print("JSON" + json.dumps(info))
        ''')
    env = dict(os.environ, MLAGEN_LIBRARY="/nonexistent/libmlagen.so")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=os.path.dirname(path))


def test_bundle_imports_without_a_gpu(bundle_file):
    """Without a GPU the bundle still imports (its library loads: no GPU runtime is linked); a call
    on CPU tensors cannot launch, so it falls back, says why once, and returns the reference's
    answer computed by torch."""
    r = _import_bundle(bundle_file)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads(r.stdout.split("JSON", 1)[1])
    assert info["why"] is None and info["bundle"]["arch"] == "sm90a"  # the import itself did not fall back
    assert os.path.basename(os.path.dirname(os.path.dirname(info["binding_origin"]))).startswith("mlagen-bundle-")
    assert info["env"].endswith("/mlagen/libmlagen.so")
    assert not info["package_dir_exists"]  # removed once imported and mapped: nothing left behind
    assert info["second_import_same_library"]  # importing it again maps no second library
    assert info["fingerprint_live"] == info["bundle"]["fingerprint"]
    assert info["out"] == [[2, 16, 512], "torch.bfloat16", True]
    assert "expected a CUDA tensor" in info["why_after_call"]
    assert r.stderr.count("falling back") == 1, r.stderr


def _real_gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(_real_gpu(), reason="fakes a GPU-less machine's failing device check; a real GPU passes it")
def test_bundle_gpu_check_failure_falls_back_naming_both(bundle_file):
    """With torch claiming a GPU, the import-time device check fails here (there is none): the
    import still succeeds, on the reference's path, and the one line says why, naming the arch
    the bundle was built for and the running GPU."""
    prelude = ("import torch; torch.cuda.is_available = lambda: True; "
               "torch.cuda.get_device_capability = lambda *a: (8, 0); "
               "torch.cuda.get_device_name = lambda *a: 'Fake A100'")
    r = _import_bundle(bundle_file, prelude)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads(r.stdout.split("JSON", 1)[1])
    assert info["bundle"] is None and "MlagenError" in info["why"]
    lines = [ln for ln in r.stderr.splitlines() if "falling back" in ln]
    assert len(lines) == 1 and "bundle for sm90a" in lines[0] and "Fake A100" in lines[0], r.stderr
    assert info["out"] == [[2, 16, 512], "torch.bfloat16", True]



"""CPU tests of the torch operators (runtime/torch/ops.cpp, runtime/python/mlagen/ops.py): `import
mlagen` registers them, the C++ object loads where it was built against this torch (and the Python
registration takes over, with one warning line, where it was not, or is absent), both register the
same schema, the meta kernels give the outputs' shapes (FakeTensor, opcheck on meta tensors,
symbolic tracing), and `import mlagen` works without torch. No GPU: the CUDA kernels run in
tests/gpu/test_ops.py and tests/gpu/test_host_time.py."""
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the operators need it")

import mlagen  # noqa: E402
from mlagen import _facts, _lib, ops  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INSTALLED = os.environ.get("MLAGEN_TEST_INSTALLED") == "1"
SM = 576 ** -0.5


def _python(code, **env_changes):
    env = dict(os.environ)
    if not INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "runtime", "python"), ROOT])
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_import_mlagen_registers_the_operators():
    r = _python("import mlagen, torch\nfrom mlagen import ops\n"
                "print(ops.REGISTRATION, torch.ops.mlagen.decode.default._schema.name, "
                "torch.ops.mlagen.decode_lse.default._schema.name)")
    assert r.returncode == 0, r.stderr
    registration, *names = r.stdout.split()
    assert names == ["mlagen::decode", "mlagen::decode_lse"]
    if os.path.exists(ops.native_path()):
        assert registration == "native" and "mlagen:" not in r.stderr, r.stderr  # no warning
    else:  # not built (the default, CMake MLAGEN_TORCH_OP=OFF): the Python registration, quietly
        assert registration == "python" and "mlagen:" not in r.stderr, r.stderr


def test_the_cpp_operators_are_built_beside_the_library():
    """make build CMAKE_EXTRA=-DMLAGEN_TORCH_OP=ON (torch importable) builds libmlagen_torch.so next to
    libmlagen.so; it records the torch it was built against, this one. (Off by default: CMakeLists.txt.)"""
    path = ops.native_path()
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (CMake MLAGEN_TORCH_OP=OFF, the default)")
    assert ops.built_with(path) == torch.__version__
    assert ops.REGISTRATION == "native" and mlagen._native is not None and ops.NATIVE_PATH == path


def _schemas(**env):
    r = _python("import mlagen, torch\nfrom mlagen import ops\nprint(ops.REGISTRATION)\n"
                "print(torch.ops.mlagen.decode.default._schema)\nprint(torch.ops.mlagen.decode_lse.default._schema)",
                **env)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines(), r.stderr


def test_python_registration_has_the_same_schema_and_says_why_in_one_line():
    native, native_err = _schemas()
    python, python_err = _schemas(MLAGEN_TORCH_LIBRARY="")
    assert python[0] == "python"
    assert python[1:] == native[1:] if native[0] == "native" else True
    warnings = [line for line in python_err.splitlines() if "mlagen:" in line]
    assert len(warnings) == 1 and "MLAGEN_TORCH_LIBRARY is empty" in warnings[0], python_err


@pytest.mark.parametrize("damage", ["version", "garbage"])
def test_a_cpp_object_for_another_torch_or_broken_falls_back(tmp_path, damage):
    """Built against another torch (its recorded version differs: not even loaded) or not loadable:
    `import mlagen` still works, the operators come from Python, one warning line names the cause."""
    if not os.path.exists(ops.native_path()):
        pytest.skip("no C++ operators built")
    copy = tmp_path / "libmlagen_torch.so"
    data = open(ops.native_path(), "rb").read()
    mark = f"{ops._MARK}{torch.__version__};".encode()
    if damage == "version":
        other = "9" * len(torch.__version__)  # same length: the object's layout is untouched
        data = data.replace(mark, f"{ops._MARK}{other};".encode())
        want = f"was built against torch {other}"
    else:
        data = b"\0" * 64 + mark  # the right version, not an ELF object
        want = "does not load"
    copy.write_bytes(data)
    r = _python("import mlagen, torch\nfrom mlagen import ops\nprint(ops.REGISTRATION)\n"
                "print(torch.ops.mlagen.decode.default._schema.name)", MLAGEN_TORCH_LIBRARY=str(copy))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["python", "mlagen::decode"]
    lines = [line for line in r.stderr.splitlines() if "mlagen:" in line]
    assert len(lines) == 1 and want in lines[0], r.stderr


def test_import_mlagen_without_torch():
    """The library's binding imports where torch is not installed (no operators then)."""
    block = ("import sys\nclass _NoTorch:\n    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'torch' or name.startswith('torch.'):\n"
             "            raise ModuleNotFoundError(\"No module named 'torch'\", name=name)\n"
             "sys.meta_path.insert(0, _NoTorch())\n")
    r = _python(block + "import mlagen\nassert 'torch' not in sys.modules\n"
                "print(mlagen.NUM_HEADS, mlagen.MAX_Q_LEN, mlagen._native)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["(8,", "16,", "32,", "64,", "128)", "4", "None"]
    assert "mlagen:" not in r.stderr


def _meta_args(heads=16, total_q=8, paged=False, device="meta"):
    q = torch.empty(total_q, heads, 576, dtype=torch.bfloat16, device=device)
    kv = torch.empty(4096, 1, 576, dtype=torch.float8_e4m3fn, device=device)
    scale = torch.empty(1, device=device)
    qo = torch.empty(9, dtype=torch.int32, device=device)
    if not paged:
        return (q, kv, scale, qo, qo, "fp8", "bf16", 512, SM)
    table = torch.empty(8, 8, dtype=torch.int32, device=device)
    lens = torch.empty(8, dtype=torch.int32, device=device)
    return (q, kv.view(64, 64, 1, 576), scale, qo, None, "fp8", "bf16", 0, SM, None, 1, table, lens, 64)


@pytest.mark.parametrize("heads", _facts.NUM_HEADS)
def test_meta_kernels_give_the_output_shapes(heads):
    for paged in (False, True):
        args = _meta_args(heads, paged=paged)
        out = torch.ops.mlagen.decode(*args)
        assert out.shape == (8, heads, _facts.V_DIM) and out.dtype == torch.bfloat16 and out.device.type == "meta"
        out, lse = torch.ops.mlagen.decode_lse(*args)
        assert out.shape == (8, heads, _facts.V_DIM) and lse.shape == (8, heads) and lse.dtype == torch.float32


def test_meta_kernels_refuse_a_q_the_kernels_cannot_take():
    with pytest.raises(RuntimeError, match="q: shape"):
        torch.ops.mlagen.decode(*_meta_args(heads=12))


@pytest.mark.parametrize("op", ["decode", "decode_lse"])
def test_opcheck_on_meta_tensors(op):
    for paged in (False, True):
        torch.library.opcheck(getattr(torch.ops.mlagen, op).default, _meta_args(paged=paged),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))


def test_fake_cuda_tensors_and_symbolic_tracing():
    """Under FakeTensorMode the operators take CUDA tensors with no GPU present (torch.compile's
    view of them), and trace with symbolic sizes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        args = _meta_args(device="cuda")
        out, lse = torch.ops.mlagen.decode_lse(*args)
        assert out.device.type == "cuda" and out.shape == (8, 16, 512) and lse.shape == (8, 16)

    def model(q, kv, scale, qo, kvp):
        return torch.ops.mlagen.decode(q, kv, scale, qo, kvp, "fp8", "bf16", 0, SM).float().sum(-1)

    gm = make_fx(model, tracing_mode="symbolic")(*_meta_args()[:5])
    assert "mlagen.decode" in gm.code


def test_decode_of_host_tensors_names_q():
    """No CPU kernel: the binding says which tensor is on the host, whichever path it took."""
    args = _meta_args(device="cpu")
    q, kv, scale, qo = args[:4]
    cfg = {"batch_size": 8, "kv_seq_len": 512, "sm_scale": SM}
    with pytest.raises(mlagen.MlagenError, match="q: on cpu, expected a CUDA tensor"):
        mlagen.decode(q, {"fp8": (kv, scale)}, qo, qo, cfg)
    with pytest.raises(mlagen.MlagenError, match="q: on cpu, expected a CUDA tensor"):
        mlagen.leaderboard_entry("fp8")((q, {"fp8": (kv, scale)}, qo, qo, cfg))


def test_config_errors_name_the_config_key():
    """The library checks the values; the binding names the config key they came from."""
    e = mlagen._naming_config(mlagen.MlagenError(1, "MLAGEN_ERR_INVALID: q_len=5: expected 1..4"),
                              {"q_len": "q_seq_len"})
    assert str(e).endswith("(from config['q_seq_len'])") and e.status == 1
    assert str(mlagen._naming_config(mlagen.MlagenError(1, "MLAGEN_ERR_INVALID: num_heads=12: x"), {})) == \
        "MLAGEN_ERR_INVALID: num_heads=12: x"
    with pytest.raises(mlagen.MlagenError, match="config\\['qk_head_dim'\\]=512: expected 576"):
        mlagen._config_fields({"qk_head_dim": 512})
    with pytest.raises(mlagen.MlagenError, match="config\\['sm_scale'\\]='x': expected a number"):
        mlagen._config_fields({"sm_scale": "x"})
    with pytest.raises(mlagen.MlagenError, match="config\\['q_seq_len'\\]=1.5: expected an int"):
        mlagen._config_fields({"q_seq_len": 1.5})
    import numpy as np
    assert mlagen._config_fields({"batch_size": np.int64(4), "kv_seq_len": np.int32(512), "q_seq_len": 2,
                                  "sm_scale": np.float32(0.5)}) == (4, None, 512, 0.5, 2)


def test_the_binding_states_the_generated_facts():
    from codegen import facts
    assert (_facts.QK_DIM, _facts.V_DIM, _facts.MAX_Q_LEN, _facts.NUM_HEADS, _facts.DTYPE, _facts.ABI_VERSION) == \
        (facts.QK_DIM, facts.V_DIM, facts.MAX_Q_LEN, facts.NUM_HEADS, facts.DTYPE_CODES, facts.ABI_VERSION)
    assert _lib.DTYPE is _facts.DTYPE and mlagen.NUM_HEADS is _facts.NUM_HEADS
    from mlagen import dcp
    assert dcp.MAX_Q_LEN == _facts.MAX_Q_LEN


def test_the_op_source_names_no_framework_in_the_library():
    """The fat library stays free of torch: nothing under runtime/src or runtime/include includes it."""
    for folder in ("runtime/src", "runtime/include"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for fn in files:
                with open(os.path.join(base, fn), errors="replace") as f:
                    text = f.read()
                assert "torch/" not in text and "ATen/" not in text, os.path.join(base, fn)
    lib = _lib.library_path()
    if shutil.which("readelf") and os.path.exists(lib):
        needed = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
        assert "torch" not in needed and "c10" not in needed

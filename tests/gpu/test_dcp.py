"""Decode context parallelism on 2+ GPUs: one batch's paged KV split over the GPUs by pages, each
GPU decoding its share with return_lse=True, the partials merged by their LSE (mlagen.dcp), equal
to one GPU's decode of the whole cache within the kernel's own rounding (bench/dcp.py's bounds:
ROW_REL_L2 per (token, head) row, LSE_ABS); and one process driving two GPUs (plans and scratch
per device, calls on the two interleaved without a sync, each output bit-equal to the same call
alone).

  * test_torchrun_check: `torchrun --standalone --nproc_per_node=N bench/dcp.py --check` (one
    process a GPU, NCCL all_gather) for N = 2, 4, 8 up to the GPUs there are, NVLink multicast off
    in the launcher's environment (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
    NVSHMEM_DISABLE_NVLS=1); its JSON line must say every case passed.
  * test_two_devices_interleaved, test_one_process_shares_on_several_devices: in this process.

Marked `multigpu`: with fewer than 2 GPUs every test here skips saying so, and tests/conftest.py
lists that skip without counting it against MLAGEN_REQUIRE_GPU=1 (the one-H200 runs). The merge
and the sharding alone are tested on the CPU: tests/cpu/test_dcp_merge.py.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_DCP = os.path.join(ROOT, "bench", "dcp.py")


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPUS = _gpus()
pytestmark = [pytest.mark.gpu, pytest.mark.multigpu,
              pytest.mark.skipif(GPUS < 2, reason=f"multi-GPU test: needs 2+ CUDA GPUs, torch sees {GPUS}")]


def _bench_dcp():
    """bench/dcp.py as a module (its inputs, compare() and bounds; importing it runs nothing)."""
    spec = importlib.util.spec_from_file_location("bench_dcp_script", BENCH_DCP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bd():
    return _bench_dcp()


def _binding_dir():
    import mlagen
    return os.path.dirname(os.path.dirname(os.path.abspath(mlagen.__file__)))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_torchrun_check(n, tmp_path, bd):
    if n > GPUS:
        pytest.skip(f"multi-GPU test: {n} ranks need {n} GPUs, torch sees {GPUS}")
    out = tmp_path / f"check_n{n}.json"
    env = dict(os.environ, **bd.NO_MULTICAST, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_binding_dir(), env.get("PYTHONPATH")) if p)
    # torchrun is torch.distributed.run; through this interpreter, so the ranks run the same torch and mlagen
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", BENCH_DCP,
           "--check", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    log = (res.stdout[-3000:] + "\n" + res.stderr[-6000:]).strip()
    assert out.exists(), f"no JSON from {' '.join(cmd)} (rc {res.returncode}):\n{log}"
    result = json.loads(out.read_text().splitlines()[-1])
    bad = [c for c in result["cases"] if not c.get("ok")]
    assert result["world_size"] == n and result["env"] == bd.NO_MULTICAST
    assert not bad and result["ok"] and res.returncode == 0, f"N={n}: failed cases {bad}\n{log}"
    grid = {(c["heads"], c["kv"], c["q_len"], c["layout"]) for c in result["cases"]}
    assert grid == {(h, kv, q, lay) for h in (16, 128) for kv in ("fp8", "bf16") for q in (1, 2)
                    for lay in ("round_robin", "contiguous")}
    for c in result["cases"]:
        assert c["row_rel_l2"] <= bd.ROW_REL_L2 and c["lse_abs"] <= bd.LSE_ABS, c


def _paged_inputs(bd, dev, heads, q_len, fmt, lens, seed, page_size=64):
    """The same paged batch (block table, cache, q) on device `dev`, from CPU draws."""
    import torch
    from mlagen import quant
    table, num_pages = bd.block_table(lens, page_size, seed)
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn((num_pages * page_size, 1, bd.QK), generator=g).to(torch.bfloat16)
    q = torch.randn((len(lens) * q_len, heads, bd.QK), generator=g).to(torch.bfloat16)
    config = dict(batch_size=len(lens), sm_scale=bd.SM_SCALE, num_heads=heads, q_seq_len=q_len, kv_seq_len=None)
    return dict(q=q.to(dev), kv_data=bd.kv_entry(cache.to(dev), fmt, quant), table=table.to(dev),
                table_cpu=table, lens=list(lens), kv_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
                qo=(torch.arange(len(lens) + 1, dtype=torch.int32) * q_len).to(dev), config=config, fmt=fmt,
                q_len=q_len, page_size=page_size, cache=cache)


def _decode(x):
    import mlagen
    return mlagen.decode(x["q"], x["kv_data"], x["qo"], None, x["config"], kv_format=x["fmt"], page_table=x["table"],
                         page_size=x["page_size"], kv_lens=x["kv_lens"], return_lse=True, q_len=x["q_len"])


def _bits(t):
    import torch
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


@pytest.mark.parametrize("fmt,heads,q_len", [("fp8", 16, 1), ("fp8", 128, 2), ("bf16", 128, 1)])
def test_two_devices_interleaved(bd, fmt, heads, q_len):
    """One process, devices 0 and 1: each device's call made alone first, then the two
    interleaved several times with no synchronization between them (and with the other device
    current): every output and LSE bit-equal to its call alone; the plans and their scratch
    are per device."""
    import torch
    import mlagen
    lens = [5000, 1, 2047, 130]
    xs = [_paged_inputs(bd, torch.device("cuda", d), heads, q_len, fmt, lens, seed=11) for d in (0, 1)]
    alone = []
    for d, x in enumerate(xs):
        with torch.cuda.device(d):
            alone.append(_decode(x))
            torch.cuda.synchronize(d)
            mlagen.check_device_errors(d)
    runs = []
    with torch.cuda.device(0):
        for _ in range(4):
            runs.append((_decode(xs[0]), _decode(xs[1])))  # no sync between the two devices' calls
    with torch.cuda.device(1):  # the other device current: the call goes to its tensors' device all the same
        runs.append((_decode(xs[0]), _decode(xs[1])))
    for d in (0, 1):
        torch.cuda.synchronize(d)
    for i, pair in enumerate(runs):
        for d in (0, 1):
            for got, want, what in zip(pair[d], alone[d], ("out", "lse")):
                assert got.device == torch.device("cuda", d)
                assert torch.equal(_bits(got), _bits(want)), f"run {i} device {d}: {what} differs from the call alone"
    for d in (0, 1):
        plans = [p for p in mlagen._plans.values() if p.device_index == d and p.config == xs[d]["config"]]
        assert plans, f"no plan for device {d}"
        for p in plans:
            assert p.bound and all(ws.device == torch.device("cuda", d) for ws in p.bound.values()), \
                f"device {d}: a plan's scratch is not on its device"
    if torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1):  # the same GPU model: the same bits
        assert torch.equal(_bits(alone[0][0]), _bits(alone[1][0].to("cuda:0")))


@pytest.mark.parametrize("layout", ["round_robin", "contiguous"])
@pytest.mark.parametrize("fmt,heads,q_len", [("fp8", 16, 1), ("fp8", 128, 2), ("bf16", 16, 2)])
def test_one_process_shares_on_several_devices(bd, layout, fmt, heads, q_len):
    """The DCP path without NCCL: every GPU (up to 8) decodes its share from a cache of its own
    pages in this process, the partials are copied to device 0 and merged, against device 0's
    decode of the whole cache."""
    import torch
    import mlagen
    from mlagen import dcp
    world = min(GPUS, 8)
    lens = [0, 1, 100, 3001, 9037]
    x0 = _paged_inputs(bd, torch.device("cuda", 0), heads, q_len, fmt, lens, seed=21)
    ref = _decode(x0)
    outs, lses = [], []
    for r in range(world):
        dev = torch.device("cuda", r)
        x = x0 if r == 0 else _paged_inputs(bd, dev, heads, q_len, fmt, lens, seed=21)
        sh, pages, local = bd.local_share(dcp, torch, x["table_cpu"], lens, x["page_size"], world, r, layout, q_len)
        out, lse = mlagen.decode(x["q"], dcp.take_pages(x["kv_data"], pages.to(dev), x["page_size"]),
                                 sh.qo_indptr.to(dev), None, sh.config(x["config"]), kv_format=fmt,
                                 page_table=local.to(dev), page_size=x["page_size"], kv_lens=sh.kv_lens.to(dev),
                                 return_lse=True, q_len=sh.q_len)
        outs.append(out.to(x0["q"].device))
        lses.append(lse.to(x0["q"].device))
    for r in range(world):
        mlagen.check_device_errors(r)
    out, lse = dcp.merge_partials(outs, lses)
    row, lse_d, problems = bd.compare(out, lse, *ref)
    assert not problems, f"{world} devices {layout} {fmt} h{heads} q_len {q_len}: {problems}"
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    print(f"{world} devices {layout} {fmt} h{heads} q_len {q_len}: row rel L2 {row:.2e}, |lse diff| {lse_d:.2e}")

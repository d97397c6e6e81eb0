"""Shared helpers for bench/bench.py, bench/sanitize.py and bench/_sanitize_child.py.

Inputs are built the leaderboard's way (q and KV bf16 standard normal, per-tensor fp8
e4m3fn quantization of the KV with scale = amax / 448: mlagen.quant's recipe), and the
reference is float32 attention on the dequantized fp8 KV (task_inputs.attention_reference).
Nothing here needs a GPU to import.
"""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

NUM_HEADS, QK_DIM, V_DIM, ROPE_DIM = 16, 576, 512, 64
SM_SCALE = 1.0 / math.sqrt(QK_DIM)
FP8_MAX = 448.0

# (batch, kv_len), in the leaderboard's benchmark order.
BENCH_SHAPES = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]

# /work/shared/anchors.md, measured on the H200 test GPU (microseconds, leaderboard timing).
ANCHORS_US = {
    # shape: (torch bmm, seed Triton best, seed variant, FlashMLA bf16)
    (4, 1024): (25.7, 19.8, "split32", 16.1),
    (4, 8192): (49.7, 47.3, "split32", 30.1),
    (32, 1024): (44.9, 33.2, "split8", 25.2),
    (32, 8192): (202.1, 162.0, "split8", 93.8),
    (64, 1024): (70.7, 53.1, "split4", 37.1),
    (64, 8192): (377.1, 300.1, "split4", 170.2),
    (256, 1024): (198.3, 155.1, "single", 93.7),
    (256, 8192): (1426.8, 1139.9, "single", 625.3),
}
ANCHOR_COPY_TBPS = 4.28


def ensure_mlagen_importable() -> None:
    """Make `import mlagen` work when the script is run without the Makefile's PYTHONPATH."""
    path = os.path.join(REPO, "runtime", "python")
    if path not in sys.path:
        sys.path.insert(0, path)


def parse_shapes(text: str | None, default=None) -> list[tuple[int, int]]:
    """'4x1024,32x8192' -> [(4, 1024), (32, 8192)]; None/'' -> default (all eight)."""
    if not text:
        return list(default if default is not None else BENCH_SHAPES)
    shapes = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        try:
            b, l = item.lower().split("x")
            shapes.append((int(b), int(l)))
        except ValueError:
            raise SystemExit(f"bad shape {item!r}: expected BATCHxKV_LEN, e.g. 4x1024")
    return shapes


def shape_name(batch: int, kv_len: int) -> str:
    return f"{batch}x{kv_len}"


def fp8_bytes(batch: int, kv_len: int) -> int:
    """Bytes a decode must move with fp8 KV (anchors.md): KV + q + out."""
    return batch * kv_len * QK_DIM + batch * NUM_HEADS * QK_DIM * 2 + batch * NUM_HEADS * V_DIM * 2


def reference_as_seen(inp: dict, kv_format: str, q_dtype: str = "bf16"):
    """float32 attention on the values a kernel of this KV format / q precision computes
    with (the dequantized KV; an fp8 q per the task's recipe). Adds the mxfp4 entry to
    inp["kv_data"] (quantized from inp["kv_bf16"]) when it is missing."""
    import torch
    from mlagen import quant
    if kv_format == "mxfp4" and "mxfp4" not in inp["kv_data"]:
        inp["kv_data"]["mxfp4"] = quant.quantize_mxfp4(inp["kv_bf16"])
    if kv_format == "bf16":
        kv_seen = inp["kv_bf16"]
    elif kv_format == "mxfp4":
        kv_seen = quant.dequantize_mxfp4(*inp["kv_data"]["mxfp4"], QK_DIM).reshape(-1, 1, QK_DIM)
    else:
        kv_seen = inp["kv_fp8"].float() * inp["scale"]
    q_seen = inp["q"]
    if q_dtype == "fp8":
        q8, qs = quant.quantize_q_fp8(inp["q"])
        q_seen = q8.float() * qs
    return reference_fp8(dict(inp, q=q_seen, kv_fp8=kv_seen, scale=torch.ones(1, device=inp["q"].device)))


def format_bytes(batch: int, kv_len: int, kv_format: str) -> int:
    """Bytes a decode must move with the given KV format: KV (fp8 576, bf16 1152, mxfp4
    288 + 18 scale bytes a token) + q + out."""
    per_token = {"fp8": QK_DIM, "bf16": 2 * QK_DIM, "mxfp4": QK_DIM // 2 + QK_DIM // 32}[kv_format]
    return batch * kv_len * per_token + batch * NUM_HEADS * QK_DIM * 2 + batch * NUM_HEADS * V_DIM * 2


def make_config(batch: int, kv_len: int | None) -> dict:
    """The leaderboard's config dict; kv_len None or 0 leaves kv_seq_len out (non-uniform lengths)."""
    cfg = dict(batch_size=batch, num_heads=NUM_HEADS, num_kv_heads=1, qk_head_dim=QK_DIM,
               kv_lora_rank=V_DIM, qk_rope_head_dim=ROPE_DIM, v_head_dim=V_DIM, q_seq_len=1,
               sm_scale=SM_SCALE)
    if kv_len:
        cfg["kv_seq_len"] = kv_len
    return cfg


def quantize_fp8(kv_bf16):
    """The task's per-tensor fp8 e4m3fn recipe, mlagen.quant.quantize_fp8 (scale = amax / 448
    in the input's dtype): (fp8 shaped like the input, scale (1,) float32)."""
    ensure_mlagen_importable()
    from mlagen import quant
    return quant.quantize_fp8(kv_bf16)


def task_inputs():
    """bench/leaderboard/task_inputs.py (the task's inputs, check and the one attention reference),
    imported from this folder as `leaderboard.task_inputs`: here `bench` names bench/bench.py."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from leaderboard import task_inputs as ti
    return ti


def make_inputs(batch: int, kv_len: int | None, seed: int, device, *, lengths: list[int] | None = None,
                keep_bf16: bool = True) -> dict:
    """One input set. Uniform when lengths is None (every sequence kv_len long), else the
    given per-sequence lengths (config without kv_seq_len). q_seq_len is 1."""
    import torch
    if lengths is None:
        lengths = [kv_len] * batch
        uniform = True
    else:
        assert len(lengths) == batch
        uniform = False
    total_kv = sum(lengths)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    q = torch.randn((batch, NUM_HEADS, QK_DIM), dtype=torch.bfloat16, device=device, generator=gen)
    kv = torch.randn((total_kv, 1, QK_DIM), dtype=torch.bfloat16, device=device, generator=gen)
    kv_fp8, scale = quantize_fp8(kv)
    kv_indptr_host = [0]
    for n in lengths:
        kv_indptr_host.append(kv_indptr_host[-1] + n)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device)
    kv_indptr = torch.tensor(kv_indptr_host, dtype=torch.int32, device=device)
    kv_data = {"fp8": (kv_fp8, scale)}
    if keep_bf16:
        kv_data["bf16"] = kv
    else:
        del kv
    return dict(batch=batch, kv_len=kv_len if uniform else 0, lengths=lengths, uniform=uniform, q=q,
                kv_bf16=kv_data.get("bf16"), kv_fp8=kv_fp8, scale=scale, kv_data=kv_data,
                qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indptr_host=kv_indptr_host,
                config=make_config(batch, kv_len if uniform else None))


def reference_fp8(inp: dict, *, max_chunk_bytes: int = 1 << 30):
    """float32 attention on the dequantized fp8 KV (inp["kv_fp8"] * inp["scale"]; any float
    tensor works, reference_as_seen passes dequantized values with scale 1) and inp["q"] ->
    (batch, 16, 512) float32. Zero-length sequences give zeros. A wrapper of
    task_inputs.attention_reference, at most ~max_chunk_bytes of float32 K at a time."""
    import torch
    q, kv, scale = inp["q"], inp["kv_fp8"], inp["scale"]
    flat = kv.reshape(-1, QK_DIM)
    return task_inputs().attention_reference(q, lambda a, b: flat[a:b].float() * scale, inp["qo_indptr"],
                                             inp["kv_indptr"], SM_SCALE, v_dim=V_DIM, chunk_bytes=max_chunk_bytes,
                                             dtype=torch.float32, empty=0.0)


def rel_l2(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out has a non-finite element."""
    import torch
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    r = ref.double()
    den = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    return num / den if den > 0 else num


def bmm_reference_bf16(q, kv_bf16, batch: int, kv_len: int):
    """The leaderboard entry's fallback: bf16 bmm for scores, float32 softmax rounded to
    bf16, bf16 bmm with V (the first 512 dims of the same rows)."""
    import torch
    kv = kv_bf16.view(batch, kv_len, QK_DIM)
    scores = torch.bmm(q, kv.transpose(1, 2)) * SM_SCALE
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(torch.bfloat16)
    return torch.bmm(probs, kv[:, :, :V_DIM])


def nonuniform_lengths(batch: int = 10, seed: int = 0, max_len: int = 3000) -> list[int]:
    """Random per-sequence lengths with a zero-length sequence in the middle and at the end,
    a length of 1, one that is not a multiple of 32 (37), and one that is (1024)."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, max_len) for _ in range(batch)]
    fixed = {2: 0, 3: 1024, 5: 37, 6: 1, batch - 1: 0}
    for i, n in fixed.items():
        if 0 <= i < batch:
            lengths[i] = n
    return lengths


def git_commit() -> dict:
    """{'commit': sha or None, 'dirty': bool or None, 'source': 'git' | 'env' | None}.
    MLAGEN_COMMIT wins when set: .ci/gpu sets it from the `.commit` file the caller wrote,
    because the device machine's copy of the tree can carry an older .git than its files."""
    env = os.environ.get("MLAGEN_COMMIT")
    if env and env != "unknown":
        return {"commit": env, "dirty": None, "source": "env"}
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        if sha.returncode == 0 and sha.stdout.strip():
            dirty = None
            st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True, timeout=10)
            if st.returncode == 0:
                dirty = bool(st.stdout.strip())
            return {"commit": sha.stdout.strip(), "dirty": dirty, "source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None, "source": None}


def finite_or_none(x):
    """JSON-safe float: NaN/inf become None (json would write invalid NaN/Infinity)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def json_clean(obj):
    if isinstance(obj, dict):
        return {str(k): json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    if isinstance(obj, float):
        return finite_or_none(obj)
    return obj

"""The sm_90a warpgroup MMA instructions the device code issues, one row a wrapper: `python -m codegen
generate` writes generated/wgmma_ops.inc from this table (templates/wgmma_ops.inc.j2), which
runtime/include/mlagen/device/sm90_ops.cuh includes. A wrapper is an inline-asm statement whose text
and operand list follow from its row alone; the device headers name the wrappers, never the
instruction text.

Every wrapper is D (64 x N, f32 accumulators, N / 2 a thread) [+]= A (64 x K) * B (N x K)^T with B in
shared memory by descriptor (K-major unless the row says otherwise) and A either by descriptor
("ss") or in registers ("rs": four 32-bit registers a thread, the fragment sm90_ops.cuh describes).
How D starts:
  "pred"  a runtime `accumulate` argument: 0 overwrites D, else D accumulates (a setp'd predicate)
  "zero"  D = A * B^T (the first k-step): D is only written ("=f" operands)
  "acc"   D += A * B^T
16-bit types carry the transpose immediates (tnspA for "ss", tnspB): 1 reads that operand M- (N-)
major through its descriptor's layout (the M-major layout sm90_ops.cuh describes, along N for B)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wgmma:
    n: int          # N (M = 64)
    k: int          # K: 32 for 8-bit types, 16 for 16-bit
    dtype: str      # A and B: "e4m3", "bf16" or "f16"
    a: str          # "ss" (A by descriptor) or "rs" (A in registers)
    d: str          # "pred", "zero" or "acc"
    suffix: str     # the wrapper's name after wgmma_m64n{n}k{k}_{dtype}_{a}: "", "_first", "_mn", "_nb"
    doc: str        # one line, what it is for (the comment above the wrapper)
    tnsp_a: int = 0  # 16-bit "ss" only: A M-major (the descriptor's transpose bit)
    tnsp_b: int = 0  # 16-bit only: B N-major

    @property
    def name(self) -> str:
        return f"wgmma_m64n{self.n}k{self.k}_{self.dtype}_{self.a}{self.suffix}"

    @property
    def regs(self) -> int:
        return self.n // 2

    def signature(self) -> str:
        a = "const uint32_t (&a)[4]" if self.a == "rs" else "uint64_t desc_a"
        acc = ", int accumulate" if self.d == "pred" else ""
        return f"MLAGEN_DEVICE void {self.name}(float (&d)[{self.regs}], {a}, uint64_t desc_b{acc})"

    def asm(self) -> tuple[str, str, str]:
        """(the instruction text as C string literals, the output operands, the input operands)."""
        r = self.regs
        dlist = "{" + ",".join(f"%{i}" for i in range(r)) + "}"
        if self.a == "ss":
            ops, inputs, nxt = f"%{r}, %{r + 1}", ['"l"(desc_a)', '"l"(desc_b)'], r + 2
        else:
            ops = "{" + ",".join(f"%{r + i}" for i in range(4)) + f"}}, %{r + 4}"
            inputs, nxt = [f'"r"(a[{i}])' for i in range(4)] + ['"l"(desc_b)'], r + 5
        scale_d = {"pred": "p", "zero": "0", "acc": "1"}[self.d]
        imm = [scale_d, "1", "1"]
        if self.dtype != "e4m3":  # the transpose immediates of the 16-bit types
            imm += [str(self.tnsp_a), str(self.tnsp_b)] if self.a == "ss" else [str(self.tnsp_b)]
        instr = (f"wgmma.mma_async.sync.aligned.m64n{self.n}k{self.k}.f32.{self.dtype}.{self.dtype} "
                 f"{dlist}, {ops}, {', '.join(imm)};")
        if self.d == "pred":
            inputs.append('"r"(accumulate)')
            text = f'"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nxt}, 0;\\n"\n      "{instr}\\n}}\\n"'
        else:
            text = f'"{instr}\\n"'
        mode = "=f" if self.d == "zero" else "+f"
        outputs = ", ".join(f'"{mode}"(d[{i}])' for i in range(r))
        return text, outputs, ", ".join(inputs)


# The wrappers, in the order sm90_ops.cuh documented them (the 16-row fp8 warpgroup body, its
# f16 O product, the bf16 bodies, then the rows body's widest S chain).
WGMMA = (
    Wgmma(32, 32, "e4m3", "ss", "pred", "", "S^T / O^T of the 16-row fp8 body: N = the q's hi + lo columns"),
    Wgmma(32, 32, "e4m3", "rs", "acc", "", "A from registers (the register fragment above)"),
    Wgmma(64, 32, "e4m3", "ss", "pred", "", "the rows body's S^T over 64 rows"),
    Wgmma(64, 32, "e4m3", "ss", "zero", "_first", "the same, the first k-step"),
    Wgmma(32, 32, "e4m3", "ss", "zero", "_first", "N = 32, the first k-step"),
    Wgmma(64, 16, "f16", "rs", "acc", "", "the rows body's O^T (A = V^T in registers, f16; B = P^T)"),
    Wgmma(32, 16, "f16", "rs", "acc", "", "the same at 32 rows"),
    Wgmma(16, 16, "bf16", "ss", "pred", "", "the 16-row bf16 body's S^T (N = 16 query rows)"),
    Wgmma(16, 16, "bf16", "ss", "acc", "_mn", "its O^T: A = V^T read M-major through the descriptor", tnsp_a=1),
    Wgmma(64, 16, "bf16", "ss", "pred", "", "the rows body's bf16 S^T, 64 rows"),
    Wgmma(64, 16, "bf16", "ss", "zero", "_first", "the same, the first k-step"),
    Wgmma(32, 16, "bf16", "ss", "pred", "", "the rows body's bf16 S^T, 32 rows"),
    Wgmma(32, 16, "bf16", "ss", "zero", "_first", "the same, the first k-step"),
    Wgmma(32, 16, "bf16", "ss", "acc", "_mn", "its O^T, A = V^T M-major", tnsp_a=1),
    Wgmma(256, 16, "bf16", "rs", "acc", "_nb", "the rows body's bf16 O at 64 rows: A = P in registers, B = V N-major "
          "(4 atoms of 64 dims, LBO apart)", tnsp_b=1),
    Wgmma(128, 32, "e4m3", "ss", "acc", "", "the rows body's S^T of a bf16 q at 64 rows (hi + lo: N = 128)"),
    Wgmma(128, 32, "e4m3", "ss", "zero", "_first", "the same, the first k-step"),
)


def check_table(rows=WGMMA) -> None:
    """Each wrapper once, a legal shape: M = 64, N a multiple of 8 (16-bit) / 16 (8-bit) up to 256,
    K 32 for e4m3 and 16 for the 16-bit types; transposes only where the type has them."""
    names = [w.name for w in rows]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"wgmma table: {sorted(dup)} twice")
    for w in rows:
        if w.dtype not in ("e4m3", "bf16", "f16") or w.a not in ("ss", "rs") or w.d not in ("pred", "zero", "acc"):
            raise ValueError(f"{w.name}: dtype / a / d not one of the table's")
        if w.k != (32 if w.dtype == "e4m3" else 16) or not 8 <= w.n <= 256 or w.n % (16 if w.dtype == "e4m3" else 8):
            raise ValueError(f"{w.name}: n={w.n} k={w.k}: not a wgmma shape of {w.dtype}")
        if w.tnsp_a and (w.dtype == "e4m3" or w.a != "ss"):
            raise ValueError(f"{w.name}: tnsp_a: only the 16-bit types' descriptor A has a transpose")
        if w.tnsp_b and w.dtype == "e4m3":
            raise ValueError(f"{w.name}: tnsp_b: only the 16-bit types' B has a transpose")

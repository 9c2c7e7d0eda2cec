"""Run the Mamba-2 SSD tensor-core kernels on the CPU, under emulation, against float64.

The kernel source is taken from a candidate file's `cuda_source` (its `namespace tc`: the kernels
and their device helpers), prepared for g++ (the inline-PTX helpers named in EMULATED are removed:
cuda_emu.h defines them; `extern __shared__` becomes the block's emulated dynamic shared memory),
compiled into a shared library with a small launcher per requested instantiation, and run on
random inputs at small shapes. The library is cached by the hash of everything it is built from.

    python3 tools/cuda_emu/run_ssd.py                  # the quick validation set, paths 2 and 5
    python3 tools/cuda_emu/run_ssd.py --sweep          # N 64/128, P 32/64, nseg 1/2/3, ...
    python3 tools/cuda_emu/run_ssd.py --paths 2 --checks   # plus: broken copies, plain TF32
    python3 tools/cuda_emu/run_ssd.py --candidate other.py

Paths as in the candidate's ssd_fused_cfg: 2 = ssd_tc_kernel, every product in 3xTF32; 5 = the same
kernel with the state products in 3xBF16; 6 = C B^T in 3xBF16 too.
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import dataclasses
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CANDIDATE = ROOT / "examples" / "mamba2_ssd" / "candidate_y.py"
PROBLEM = ROOT / "examples" / "mamba2_ssd" / "problem_y.py"
HEADER = HERE / "cuda_emu.h"
CXXFLAGS = ["-O2", "-std=c++20", "-shared", "-fPIC", "-fno-strict-aliasing", "-w"]

# inline-PTX helpers of the candidate, replaced by cuda_emu.h's emulations (must all be present);
# EMULATED_OPTIONAL: the same, where a candidate has them
EMULATED = ("split_tf32", "mma_tf32", "cp_async16", "cp_async_commit", "cp_async_wait_all", "ld_acquire",
            "st_release")
EMULATED_OPTIONAL = ("tid_x", "cp_async4", "mma_bf16")

# path -> (kernel template, its layout struct: THREADS, BYTES)
KERNELS = {
    2: ("tc::ssd_tc_kernel<{N}, {P}, {Y}, 2, {T}>", "tc::TcLayout<{N}, {P}, {T}>"),
    5: ("tc::ssd_tc_kernel<{N}, {P}, {Y}, 2, {T}, 1>", "tc::TcLayout<{N}, {P}, {T}>"),
    6: ("tc::ssd_tc_kernel<{N}, {P}, {Y}, 2, {T}, 2>", "tc::TcLayout<{N}, {P}, {T}>"),
}
KERNEL_NAMES = ("ssd_tc_kernel",)
CTYPES = {"fp32": "float", "bf16": "__nv_bfloat16"}
TF32_MODES = {"faithful": 0, "no_lo": 1, "no_split": 2}


def cuda_source(candidate: Path) -> str:
    """The candidate's `cuda_source` string (a module-level assignment)."""
    for node in ast.parse(Path(candidate).read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "cuda_source":
            return node.value.value
    raise ValueError(f"{candidate} defines no cuda_source")


def device_part(src: str) -> str:
    """`namespace tc { ... }  // namespace tc`: the tensor-core kernels and their helpers."""
    start = src.index("namespace tc {")
    end = src.index("}  // namespace tc", start) + len("}  // namespace tc")
    return src[start:end]


def _definition(src: str, name: str, kind: str = "__device__") -> tuple[int, int]:
    """Span of the one definition `kind ... name(...) { ... }` (with a template line before it)."""
    head = r"(?:template\s*<[^;{}]*?>\s*)?" + kind + r"[^;{}]*?\b" + name + r"\s*\("
    m = re.search(head, src)
    if not m:
        raise ValueError(f"the kernel source defines no {kind} function {name}()")
    depth, i = 0, src.index("{", m.end())
    while True:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
        if depth == 0:
            break
    if re.search(head, src[i:]):
        raise ValueError(f"{name}() is defined twice")
    return m.start(), i


def _strip_function(src: str, name: str) -> str:
    a, b = _definition(src, name)
    return src[:a] + src[b:]


def prepare(src: str, mutations: tuple[tuple[str, str, str], ...] = ()) -> str:
    """Host-C++ form of the kernel source. `mutations`: (function, old, new) replacements inside
    that function's definition (a kernel or a device helper), each of a string found there exactly
    once (to build deliberately broken copies)."""
    for fn, old, new in mutations:
        a, b = _definition(src, fn, "__global__" if fn in KERNEL_NAMES else "__device__")
        body = src[a:b]
        if body.count(old) != 1:
            raise ValueError(f"mutation target found {body.count(old)} times in {fn}(): {old!r}")
        src = src[:a] + body.replace(old, new) + src[b:]
    for name in EMULATED + tuple(n for n in EMULATED_OPTIONAL if re.search(r"\b" + n + r"\s*\(", src)):
        src = _strip_function(src, name)
    src = re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?unsigned char (\w+)\[\];",
                 r"unsigned char* \1 = ::emu::dyn_smem();", src)
    src = re.sub(r"^\s*#pragma unroll.*$", "", src, flags=re.MULTILINE)
    if re.search(r"\basm\b", src):
        raise ValueError("inline PTX left in the kernel source: add its helper to EMULATED and cuda_emu.h")
    return src


@dataclasses.dataclass(frozen=True)
class Combo:
    """One kernel instantiation."""

    path: int
    n: int
    p: int
    want_y: bool
    dtype: str

    def cond(self) -> str:
        return (f"path == {self.path} && N == {self.n} && P == {self.p} && want_y == {int(self.want_y)} && "
                f"bf16 == {int(self.dtype == 'bf16')}")

    def call(self) -> str:
        kern, layout = KERNELS[self.path]
        fmt = dict(N=self.n, P=self.p, Y="true" if self.want_y else "false", T=CTYPES[self.dtype])
        return f"return run<{layout.format(**fmt)}, {CTYPES[self.dtype]}>({kern.format(**fmt)}, {self.p}, ARGS);"


DRIVER = r"""
#include "cuda_emu.h"
#include <cstdint>

%(kernels)s

// one kernel launch of the candidate's launch_tc, blocks run in emulation
template <class Layout, class T, class K>
const char* run(K kernel, int P, const void* X, const float* A, const void* B, const void* C, const float* S0,
                void* Y, float* S_out, int nb, int L, int H, int D, int seg_len, int nseg, float* ws, int* sync) {
  const unsigned grid = unsigned(nb * H * (D / P) * nseg);
  emu::launch(grid, Layout::THREADS, Layout::BYTES, [=] {
    kernel(static_cast<const T*>(X), A, static_cast<const T*>(B), static_cast<const T*>(C), S0, static_cast<T*>(Y),
           S_out, nb, L, H, D, seg_len, nseg, ws, sync);
  });
  return nullptr;
}

#define ARGS X, A, B, C, S0, Y, S_out, nb, L, H, D, seg_len, nseg, ws, sync
extern "C" const char* emu_ssd(int path, int N, int P, int want_y, int bf16, const void* X, const float* A,
                               const void* B, const void* C, const float* S0, void* Y, float* S_out, int nb,
                               int L, int H, int D, int seg_len, int nseg, float* ws, int* sync, int tf32_mode,
                               int block_order) {
  static std::string err;
  emu::g_tf32_mode = tf32_mode;
  emu::g_block_order = block_order;
  try {
%(dispatch)s
  } catch (const std::exception& e) {
    err = e.what();
    return err.c_str();
  }
  return "cuda_emu: this instantiation was not built";
}
"""


def _cache_dir() -> Path:
    d = Path(os.environ.get("KW_CUDA_EMU_CACHE", Path(tempfile.gettempdir()) / "kw-cuda-emu"))
    d.mkdir(parents=True, exist_ok=True)
    return d


class Emu:
    """A built library: `run(case)` launches the kernel on a case's inputs."""

    def __init__(self, lib_path: Path):
        self.lib = ctypes.CDLL(str(lib_path))
        self.lib.emu_ssd.restype = ctypes.c_char_p
        self.path = lib_path

    def launch(self, combo: Combo, X, A, B, C, S0, Y, S_out, nseg: int, seg_len: int, ws, sync,
               tf32_mode: str = "faithful", block_order: int = 0) -> None:
        b, L, H, D = X.shape
        ptr = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else None)
        err = self.lib.emu_ssd(
            combo.path, combo.n, combo.p, int(combo.want_y), int(combo.dtype == "bf16"), ptr(X), ptr(A), ptr(B),
            ptr(C), ptr(S0), ptr(Y), ptr(S_out), b, L, H, D, seg_len, nseg, ptr(ws), ptr(sync),
            TF32_MODES[tf32_mode], block_order)
        if err is not None:
            raise RuntimeError(err.decode())


def build(combos, candidate: Path = CANDIDATE, mutations=(), verbose: bool = False) -> Emu:
    """Compiles (or takes from the cache) a library with these instantiations of the candidate's kernels."""
    combos = sorted(set(combos), key=dataclasses.astuple)
    kernels = prepare(device_part(cuda_source(candidate)), tuple(mutations))
    dispatch = "\n".join(f"    if ({c.cond()}) {c.call()}" for c in combos)
    text = DRIVER % dict(kernels=kernels, dispatch=dispatch)
    gxx = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    key = hashlib.sha256("\0".join([text, HEADER.read_text(), " ".join(CXXFLAGS), gxx]).encode()).hexdigest()[:20]
    lib = _cache_dir() / f"ssd_{key}.so"
    if not lib.exists():
        with tempfile.TemporaryDirectory(dir=_cache_dir()) as tmp:
            cpp = Path(tmp) / "driver.cpp"
            cpp.write_text(text)
            out = Path(tmp) / "lib.so"
            cmd = ["g++", *CXXFLAGS, f"-I{HERE}", str(cpp), "-o", str(out)]
            if verbose:
                print(" ".join(cmd), flush=True)
            r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=lambda: os.nice(10))
            if r.returncode:
                raise RuntimeError(f"g++ failed:\n{r.stderr[-6000:]}")
            os.replace(out, lib)
    return Emu(lib)


@dataclasses.dataclass(frozen=True)
class Case:
    b: int = 1
    l: int = 80
    h: int = 2
    d: int = 64
    n: int = 128
    p: int = 64          # head-dim columns a block (the kernel's P)
    nseg: int = 1
    path: int = 2
    dtype: str = "fp32"
    init: bool = False   # an initial state
    a_kind: str = "neg"  # neg: -softplus(randn); pos: randn (both signs); fast: whole chunks underflow
    seed: int = 0

    def combo(self, want_y: bool) -> Combo:
        return Combo(self.path, self.n, self.p, want_y, self.dtype)

    def label(self) -> str:
        return (f"path{self.path} {self.dtype} b{self.b} l{self.l} h{self.h} d{self.d} n{self.n} P{self.p} "
                f"nseg{self.nseg} {'init ' if self.init else ''}A:{self.a_kind}")


_problem = None


def reference(X, A, B, C, S0):
    """float64 (Y, final state) of the reference model (one chunk: any length)."""
    global _problem
    if _problem is None:
        spec = importlib.util.spec_from_file_location("kw_emu_problem_y", PROBLEM)
        _problem = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_problem)
    with torch.no_grad():
        return _problem.ssd_chunked(X.double(), A.double(), B.double(), C.double(), X.shape[1],
                                    None if S0 is None else S0.double())


def inputs(case: Case):
    g = torch.Generator().manual_seed(case.seed)
    dt = torch.float32 if case.dtype == "fp32" else torch.bfloat16
    X = torch.randn(case.b, case.l, case.h, case.d, generator=g).to(dt)
    A = torch.randn(case.b, case.l, case.h, generator=g)
    if case.a_kind == "neg":
        A = -F.softplus(A)
    elif case.a_kind == "fast":  # decay so fast that whole chunks of a segment fall below float32's range
        A = -3.0 - 4.0 * A.abs()
    B = torch.randn(case.b, case.l, case.h, case.n, generator=g).to(dt)
    C = torch.randn(case.b, case.l, case.h, case.n, generator=g).to(dt)
    S0 = torch.randn(case.b, 1, case.h, case.d, case.n, generator=g) if case.init else None
    return X, A, B, C, S0


def segments(L: int, nseg: int) -> tuple[int, int]:
    """(nseg, seg_len) as the candidate's ssd_run makes them from a forced count."""
    nseg = min(nseg, (L + 31) // 32)
    seg_len = ((L + nseg - 1) // nseg + 31) // 32 * 32
    return (L + seg_len - 1) // seg_len, seg_len


def run_case(emu: Emu, case: Case, want: str = "y", tf32_mode: str = "faithful", block_order: int = 0) -> dict:
    """Runs the kernel (Y and/or state mode) on a case; normwise errors against float64, and for bf16
    the error of the float64 result itself rounded to bf16 (the best a bf16 output can do)."""
    X, A, B, C, S0 = inputs(case)
    Y64, S64 = reference(X, A, B, C, S0)
    b, L, H, D = X.shape
    nseg, seg_len = segments(L, case.nseg)
    per_seg = b * H * (D // case.p)
    err = lambda out, ref: ((out.double() - ref).norm() / ref.norm()).item()
    res = {}
    for want_y in {"y": [True], "state": [False], "both": [True, False]}[want]:
        ws = torch.full((per_seg * nseg * case.n * case.p,), float("nan"))
        sync = torch.zeros(1 + per_seg * nseg, dtype=torch.int32)
        s0 = S0.contiguous() if S0 is not None else None
        if want_y:
            Y = torch.full(X.shape, float("nan"), dtype=X.dtype)
            emu.launch(case.combo(True), X, A, B, C, s0, Y, None, nseg, seg_len, ws, sync, tf32_mode, block_order)
            res["y"], res["best_y"] = err(Y, Y64), err(Y64.to(X.dtype), Y64)
        else:
            S = torch.full((b, H, D, case.n), float("nan"))
            emu.launch(case.combo(False), X, A, B, C, s0, None, S, nseg, seg_len, ws, sync, tf32_mode, block_order)
            res["state"], res["best_state"] = err(S, S64), err(S64.to(X.dtype), S64)
    return res


def ok(case: Case, res: dict, tol: float = 1e-5) -> bool:
    """fp32: <= tol normwise; bf16: within 5% (+1e-5) of the float64 result rounded to bf16."""
    for k in ("y", "state"):
        if k in res:
            bound = tol if case.dtype == "fp32" else 1.05 * res[f"best_{k}"] + 1e-5
            if not res[k] <= bound:  # (NaN fails)
                return False
    return True


def quick_cases(path: int) -> list[Case]:
    """A few cases: ragged lengths, 1 and 3 segments, an initial state, both signs of A, bf16."""
    return [
        Case(path=path, l=80, nseg=1, init=True),
        Case(path=path, l=100, nseg=3, init=True, a_kind="pos", seed=1),
        Case(path=path, l=80, d=128, nseg=2, dtype="bf16", init=True, seed=2),
    ]


def sweep_cases(paths) -> list[Case]:
    cases = []
    for path in paths:
        for n in (64, 128):
            for p in (32, 64):
                for dtype in ("fp32", "bf16"):
                    for nseg in (1, 2, 3):
                        for init in (False, True):
                            cases.append(Case(path=path, l=100 if nseg > 1 else 72, d=2 * p if init else p, n=n,
                                              p=p, nseg=nseg, dtype=dtype, init=init,
                                              a_kind="pos" if nseg == 2 else "neg", seed=nseg + 10 * init))
        cases.append(Case(path=path, b=1, l=640, h=1, n=128, p=64, nseg=2, a_kind="fast", init=True, seed=5))
    return cases


# Deliberately broken copies: (path, mutations); each must be rejected (error far above 1e-5, or an
# emulator error such as a deadlock).
BROKEN = {
    "causal mask s <= l -> s < l (G, formed once per block)": (2, [
        ("ssd_tc_kernel", "gv[e] = (c4 + e <= l) ?", "gv[e] = (c4 + e < l) ?")]),
    "A fragment order of the state (hs[j][2] <-> hs[j][1])": (2, [
        ("ssd_tc_kernel", "split_a<false>(hs[j][0], hs[j][2], hs[j][1], hs[j][3])",
         "split_a<false>(hs[j][0], hs[j][1], hs[j][2], hs[j][3])")]),
    "C fragment row (8 * lt + g -> 8 * lt + t)": (2, [
        ("ssd_tc_kernel", "E::two(&sC[(8 * lt + g) * NS + nbk + 2 * t])",
         "E::two(&sC[(8 * lt + t) * NS + nbk + 2 * t])")]),
    "the chunk tables' A loaded by warp 0, the tables made by warp TW": (5, [
        ("ssd_tc_kernel", "if (warp == TW) pa =", "if (warp == 0) pa =")]),
    "no barrier before the C B^T partials are read": (2, [
        ("ssd_tc_kernel", "  __syncthreads();  // ---- barrier 2:", "  // ---- barrier 2 removed:")]),
    "no barrier between forming G and reading it": (5, [
        ("ssd_tc_kernel", "        __syncthreads();  // ---- barrier 2b", "        // ---- barrier 2b removed")]),
    "waits on the wrong flag (deadlock)": (2, [
        ("ssd_tc_kernel", "const int* f = sync + slot;", "const int* f = sync + slot + 1;")]),
    # path 5's 3xBF16 fragments: the state as A operand of C H in natural k order, and the state
    # update's permuted k (its A and B operands must agree)
    "path 5: state A fragment k order (hs[2jj][1] <-> hs[2jj][2])": (5, [
        ("ssd_tc_kernel", "split_bf_a<false>(hs[2 * jj][0], hs[2 * jj][1], hs[2 * jj][2],",
         "split_bf_a<false>(hs[2 * jj][0], hs[2 * jj][2], hs[2 * jj][1],")]),
    "path 5: state update B rows s1 <-> s2": (5, [
        ("ssd_tc_kernel", "E::one(&sB[s1 * NS + n]),\n", "E::one(&sB[s2 * NS + n]),\n")]),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", type=Path, default=CANDIDATE)
    ap.add_argument("--paths", default="2,5")
    ap.add_argument("--sweep", action="store_true", help="the larger case set (both modes: Y and state)")
    ap.add_argument("--checks", action="store_true",
                    help="also: path-2 broken copies, plain TF32 (no lo terms), reversed block order")
    a = ap.parse_args(argv)
    paths = [int(x) for x in a.paths.split(",")]
    cases = sweep_cases(paths) if a.sweep else [c for p in paths for c in quick_cases(p)]
    want = "both" if a.sweep else "y"
    combos = [c.combo(y) for c in cases for y in ({"y": [True], "both": [True, False]}[want])]
    emu = build(combos, a.candidate, verbose=True)
    failed = 0
    for case in cases:
        res = run_case(emu, case, want)
        good = ok(case, res)
        failed += not good
        print(f"{'ok  ' if good else 'FAIL'} {case.label():62s} " +
              " ".join(f"{k} {v:.2e}" for k, v in res.items()), flush=True)
    if a.checks:
        base = Case(path=2, l=100, nseg=3, init=True, seed=1)
        for mode in ("no_lo", "no_split"):
            res = run_case(emu if base.combo(True) in combos else build([base.combo(True)], a.candidate), base,
                           tf32_mode=mode)
            print(f"plain TF32 ({mode}): y {res['y']:.2e} (expected ~1e-3)")
        res = run_case(build([base.combo(True)], a.candidate), base, block_order=1)
        print(f"blocks in reverse order: y {res['y']:.2e}")
        for name, (path, muts) in BROKEN.items():
            case = dataclasses.replace(base, path=path)
            try:
                res = run_case(build([case.combo(True)], a.candidate, muts), case)
                verdict = "rejected" if not ok(case, res) else "NOT CAUGHT"
                failed += verdict != "rejected"
                print(f"broken: {name}: y {res['y']:.2e} {verdict}", flush=True)
            except RuntimeError as e:
                print(f"broken: {name}: rejected ({str(e).splitlines()[0][:150]})", flush=True)
    print("all ok" if not failed else f"{failed} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

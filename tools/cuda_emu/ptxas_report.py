"""Registers, spills and the chunk loop's SASS of the Mamba-2 SSD tensor-core kernels, without a GPU.

The candidate's `namespace tc` (kernels and device helpers: nothing of torch) is compiled alone by
nvcc for sm_90a with the flags torch's cpp_extension gives the real build (-O3, C++17,
--expt-relaxed-constexpr, the __CUDA_NO_*_CONVERSIONS__ defines), every path-2/5/6 instantiation
that the candidate's dispatch can launch made explicit. No torch headers, so no stubs are needed
and a build takes ~1 minute on 2 cores instead of ~100 s for the whole extension. ptxas's -v lines
give the resource table; with --sass, nvdisasm's SASS of one instance is cut into loops (a loop =
a backward branch and its target) and the chunk loop of the output pass (the loop holding the most
HMMA) is counted by instruction class: statically (each instruction once) and weighted (an inner
loop's body times its trip count, given with --trips in nesting order, outermost first).

    python3 tools/cuda_emu/ptxas_report.py                         # the table, every instance
    python3 tools/cuda_emu/ptxas_report.py --paths 5 --sass 5:128:64:Y:fp32 --trips 8,4
    python3 tools/cuda_emu/ptxas_report.py --candidate other.py --keep /tmp/x   # keep .cu/.cubin/.sass
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_ssd import CANDIDATE, cuda_source, device_part  # noqa: E402

FLAGS = ["-arch=sm_90a", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xptxas", "-v",
         "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
         "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
TYPES = {"fp32": "float", "bf16": "__nv_bfloat16"}


def instances(paths):
    """(label, explicit-instantiation text, mangled-name regex) for each launchable instance."""
    out = []
    for path in paths:
        bfs = {2: 0, 5: 1, 6: 2}[path]  # paths 5, 6: path 2's kernel with its last template argument (BFS) 1, 2
        for n in (64, 128):
            for p in (32, 64):
                for y in (True, False):
                    for dt, ct in TYPES.items():
                        yy = "true" if y else "false"
                        args = (f"(const {ct}*, const float*, const {ct}*, const {ct}*, const float*, {ct}*, float*, "
                                "int, int, int, int, int, int, float*, int*)")
                        name = f"tc::ssd_tc_kernel<{n}, {p}, {yy}, 2, {ct}, {bfs}>"
                        mangle = rf"ssd_tc_kernelILi{n}ELi{p}ELb{int(y)}ELi2E"
                        mangle += "13__nv_bfloat16" if dt == "bf16" else "f"
                        mangle += f"Li{bfs}E"
                        label = f"{path}:{n}:{p}:{'Y' if y else 'S'}:{dt}"
                        out.append((label, f"template __global__ void {name}{args};", mangle))
    return out


def build(candidate: Path, paths, work: Path):
    insts = instances(paths)
    src = ("#include <cuda_runtime.h>\n#include <cuda_bf16.h>\n#include <cstdint>\n"
           + device_part(cuda_source(candidate)) + "\n" + "\n".join(i[1] for i in insts) + "\n")
    cu, cubin = work / "dev.cu", work / "dev.cubin"
    cu.write_text(src)
    r = subprocess.run(["nvcc", "-cubin", *FLAGS, str(cu), "-o", str(cubin)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stdout + r.stderr)
    log = r.stdout + r.stderr
    rows = {}
    for m in re.finditer(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S):
        fn, regs = m.group(1), int(m.group(2))
        seg = log[m.start():m.end()]
        sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", seg)
        for label, _, mangle in insts:
            if re.search(mangle + r"EEv", fn):
                rows[label] = (regs, int(sp.group(1)), int(sp.group(2)), fn)
    return insts, rows, cubin


# (class, opcode pattern, operand pattern or None). The TF32 split: cvt.rna.tf32.f32 becomes
# VIADD +0x1000, FSETP |x| >= INF, SEL, LOP3 & 0xffffe000 on sm_90; lo = x - hi an FADD with a
# negated operand (counted here: other subtractions are rare in these kernels).
CLASSES = [
    ("HMMA", r"^HMMA", None),
    ("TF32 split (cvt.rna: VIADD/FSETP/SEL/LOP3)", r"^(VIADD|IADD3|FSETP\.GEU|SEL|LOP3)", r"0x1000\b|\+INF|0xffffe000|^SEL"),
    ("TF32 split (lo = x - hi: FADD)", r"^FADD", r", -R"),
    ("LDS", r"^LDS", None), ("STS", r"^STS", None),
    ("LDL/STL (spill)", r"^(LDL|STL)", None),
    ("BAR", r"^BAR", None),
    ("FMUL/FFMA/FADD", r"^(FMUL|FFMA|FADD)$", None),
    ("exp, float64 (MUFU, D*, F2F, FFMA.SAT/RM)", r"^(MUFU|DADD|DFMA|DMUL|DSETP|F2F|FFMA\.)", None),
    ("global / cp.async", r"^(LDG|STG|LDGSTS|LDGDEPBAR|DEPBAR)", None),
]


def classify(op: str, text: str = "") -> str:
    for name, pat, arg in CLASSES:
        if re.search(pat, op) and (arg is None or re.search(arg, op + " " + text.split(None, 1)[-1]
                                                               if op != "SEL" else "SEL")):
            return name
    return "integer / address / control"


def nvdisasm() -> str:
    """nvdisasm from PATH or $NVDISASM (the CUDA toolkit's, or pip's nvidia-cuda-nvdisasm)."""
    exe = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if not exe:
        sys.exit("nvdisasm not found: put it on PATH or set NVDISASM (pip: nvidia-cuda-nvdisasm)")
    return exe


def sass_of(cubin: Path, fn: str):
    """[(address, opcode, text)] of one kernel and {label: address} (nvdisasm names branch targets)."""
    r = subprocess.run([nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True)
    body = r.stdout.split(f"//--------------------- .text.{fn} ", 1)[1].split("//---------------------", 1)[0]
    ins, labels, pending = [], {}, []
    for line in body.splitlines():
        lm = re.match(r"^(\.L_x_\d+):", line)
        if lm:
            pending.append(lm.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            addr = int(m.group(1), 16)
            for lab in pending:
                labels[lab] = addr
            pending = []
            text = m.group(2).strip()
            op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
            ins.append((addr, op, text))
    return ins, labels


def _successors(ins, labels, divergent=True):
    """Successor indices of each instruction; divergent=False: a BRA.DIV (taken only when the warp
    has diverged) only falls through."""
    idx = {a: i for i, (a, _, _) in enumerate(ins)}
    succ = collections.defaultdict(list)
    for i, (a, op, text) in enumerate(ins):
        cond = text.startswith("@") or op.startswith("BRA.DIV")
        if not ((op.startswith("BRA") or op in ("EXIT", "RET")) and not cond) and i + 1 < len(ins):
            succ[i].append(i + 1)
        m = re.search(r"\((\.L_x_\d+)\)", text) if op.startswith("BRA") else None
        if m and m.group(1) in labels and (divergent or not op.startswith("BRA.DIV")):
            succ[i].append(idx[labels[m.group(1)]])
    return succ


def divergent_only(ins, labels):
    """Instructions reached only through a taken BRA.DIV: the compiler's copies of warp collectives
    (shuffles) for a diverged warp, never run where the warp is converged (as in these kernels)."""
    succ = _successors(ins, labels, divergent=False)
    seen, stack = {0}, [0]
    while stack:
        for j in succ[stack.pop()]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return set(range(len(ins))) - seen


def loops(ins, labels):
    """Natural loops: {header index: sorted instruction indices of the body}. An instruction's
    successors are the next one (unless it is an unconditional BRA or EXIT) and its branch target;
    a branch to an instruction that dominates it is a back edge, its loop every instruction that
    reaches the branch without passing through the header (out-of-line blocks that branch back
    included)."""
    succ = _successors(ins, labels)
    # basic blocks (leaders: entry, branch targets, instructions after a branch)
    leaders = {0} | {j for i in list(succ) for j in succ[i] if j != i + 1} | {
        i + 1 for i in range(len(ins) - 1) if succ[i] != [i + 1]}
    starts = sorted(leaders)
    block_of, ends = {}, {}
    for k, st in enumerate(starts):
        en = (starts[k + 1] if k + 1 < len(starts) else len(ins)) - 1
        ends[st] = en
        for i in range(st, en + 1):
            block_of[i] = st
    bsucc = {st: {block_of[j] for j in succ[ends[st]]} for st in starts}
    bpred = collections.defaultdict(set)
    for st, ss in bsucc.items():
        for q in ss:
            bpred[q].add(st)
    def reachable(without=None):
        seen, stack = {0}, [0]
        while stack:
            for q in bsucc[stack.pop()]:
                if q not in seen and q != without:
                    seen.add(q)
                    stack.append(q)
        return seen

    reach = reachable()
    avoid = {}  # h -> the blocks reachable from the entry without passing through h

    def dominates(h, st):
        if h not in avoid:
            avoid[h] = reachable(h) if h != 0 else set()
        return st not in avoid[h]

    out = collections.defaultdict(set)
    for st in sorted(reach):
        for h in bsucc[st]:
            if h <= st and dominates(h, st):  # back edge st -> h
                body, stack = {h, st}, ([st] if st != h else [])
                while stack:
                    for q in bpred[stack.pop()]:
                        if q not in body and q in reach:
                            body.add(q)
                            stack.append(q)
                out[h] |= body
    return {h: sorted(i for b in bs for i in range(b, ends[b] + 1)) for h, bs in out.items()}


def count(ins, body):
    return collections.Counter(classify(ins[i][1], ins[i][2]) for i in body if ins[i][1] != "NOP")


def chunk_loop_report(ins, labels, trips):
    """The chunk loop of the output pass: the smallest loop holding the most HMMA of any loop; its
    inner loops (smaller loops inside it) weighted by `trips` (in order of their headers' addresses)."""
    lp = loops(ins, labels)
    hm = {h: sum(1 for i in b if ins[i][1].startswith("HMMA")) for h, b in lp.items()}
    top = max(hm.values())
    h = min((x for x in lp if hm[x] == top), key=lambda x: len(lp[x]))
    body = set(lp[h])
    inner = sorted(x for x in lp if x != h and x in body and set(lp[x]) < body)
    cold = divergent_only(ins, labels)
    static = count(ins, body - cold)
    weighted = collections.Counter(static)
    for k, x in enumerate(inner):
        tr = trips[k] if k < len(trips) else 1
        for key, v in count(ins, set(lp[x]) - cold).items():
            weighted[key] += (tr - 1) * v
    return h, body, [(x, len(lp[x]), hm[x]) for x in inner], static, weighted, len(body & cold)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidate", type=Path, default=CANDIDATE)
    ap.add_argument("--paths", default="2,5,6", help="tensor-core paths: 2, 5, 6")
    ap.add_argument("--sass", default=None, help="path:N:P:Y|S:fp32|bf16, e.g. 5:128:64:Y:fp32")
    ap.add_argument("--trips", default="", help="trip counts of the chunk loop's inner loops, in address order")
    ap.add_argument("--keep", type=Path, default=None, help="a folder for dev.cu, dev.cubin, the SASS")
    a = ap.parse_args(argv)
    paths = [int(x) for x in a.paths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        insts, rows, cubin = build(a.candidate, paths, work)
        print(f"{'instance (path:N:P:mode:dtype)':34s} regs  spill st/ld")
        for label, _, _ in insts:
            r = rows.get(label)
            print(f"{label:34s} {r[0]:4d}  {r[1]:4d} / {r[2]:<4d}" if r else f"{label:34s} (not found)")
        if a.sass:
            fn = rows[a.sass][3]
            ins, labels = sass_of(cubin, fn)
            if a.keep:
                (work / "kernel.sass").write_text("\n".join(f"/*{x:04x}*/ {t}" for x, _, t in ins))
            h, body, inner, static, weighted, ncold = chunk_loop_report(ins, labels, [int(x) for x in a.trips.split(",") if x])
            print(f"\n{a.sass}: {len(ins)} instructions; chunk loop: header 0x{ins[h][0]:04x}, {len(body)} instructions "
                  f"(0x{ins[min(body)][0]:04x}..0x{ins[max(body)][0]:04x}); inner loops (header, size, HMMA): "
                  f"{[(hex(ins[x][0]), n, m) for x, n, m in inner]}; counted without the {ncold} instructions "
                  "only a diverged warp runs (BRA.DIV copies of warp shuffles)")
            print(f"{'class':44s} static  weighted")
            keys = [k for k, _, _ in CLASSES] + ["integer / address / control"]
            for k in keys:
                print(f"{k:44s} {static.get(k, 0):6d}  {weighted.get(k, 0):8d}")
            print(f"{'total (NOP excluded)':44s} {sum(static.values()):6d}  {sum(weighted.values()):8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compare two cubins kernel by kernel: did a source change leave the machine code of these kernels alone?

For every kernel both hold: each ELF section named for it (.text.K: the machine code; .nv.info.K: its
attributes; .nv.constant0.K, .nv.shared.K, ...) byte for byte, its entries of the global .nv.info, and
its relocations entry by entry, with symbol indices read as symbol names (indices shift when other
kernels leave the symbol table). Lists the kernels only one of the two holds.

    python3 tools/cuda_emu/ptxas_report.py --candidate OLD.py --keep /tmp/old   # the tensor-core kernels
    python3 tools/cuda_emu/ptxas_report.py --keep /tmp/new
    python3 tools/cuda_emu/cubin_diff.py /tmp/old/dev.cubin /tmp/new/dev.cubin

(or two cubins of the whole cuda.cu, from `nvcc -cubin` with torch's flags).
"""
import collections
import re
import struct
import sys

# a kernel in an anonymous namespace is named for its file and a hash of the file's text
# (_ZN41_GLOBAL__N__63e24daf_9_before_cu_82b06c35...): that name changes with any edit of the file
ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+")
def norm(name):
    return ANON.sub("<anonymous namespace>", name)

def elf(path):
    b = open(path, "rb").read()
    assert b[:4] == b"\x7fELF" and b[4] == 2, "ELF64 expected"
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    def cstr(base, off):
        return b[base + off:b.index(b"\0", base + off)].decode()
    names = [cstr(hdrs[shstrndx][4], h[0]) for h in hdrs]
    secs = {norm(n): (h[1], h[5], b[h[4]:h[4] + h[5]] if h[1] != 8 else b"") for n, h in zip(names, hdrs, strict=True)}
    symtab = hdrs[names.index(".symtab")]
    strtab = hdrs[names.index(".strtab")][4]
    syms = []
    for i in range(symtab[5] // 24):
        st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", b, symtab[4] + 24 * i)
        sec = names[st_shndx] if 0 < st_shndx < len(names) else st_shndx
        syms.append(norm(cstr(strtab, st_name) or f"<section {sec}>"))
    return secs, syms

def relocs(data, rela, syms):
    size = 24 if rela else 16
    out = []
    for i in range(len(data) // size):
        off, info = struct.unpack_from("<QQ", data, i * size)
        add = struct.unpack_from("<q", data, i * size + 16)[0] if rela else None
        out.append((off, info & 0xffffffff, syms[info >> 32], add))
    return out

PREFIXES = (".text.", ".nv.info.", ".nv.constant0.", ".nv.shared.", ".nv.local.")
# .nv.info attributes (EIATTR_*) whose payload starts with a symbol index: PARAM_CBANK (0x0a), FRAME_SIZE
# (0x11), MIN_STACK_SIZE (0x12), MAX_STACK_SIZE (0x23), REGCOUNT (0x2f); the index is read as the name
SYM_ATTRS = {0x0A, 0x11, 0x12, 0x23, 0x2F}

def info(data, syms):
    """.nv.info entries (format, attribute, payload), symbol indices replaced by symbol names."""
    i, out = 0, []
    while i < len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == 4:  # EIFMT_SVAL: a 16-bit size, then the payload
            size, = struct.unpack_from("<H", data, i + 2)
            payload = data[i + 4:i + 4 + size]
            i += 4 + size
            if attr in SYM_ATTRS and size >= 4:
                payload = (syms[struct.unpack_from("<I", payload)[0]], payload[4:])
        else:
            payload = data[i + 2:i + 4]
            i += 4
        out.append((fmt, attr, payload))
    return out

def by_kernel(path):
    secs, syms = elf(path)
    k = collections.defaultdict(dict)
    for fmt, attr, payload in info(secs[".nv.info"][2], syms):  # the per-function entries of .nv.info
        if isinstance(payload, tuple) and payload[0] != "":
            k[payload[0]].setdefault(".nv.info (global)", []).append((fmt, attr, payload[1]))
    for nm, (typ, size, data) in secs.items():
        for rel, base in ((".rela", True), (".rel", False), ("", None)):
            for p in PREFIXES:
                if nm.startswith(rel + p) and (rel or not nm.startswith(".rel")):
                    kern = nm[len(rel + p):]
                    if rel:
                        k[kern][rel + p] = relocs(data, base, syms)
                    elif p == ".nv.info.":
                        k[kern][p] = info(data, syms)
                    else:
                        k[kern][p] = (typ, size, data)
                    break
            else:
                continue
            break
    return k

if len(sys.argv) != 3:
    sys.exit("usage: python3 tools/cuda_emu/cubin_diff.py OLD.cubin NEW.cubin")
A, B = sys.argv[1], sys.argv[2]
ka, kb = by_kernel(A), by_kernel(B)
both = sorted(set(ka) & set(kb))
diff = [k for k in both if ka[k] != kb[k]]
for k in diff:
    print("DIFFERS:", k, sorted(p for p in set(ka[k]) | set(kb[k]) if ka[k].get(p) != kb[k].get(p)))
nsec = sum(len(ka[k]) for k in both)
print(f"kernels in both: {len(both)} ({nsec} sections); identical: {len(both) - len(diff)}; differing: {len(diff)}")
for name, only in ((A, sorted(set(ka) - set(kb))), (B, sorted(set(kb) - set(ka)))):
    print(f"only in {name}: {len(only)}")
    for k in only:
        print("   ", k)
sys.exit(1 if diff else 0)

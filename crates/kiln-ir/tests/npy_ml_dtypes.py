"""numpy + ml_dtypes side of crates/kiln-ir/tests/npy_ml_dtypes.rs (run by that test with
the test venv's python, .venv/bin/python; ml_dtypes is pinned in scripts/requirements.txt).

    npy_ml_dtypes.py save DIR    for every ml_dtypes type X kiln has, np.save an array of
                                 every bit pattern X has (a sample for bfloat16) as
                                 DIR/X.npy, its values as float64 in DIR/X.f64.npy
    npy_ml_dtypes.py check DIR   for every X, np.load DIR/kiln_X.npy (kiln's file of the
                                 array kiln read from DIR/X.npy) and .view(X): the shape
                                 and every element's bits must be those saved as DIR/X.npy,
                                 the file byte for byte what numpy.save writes (with '<V1'
                                 for float8_e5m2, for which numpy.save writes '<f1', a descr
                                 numpy.load refuses)

Exits non-zero naming the first difference; prints one line per type checked.
"""
import io
import os
import sys

import ml_dtypes
import numpy as np

# kiln dtype name -> (ml_dtypes type, bits of an element)
TYPES = {
    "bf16": (ml_dtypes.bfloat16, 16),
    "f8E4M3FN": (ml_dtypes.float8_e4m3fn, 8),
    "f8E4M3FNUZ": (ml_dtypes.float8_e4m3fnuz, 8),
    "f8E5M2": (ml_dtypes.float8_e5m2, 8),
    "f8E5M2FNUZ": (ml_dtypes.float8_e5m2fnuz, 8),
    "f8E8M0FNU": (ml_dtypes.float8_e8m0fnu, 8),
    "f6E3M2FN": (ml_dtypes.float6_e3m2fn, 6),
    "f4E2M1FN": (ml_dtypes.float4_e2m1fn, 4),
    "i4": (ml_dtypes.int4, 4),
    "u4": (ml_dtypes.uint4, 4),
}


def patterns(name):
    """Every bit pattern of the type (for bf16 every 7th, and the last), shaped to an odd
    count of rows so the sub-byte types have an odd element count."""
    t, bits = TYPES[name]
    if bits == 16:
        codes = np.concatenate([np.arange(0, 1 << 16, 7), [0xFFFF]]).astype(np.uint16)
    else:
        codes = np.arange(1 << bits, dtype=np.uint8)
    codes = np.concatenate([codes, codes[:1]])  # odd length (2^k + 1)
    return codes.view(t).reshape(1, -1, 1) if len(codes) % 3 else codes.view(t).reshape(-1, 3)


def save(d):
    for name, (t, _) in TYPES.items():
        a = patterns(name)
        np.save(os.path.join(d, name + ".npy"), a)
        with np.errstate(invalid="ignore"):  # NaN codes
            np.save(os.path.join(d, name + ".f64.npy"), a.astype(np.float64))
        print(f"saved {name}: {a.shape} {a.dtype}")


def check(d):
    bad = 0
    for name, (t, _) in TYPES.items():
        # Made again, not loaded: numpy.load refuses its own float8_e5m2 file ('<f1').
        want = patterns(name)
        path = os.path.join(d, "kiln_" + name + ".npy")
        raw = np.load(path)
        got = raw.view(t)
        uint = np.uint16 if want.itemsize == 2 else np.uint8
        # Byte for byte what numpy.save writes for the ml_dtypes array, but for float8_e5m2,
        # whose '<f1' numpy.load refuses: kiln writes '<V1' there.
        saved = io.BytesIO()
        np.save(saved, want)
        saved = saved.getvalue()
        if t is ml_dtypes.float8_e5m2:
            saved = saved.replace(b"'descr': '<f1'", b"'descr': '<V1'", 1)
        with open(path, "rb") as f:
            same_file = f.read() == saved
        if raw.dtype.kind != "V" or got.shape != want.shape or not np.array_equal(got.view(uint), want.view(uint)):
            print(f"{path}: {raw.dtype} {got.shape}, want {want.shape}; bits differ", file=sys.stderr)
            bad += 1
        elif not same_file:
            print(f"{path}: not the bytes numpy.save writes for the ml_dtypes array", file=sys.stderr)
            bad += 1
        else:
            print(f"checked {name}: {got.shape} {raw.dtype} -> {got.dtype}, the file numpy.save writes")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    {"save": save, "check": check}[sys.argv[1]](sys.argv[2])

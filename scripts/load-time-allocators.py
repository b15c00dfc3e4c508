#!/usr/bin/env python3
"""Load time of artifacts under two builds of `kiln` (e.g. without and with the
`mimalloc` feature), interleaved: each round runs `kiln run ART --threads 1` once with
each build, alternating which goes first, and reads the `loaded in X ms` figure `kiln run`
prints (verify + bind + place code; the file is read before the clock starts).

usage: scripts/load-time-allocators.py KILN_A KILN_B ROUNDS ART.kiln [ART.kiln ...]
"""
import re
import statistics
import subprocess
import sys


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    bins = {'A': sys.argv[1], 'B': sys.argv[2]}
    rounds = int(sys.argv[3])
    arts = sys.argv[4:]
    t = {(a, b): [] for a in arts for b in bins}
    for r in range(rounds):
        for a in arts:
            order = list(bins.items()) if r % 2 == 0 else list(bins.items())[::-1]
            for b, exe in order:
                err = subprocess.run([exe, 'run', a, '--threads', '1'], capture_output=True, text=True).stderr
                m = re.search(r'loaded in ([0-9.]+) ms', err)
                if not m:
                    sys.exit(f'{exe} run {a}: no load time in: {err}')
                t[(a, b)].append(float(m.group(1)))
    for (a, b), v in t.items():
        print(f'{a:40} {bins[b]:40} median {statistics.median(v):8.2f} ms  min {min(v):8.2f}  max {max(v):8.2f}  n={len(v)}')


main()

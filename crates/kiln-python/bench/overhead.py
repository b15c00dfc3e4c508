#!/usr/bin/env python3
"""What `Module.run` costs on top of the runtime's invoke: the median wall time of
`module.run({...})` timed call by call from Python, minus the median of
`module.bench()` (invoke alone, timed in Rust on the same instance), in rounds that
interleave the two so that a noisy machine disturbs both alike.

    .venv/bin/python crates/kiln-python/bench/overhead.py [MODEL.onnx] [--rounds R] [--calls N] [--threads T] [--outputs]

--outputs times `run(inputs, outputs=...)` into arrays allocated once.

MODEL defaults to $KILN_TEST_DATA/models/mlp.onnx (KILN_TEST_DATA defaults to .cache).
Prints each round and the median over rounds of the difference, in microseconds.
"""

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

import kiln


def main():
    repo = Path(__file__).resolve().parents[3]
    data = Path(os.environ.get("KILN_TEST_DATA", repo / ".cache"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=str(data / "models" / "mlp.onnx"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--outputs", action="store_true", help="write into preallocated output arrays")
    a = ap.parse_args()

    m = kiln.load(kiln.compile(a.model), threads=a.threads)
    rng = np.random.default_rng(0)
    feed = {i.name: rng.random(i.shape).astype(i.dtype) for i in m.inputs}
    out = {o.name: np.empty(o.shape, o.dtype) for o in m.outputs} if a.outputs else None
    for _ in range(200):  # warm up both paths
        m.run(feed, out)
    m.bench(iterations=200, warmup=0, inputs=feed)

    clock = time.perf_counter_ns
    run_us, invoke_us, diff_us = [], [], []
    for r in range(a.rounds):
        t = []
        for _ in range(a.calls):
            t0 = clock()
            m.run(feed, out)
            t.append(clock() - t0)
        run = statistics.median(t) / 1e3
        inv = m.bench(iterations=a.calls, warmup=0, inputs=feed)["median_ms"] * 1e3
        run_us.append(run)
        invoke_us.append(inv)
        diff_us.append(run - inv)
        print(f"round {r:2}: run {run:8.2f} us  invoke {inv:8.2f} us  overhead {run - inv:6.2f} us")
    print(
        f"{Path(a.model).name}, {a.threads} thread(s), {a.rounds} rounds x {a.calls} calls"
        f"{', outputs preallocated' if a.outputs else ''}: "
        f"median run {statistics.median(run_us):.2f} us, median invoke {statistics.median(invoke_us):.2f} us, "
        f"median overhead {statistics.median(diff_us):.2f} us (min {min(diff_us):.2f}, max {max(diff_us):.2f})"
    )


if __name__ == "__main__":
    main()

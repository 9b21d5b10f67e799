#!/usr/bin/env python3
"""The zoo table of docs/benchmarks.md from one session's GPU logs: dcir
(`run.sh zoo`'s zoo.log), PyTorch eager and torch.compile (`run.sh
zoo-peers`' zoo_peers.log, without and with ZOO_COMPILE=1). Runs anywhere
(no dependencies):

    python3 xtask/gpu/zoo_table.py zoo.log eager.log compile.log

Prints a markdown table (times in ms, ratios peer/dcir: above 1, dcir is
faster) and per dtype and peer the geomean and the worst five.
"""

import math
import sys


def dcir_times(path):
    """(model, dtype) -> median ms of the runs that passed."""
    times = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[2] == "PASS" and f[3] == "median":
            times[(f[0], f[1])] = float(f[4])
    return times


def peer_times(path, column):
    """(model, dtype) -> ms from zoo_peers.py's `name dtype eager compile` lines."""
    times = {}
    for line in open(path):
        f = line.split()
        if len(f) == 4 and f[2] != "ERROR":
            ms = float(f[2 + column])
            if not math.isnan(ms):
                times[(f[0], f[1])] = ms
    return times


def cell(times, key):
    return f"{times[key]:.3f}" if key in times else "—"


def ratio(peer, dcir, key):
    return f"{peer[key] / dcir[key]:.2f}×" if key in peer and key in dcir else "—"


def main():
    dcir = dcir_times(sys.argv[1])
    eager = peer_times(sys.argv[2], 0)
    compiled = peer_times(sys.argv[3], 1)
    models = sorted({m for m, _ in dcir} | {m for m, _ in eager} | {m for m, _ in compiled})
    # Only the dtypes some log has (a batch-32 run may be f16 alone).
    dtypes = [dt for dt in ("f32", "f16") if any(k[1] == dt for t in (dcir, eager, compiled) for k in t)]
    head = "".join(f" dcir {dt} | eager {dt} | torch.compile {dt} | eager/dcir | compile/dcir |" for dt in dtypes)
    print("| model |" + head)
    print("|---|" + "---:|" * 5 * len(dtypes))
    for m in models:
        row = [m]
        for dt in dtypes:
            k = (m, dt)
            row += [cell(dcir, k), cell(eager, k), cell(compiled, k),
                    ratio(eager, dcir, k), ratio(compiled, dcir, k)]
        print("| " + " | ".join(row) + " |")
    print()
    for dt in dtypes:
        for name, peer in (("eager", eager), ("torch.compile", compiled)):
            r = sorted((peer[k] / dcir[k], k[0]) for k in dcir if k[1] == dt and k in peer)
            if not r:
                continue
            g = math.exp(sum(math.log(x) for x, _ in r) / len(r))
            worst = ", ".join(f"{m} {x:.2f}×" for x, m in r[:5])
            wins = sum(x > 1 for x, _ in r)
            print(f"{dt}: {name}/dcir geomean **{g:.2f}×** over {len(r)} models, dcir faster on {wins}; "
                  f"worst five: {worst}\n")


if __name__ == "__main__":
    main()

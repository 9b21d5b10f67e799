"""The cost model against the GPU, group by group: joins a plan's estimates
(`dcir-opt --fuse --emit plan --format json --device D FILE`) with the times
`dcir-run FILE --backend cuda --device D --bench N --per-kernel` measured
(the same preset on both sides, so the plans are the same), and prints each
group's estimate, time and ratio, then the geomean ratio per class
(tensor-core compute-bound kernels, library calls, memory-bound kernels):
the figures the efficiencies in docs/cost-model.md are fitted to.

    python3 fit.py PLAN.json PER_KERNEL.txt [LABEL]
"""
import json, math, re, sys


def classify(g):
    params = g.get("params", {})
    if "library" in params:
        return f"library {params['library']}"
    math_ = params.get("math", "")
    return f"{g['kind']} {math_ or 'simt'} {g['bound']}".strip()


def main():
    plan_path, times_path = sys.argv[1], sys.argv[2]
    label = sys.argv[3] if len(sys.argv) > 3 else plan_path
    plan = json.load(open(plan_path))["graphs"][0]
    groups = {g["symbol"]: g for g in plan["groups"]}
    measured = {}
    for line in open(times_path):
        m = re.match(r"\s+([0-9.]+)\s+[0-9.]+%\s+(\S+)", line)
        if m:
            symbol = m.group(2).rsplit("_", 1)[-1]
            measured.setdefault(symbol, []).append(float(m.group(1)) * 1000.0)
    classes = {}
    print(f"## {label}")
    print("| group | class | GFLOP | MB | est us | measured us | measured/est | TFLOP/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for symbol, g in groups.items():
        if symbol not in measured:
            continue
        t = sorted(measured[symbol])[len(measured[symbol]) // 2]
        est = g["estimate_us"]
        ratio = t / est if est > 0 else float("nan")
        cls = classify(g)
        classes.setdefault(cls, []).append((ratio, t))
        mb = (g["bytes_in"] + g["bytes_out"]) / 1e6
        print(f"| {symbol} | {cls} | {g['flops'] / 1e9:.3f} | {mb:.1f} | {est:.2f} | {t:.2f} | {ratio:.2f} | "
              f"{g['flops'] / (t * 1e6):.1f} |")
    print()
    print("| class | groups | measured us | geomean measured/est |")
    print("|---|---:|---:|---:|")
    for cls, rs in sorted(classes.items()):
        geo = math.exp(sum(math.log(r) for r, _ in rs if r > 0) / len(rs))
        print(f"| {cls} | {len(rs)} | {sum(t for _, t in rs):.1f} | {geo:.2f} |")


if __name__ == "__main__":
    main()

"""Print the vLLM accuracy table of docs/ACCURACY.md: predicted, measured and error per
published run, calibrate and held-out splits separately, and the summary against the targets.

Run: .venv/bin/python -m research.vllm_accuracy
"""

from __future__ import annotations

from research.vllm_runs import compare, load_runs, run_request, summary

QUANTITIES = [
    ("weights_gib", "weights GiB", 2),
    ("kv_cache_gib", "KV pool GiB", 2),
    ("kv_cache_tokens", "KV tokens", 0),
    ("max_concurrency", "max concurrency", 2),
]


def main() -> int:
    comparisons = []
    for split in ("calibrate", "held_out"):
        print(f"\n#### {split}\n")
        print("| run | " + " | ".join(f"{n} (pred / meas / err)" for _, n, _ in QUANTITIES) + " |")
        print("|---|" + "---|" * len(QUANTITIES))
        for run in load_runs():
            if run["split"] != split:
                continue
            cs = {c.quantity: c for c in compare(run)}
            comparisons += cs.values()
            if not cs:
                continue
            cells = []
            for q, _, digits in QUANTITIES:
                c = cs.get(q)
                cells.append(
                    "-"
                    if c is None
                    else f"{c.predicted:,.{digits}f} / {c.measured:,.{digits}f} / "
                    f"{100 * c.error:+.2f}%"
                )
            label = next(iter(cs.values())).label
            print(f"| {label} | " + " | ".join(cells) + " |")
    print("\n| quantity | split | runs | median abs error | max abs error |")
    print("|---|---|---:|---:|---:|")
    for q, name, _ in [*QUANTITIES, ("activation_peak_gib", "activation peak", 2)]:
        for split in ("calibrate", "held_out"):
            s = summary(comparisons, q, split)
            print(
                f"| {name} | {split} | {s['n']} | {100 * s['median']:.2f}% | "
                f"{100 * s['max']:.2f}% |"
            )
    print("\nLeft out:")
    for run in load_runs():
        req = run_request(run)
        if isinstance(req, str):
            print(f"- {run['id']} ({run['split']}): {req}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

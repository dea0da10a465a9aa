"""`llmdiag whatif` against the simulator: predicted against measured, for every preset and every fix its verdict
quantifies (target ±10 %).

Each preset is scanned in simulated time (its users ramped in levels, so the step's slope against the batch is
measured), each fix its findings predict is applied to the simulator, the same users are rerun, and the rerun's
window (after its warm-up) is read as a scan reads it (``llmdiag.planning.validate_whatif``). A ratio is
predicted / measured; a measured value below 1 (a queue of 0.4 requests, a TTFT of 15 ms) is compared with an
absolute tolerance of ±1 in its unit instead, as the real-server targets do.

    .venv/bin/python bench/whatif_accuracy.py                    # every preset (~1 min)
    .venv/bin/python bench/whatif_accuracy.py scheduling memory  # some

Prints the table and how many figures land within ±10 %; asserts nothing.
"""

from __future__ import annotations

import argparse
import time

from llmdiag.planning import validate_whatif
from llmdiag.sim.presets import PRESETS

FIGURES = (
    ("requests_running", "running"),
    ("requests_waiting", "waiting"),
    ("per_user_tokens_per_second", "per-user tok/s"),
    ("per_user_tokens_per_second_incl_waiting", "per-user tok/s incl. queue"),
    ("ttft_p50_seconds", "TTFT p50 s"),
    ("total_tokens_per_second", "total tok/s"),
)
TARGET = 0.10


def within(predicted: float, measured: float) -> bool:
    if abs(measured) < 1:
        return abs(predicted - measured) <= 1
    return abs(predicted / measured - 1) <= TARGET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("presets", nargs="*", default=list(PRESETS))
    parser.add_argument("--seconds", type=float, default=40.0, help="simulated seconds per run")
    args = parser.parse_args()
    hits = total = 0
    classes_right = classes = 0
    print(f"{'preset':11} {'change':28} {'figure':27} {'predicted':>10} {'measured':>10} {'ratio':>6}  ok")
    for name in args.presets:
        started = time.monotonic()
        checks = validate_whatif(name, args.seconds)
        if not checks:
            print(f"{name:11} (no fix its verdict quantifies)")
        for check in checks:
            change = ", ".join(f"{k}={v}" for k, v in check.changes.items())
            p = check.prediction
            right = p.class_after == check.measured_class
            classes += 1
            classes_right += right
            print(
                f"{name:11} {change:28} class {p.class_before} → {p.class_after}; measured {check.measured_class}"
                f"{'' if right else '  (missed)'}"
            )
            for field, label in FIGURES:
                predicted, measured = getattr(p.after, field), getattr(check.measured, field)
                if predicted is None or measured is None:
                    print(f"{'':11} {'':28} {label:27} {'n/a':>10} {'n/a':>10}")
                    continue
                ok = within(predicted, measured)
                hits += ok
                total += 1
                ratio = f"{predicted / measured:.2f}" if measured else "-"
                print(f"{'':11} {'':28} {label:27} {predicted:10.4g} {measured:10.4g} {ratio:>6}  {'✓' if ok else '✗'}")
        print(f"{'':11} ({time.monotonic() - started:.0f} s)")
    print(
        f"\nwithin ±{TARGET:.0%} (or ±1 below 1): {hits} of {total} figures;"
        f" class after right: {classes_right} of {classes}"
    )


if __name__ == "__main__":
    main()

"""A small, explainable fit of a verdict's confidence factors (bench/calibration.py ``--fit``): a logistic model
P(right) = σ(Σ wᵢ·xᵢ) over the factors ``calibration.factors`` reads from each verdict (the primary finding's severity
or none, core-signal coverage, margin past the critical threshold, rival classes, log window length, a single dump,
sanity findings), fitted by Newton's method with a ridge penalty on the cases that are not held out, and scored on
the held-out ones beside the confidence llmdiag states today. A proposal to read, not applied anywhere."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

FEATURES = ("critical", "warning", "no_finding", "coverage", "margin", "rivals", "log_window", "single_dump", "sanity")
RIDGE = 1.0  # keeps the weights finite where a factor separates right from wrong perfectly
ITERATIONS = 25


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a 9 × 9 system)."""
    n = len(vector)
    a = [row[:] + [v] for row, v in zip(matrix, vector, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def fit(rows: Sequence[dict[str, float]], labels: Sequence[bool]) -> dict[str, float]:
    """Ridge-penalised logistic regression by Newton's method; the weights by factor name."""
    xs = [[row.get(name, 0.0) for name in FEATURES] for row in rows]
    w = [0.0] * len(FEATURES)
    for _ in range(ITERATIONS):
        grad = [RIDGE * wi for wi in w]
        hess = [[RIDGE if i == j else 0.0 for j in range(len(w))] for i in range(len(w))]
        for x, y in zip(xs, labels, strict=True):
            p = _sigmoid(sum(wi * xi for wi, xi in zip(w, x, strict=True)))
            for i, xi in enumerate(x):
                grad[i] += (p - float(y)) * xi
                for j, xj in enumerate(x):
                    hess[i][j] += p * (1 - p) * xi * xj
        step = _solve(hess, grad)
        w = [wi - si for wi, si in zip(w, step, strict=True)]
        if max(abs(s) for s in step) < 1e-8:
            break
    return dict(zip(FEATURES, w, strict=True))


def predict(weights: dict[str, float], row: dict[str, float]) -> float:
    return _sigmoid(sum(weights[name] * row.get(name, 0.0) for name in FEATURES))


def report_fit(outcomes: Sequence[Any], held_out: Callable[[Any], bool]) -> str:
    """Fit on the cases not held out; the weights, and the held-out cases' Brier score stated vs fitted."""
    from bench.calibration import brier, reliability

    train = [o for o in outcomes if not held_out(o)]
    test = [o for o in outcomes if held_out(o)]
    if not train:
        return "## fitted confidence factors\n\nno cases to fit on\n"
    weights = fit([o.factors for o in train], [o.right for o in train])
    lines = ["## fitted confidence factors (proposal; logistic, ridge 1)", "", "| factor | weight |", "|---|---:|"]
    lines += [f"| {name} | {weights[name]:+.2f} |" for name in FEATURES]
    typical = {"critical": 1.0, "coverage": 1.0, "margin": 1.0, "log_window": math.log1p(10.0)}
    lines.append("")
    lines.append(f"e.g. a critical finding, full coverage, margin 1, 10 s window: {predict(weights, typical):.2f}")
    lines.append(f"     the same from one dump: {predict(weights, {**typical, 'single_dump': 1.0}):.2f}")
    lines.append(f"     the same beside a rival class: {predict(weights, {**typical, 'rivals': 1.0}):.2f}")
    lines.append(
        f"fitted on {len(train)} cases (real + sim not held out); training Brier stated {brier(train):.3f}, "
        f"fitted {brier(train, lambda o: predict(weights, o.factors)):.3f}"
    )
    for source in sorted({o.source for o in test}):
        part = [o for o in test if o.source == source and o.factors]
        if not part:
            continue
        fitted = brier(part, lambda o: predict(weights, o.factors))
        lines.append(f"held out, {source}: {len(part)} cases; Brier stated {brier(part):.3f}, fitted {fitted:.3f}")
        lines += ["", f"| held out {source}, fitted confidence | n | mean | accuracy |", "|---|---:|---:|---:|"]
        for b in reliability(part, lambda o: predict(weights, o.factors)):
            if b.n:
                lines.append(f"| {b.low:.1f}-{b.high:.1f} | {b.n} | {b.mean_confidence:.2f} | {b.accuracy:.0%} |")
        lines.append("")
    return "\n".join(lines) + "\n"

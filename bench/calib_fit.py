"""A small, explainable fit of a verdict's confidence factors (bench/calibration.py ``--fit``): a logistic model
P(right) = σ(Σ wᵢ·xᵢ) over the factors ``calibration.factors`` reads from each verdict (the primary finding's severity
or none, core-signal coverage, margin past the critical threshold, rival classes, log window length, a single dump,
sanity findings), fitted by Newton's method with a ridge penalty on the cases that are not held out, and scored on
the held-out ones beside the confidence llmdiag states today (``calibration.report_fit``). A proposal to read, not
applied anywhere."""

from __future__ import annotations

import math
from collections.abc import Sequence

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

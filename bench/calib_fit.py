"""The fit behind a verdict's confidence (bench/calibration.py ``--fit``): a logistic model P(right) = σ(Σ wᵢ·xᵢ) over
the factors the engine reads at verdict time (llmdiag.engine.confidence.factors, named in
llmdiag.schema.confidence.FACTORS), fitted by Newton's method with a ridge penalty and a weight per case.

A factor whose direction physics or logic fixes (FACTORS' sign: more coverage does not lower, a rival does not
raise …) is held to it: where the unconstrained fit gives it the wrong sign, the cases carry no evidence for its
effect, and it is dropped (weight 0) and the rest refitted, until every weight has its sign.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llmdiag.engine.confidence import probability
from llmdiag.schema.confidence import FACTORS

FEATURES = tuple(FACTORS)
RIDGE = 1.0  # keeps the weights finite where a factor separates right from wrong perfectly
ITERATIONS = 25


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a system the size of FEATURES)."""
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


def _newton(xs: list[list[float]], labels: Sequence[bool], case_weights: Sequence[float]) -> list[float]:
    """Ridge-penalised, case-weighted logistic regression on the columns of ``xs``."""
    k = len(xs[0]) if xs else 0
    w = [0.0] * k
    for _ in range(ITERATIONS):
        grad = [RIDGE * wi for wi in w]
        hess = [[RIDGE if i == j else 0.0 for j in range(k)] for i in range(k)]
        for x, y, c in zip(xs, labels, case_weights, strict=True):
            p = _sigmoid(sum(wi * xi for wi, xi in zip(w, x, strict=True)))
            for i, xi in enumerate(x):
                grad[i] += c * (p - float(y)) * xi
                for j, xj in enumerate(x):
                    hess[i][j] += c * p * (1 - p) * xi * xj
        step = _solve(hess, grad)
        w = [wi - si for wi, si in zip(w, step, strict=True)]
        if max(abs(s) for s in step) < 1e-8:
            break
    return w


def fit(
    rows: Sequence[dict[str, float]], labels: Sequence[bool], case_weights: Sequence[float] | None = None
) -> tuple[dict[str, float], list[str]]:
    """The weights by factor name, and the factors dropped because the cases gave them the wrong sign."""
    weights = list(case_weights) if case_weights is not None else [1.0] * len(rows)
    free = list(FEATURES)
    dropped: list[str] = []
    while True:
        xs = [[row.get(name, 0.0) for name in free] for row in rows]
        fitted = dict(zip(free, _newton(xs, labels, weights), strict=True))
        wrong = [n for n in free if FACTORS[n][1] * fitted[n] < 0]
        if not wrong:
            break
        # the worst offender first: dropping one factor can set another right
        worst = max(wrong, key=lambda n: abs(fitted[n]))
        free.remove(worst)
        dropped.append(worst)
    return {name: fitted.get(name, 0.0) for name in FEATURES}, dropped


def predict(weights: dict[str, float], row: dict[str, float]) -> float:
    """The model alone (the engine's formula), before the decided caps."""
    return probability(row, weights)

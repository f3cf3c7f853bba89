"""Block means with the prompts' own effect taken out (common random numbers).

Every block of a run sends the same prompts: repetition r of any block uses seed r (its prompts are
drawn from it). A prompt has a speed of its own that no configuration change removes: with
speculative decoding, how many draft tokens greedy decoding of that prompt accepts (on the simulated
seed one repetition's c=1 throughput moves 2.5% between seeds and 0.2% on the same seed). So a
repetition is modelled as its block's mean + its seed's effect + noise (two-way additive, least
squares) and a comparison of blocks sees only the noise. Blocks whose seeds do not tie them
together (each with prompts of its own, as measured before this) are plain means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Block = list[tuple[int, float]]
"""One block: (seed, value) per repetition."""


@dataclass
class BlockFit:
    means: np.ndarray
    """Each block's mean (log), adjusted for its seeds: only differences between blocks mean anything."""
    cov: np.ndarray
    """The covariance of `means` per unit of `var`."""
    var: float
    """The variance of one repetition beyond its block and its seed (nan without degrees of freedom)."""
    df: int

    def contrast(self, weights: list[float]) -> tuple[float, float]:
        """(estimate, its variance from repetition noise) of sum(weights x means)."""
        w = np.asarray(weights, dtype=float)
        return float(w @ self.means), float(self.var * (w @ self.cov @ w))


def fit_blocks(blocks: list[Block]) -> BlockFit:
    """The two-way fit of non-empty `blocks`; seeds are used only when they tie every block to the others."""
    rows = [(b, s, v) for b, block in enumerate(blocks) for s, v in block]
    n_blocks = len(blocks)
    seeds = sorted({s for _, s, _ in rows})[1:]  # the first seed is the reference level
    x = np.zeros((len(rows), n_blocks + len(seeds)))
    for i, (b, s, _) in enumerate(rows):
        x[i, b] = 1.0
        if s in seeds:
            x[i, n_blocks + seeds.index(s)] = 1.0
    if seeds and np.linalg.matrix_rank(x) < x.shape[1]:
        x = x[:, :n_blocks]  # some block shares no seed with the rest: its seed effect cannot be told apart
    y = np.array([v for _, _, v in rows])
    inv = np.linalg.pinv(x.T @ x)
    beta = inv @ x.T @ y
    df = len(rows) - x.shape[1]
    resid = y - x @ beta
    var = float(resid @ resid / df) if df > 0 else float("nan")
    return BlockFit(means=beta[:n_blocks], cov=inv[:n_blocks, :n_blocks], var=var, df=df)

"""Block means with the prompts' own effect taken out (common random numbers).

Every block of a run sends the same prompts: repetition r of any block uses seed r (its prompts are
drawn from it). A prompt has a speed of its own that no configuration change removes: with
speculative decoding, how many draft tokens greedy decoding of that prompt accepts (on the simulated
seed one repetition's c=1 throughput moves 2.5% between seeds and 0.2% on the same seed). So a
repetition is modelled as its block's mean + its seed's effect + noise (two-way additive, least
squares) and a comparison of blocks sees only the noise. Blocks whose seeds do not tie them
together (each with prompts of its own, as measured before this), or seeds that explain nothing,
leave plain means.
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


SEED_TEST = 0.25
"""The seeds are taken out only where they explain part of the spread (F test, p below this): both
fits are sound, but taking out seeds that do not matter costs degrees of freedom, and a repetition
on a seed no other block measured tells nothing (a deployment without speculative decoding, whose
repetitions move with the machine, not the prompts)."""


def fit_blocks(blocks: list[Block]) -> BlockFit:
    """The fit of non-empty `blocks`: block + seed when the seeds tie every block to the others and
    explain part of the spread (`SEED_TEST`), else each block's plain mean."""
    from scipy import stats as sps

    rows = [(b, s, v) for b, block in enumerate(blocks) for s, v in block]
    n_blocks = len(blocks)
    # one column per seed but the first (the reference level)
    seeds = {s: n_blocks + k for k, s in enumerate(sorted({s for _, s, _ in rows})[1:])}
    x = np.zeros((len(rows), n_blocks + len(seeds)))
    for i, (b, s, _) in enumerate(rows):
        x[i, b] = 1.0
        if s in seeds:
            x[i, seeds[s]] = 1.0
    y = np.array([v for _, _, v in rows])
    plain = _least_squares(x[:, :n_blocks], y, n_blocks)
    if not seeds or np.linalg.matrix_rank(x) < x.shape[1]:
        return plain  # some block shares no seed with the rest: its seed effect cannot be told apart
    both = _least_squares(x, y, n_blocks)
    if both.df < 1:
        return plain
    rss_plain, rss_both = plain.var * plain.df, both.var * both.df
    if rss_both <= 0:
        return both if rss_plain > 0 else plain
    f = (rss_plain - rss_both) / (plain.df - both.df) / both.var
    return both if float(sps.f.sf(f, plain.df - both.df, both.df)) < SEED_TEST else plain


def _least_squares(x: np.ndarray, y: np.ndarray, n_blocks: int) -> BlockFit:
    inv = np.linalg.pinv(x.T @ x)
    beta = inv @ x.T @ y
    df = len(y) - x.shape[1]
    resid = y - x @ beta
    var = float(resid @ resid / df) if df > 0 else float("nan")
    return BlockFit(means=beta[:n_blocks], cov=inv[:n_blocks, :n_blocks], var=var, df=df)

"""Quality: each model's probability of a good answer to this prompt (semantic, difficulty-aware routing).

Prior: the profile's ``quality``. Learned from feedback (``POST /v1/feedback``): per agent (role), one
logistic regression pooled over the models, on the prompt's task terms (the hashed distinct words of
its task, :func:`predictor.sketch.text_features` — the topic words that make a task hard), a few
dense extras (prompt size, workflow stage) and a one-hot of the model that answered:

    logit P(good | role, model, prompt) = (w_role + u_role,model) · terms + v_role · extras + b_role + a_role,model

The text weights ``w`` are shared by the models (a hard task is hard for everyone; the models differ
by an offset), so every rated answer teaches the difficulty of its words, whichever model gave it; the
offsets make a capable model better on every prompt. This is the shape of the simulator's own law
(``logit = 8 · (quality - difficulty)``) and of Chimera's semantic router (a per-model confidence
from one prompt encoder). The per-model deviations ``u`` (``per_model_terms``, the "augmented
features" of domain adaptation: each term once shared and once in the answering model's own block,
one L2 penalty on both) let words mean different things to different models where the feedback says
so — a small checker that rejects wrong work as reliably as a big one but fails more correct work:
the transcript's tail, which holds the checked answer's own verdict, then moves the models apart.
Without them one offset per model averages the two cases (measured 2026-11-30: the 0.5B was
predicted the *best* checker, 0.96 against 0.93, of correct and of wrong answers alike, while it
passed 85 % of the correct ones the others passed 98 % of). Off by default: on the bench's logs they
rank the checks right (Brier on them -8 %) but fit noise in the doers' verdicts (+5 %), and the
routing came out no better (docs/predictor.md). A pooled regression over every role is
the fallback for an agent unseen in training. Each (role, model) estimate is shrunk toward the
profile's prior by ``prior_strength`` pseudo-samples — ``(n · p + k · prior) / (n + k)`` — and a
model without feedback keeps its prior.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
from scipy import sparse
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression

from predictor.boosting import Array, require_fitted

POOLED = "*"  # the group of the regression over every role


def term_matrix(terms: Sequence[Sequence[int]], extras: Array, n_terms: int) -> sparse.csr_matrix:
    """Rows of binary term presence (``n_terms`` columns) followed by the dense ``extras``."""
    extras = np.asarray(extras, dtype=np.float64)
    extras = extras.reshape(len(terms), extras.size // max(len(terms), 1))
    k = extras.shape[1]
    indptr = np.zeros(len(terms) + 1, dtype=np.int64)
    cols: list[int] = []
    for i, t in enumerate(terms):
        row = [c for c in t if 0 <= c < n_terms]
        cols += row + list(range(n_terms, n_terms + k))
        indptr[i + 1] = len(cols)
    data = np.ones(len(cols))
    if k:
        mask = np.asarray(cols) >= n_terms
        data[mask] = extras.reshape(-1)
    return sparse.csr_matrix((data, np.asarray(cols, dtype=np.int64), indptr), shape=(len(terms), n_terms + k))


class QualityModel(BaseEstimator):  # type: ignore[misc]
    def __init__(
        self,
        C: float = 0.5,
        prior_strength: float = 10.0,
        min_samples: int = 20,
        n_terms: int = 4096,
        per_model_terms: bool = False,
    ) -> None:
        self.C = C
        self.prior_strength = prior_strength
        self.min_samples = min_samples
        self.n_terms = n_terms
        self.per_model_terms = per_model_terms

    def fit(self, X: Any, y: Any, models: Sequence[str] = (), groups: Sequence[str] | None = None) -> Self:
        """``X``: (n, n_terms + extras) from :func:`term_matrix`; ``y``: 1 for a good answer, 0 for a bad
        one; ``models``: who answered; ``groups``: the asking agent of each row (default: one group)."""
        X = sparse.csr_matrix(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64) >= 0.5
        names = np.asarray(list(models), dtype=object)
        roles = np.asarray(list(groups) if groups is not None else [POOLED] * len(names), dtype=object)
        if not (len(names) == len(roles) == len(y) == X.shape[0]):
            raise ValueError("X, y, models and groups must have the same length")
        self.__dict__.pop("_per_model_cache", None)
        self.n_features_in_ = X.shape[1]
        self.models_ = tuple(sorted(set(names.tolist())))
        self.model_index_ = {m: i for i, m in enumerate(self.models_)}
        if not len(y):  # no feedback: every model keeps its prior
            self.groups_: tuple[str, ...] = ()
            return self
        m_idx = np.asarray([self.models_.index(m) for m in names], dtype=np.int64)
        onehot = sparse.csr_matrix(
            (np.ones(len(names)), (np.arange(len(names)), m_idx)), shape=(len(names), len(self.models_))
        )
        blocks = [X, onehot]
        if self.per_model_terms:  # each row's terms again, in its model's own block of n_terms columns
            terms = X[:, : self.n_terms].tocoo()
            blocks.append(sparse.csr_matrix(
                (terms.data, (terms.row, m_idx[terms.row] * self.n_terms + terms.col)),
                shape=(len(names), len(self.models_) * self.n_terms)))  # fmt: skip
        Xm = sparse.hstack(blocks, format="csr")
        n_fixed = X.shape[1] + len(self.models_)
        kept: list[str] = []
        coef, mcoef, tcoef, intercept, counts = [], [], [], [], []
        for g in [*sorted(set(roles.tolist()) - {POOLED}), POOLED]:
            rows = np.ones(len(y), dtype=bool) if g == POOLED else roles == g
            n = int(rows.sum())
            if n < self.min_samples:
                continue
            yg = y[rows]
            if yg.all() or not yg.any():  # one class: a constant rate, smoothed away from 0 and 1
                rate = (yg.sum() + 0.5) / (n + 1.0)
                w = np.zeros(Xm.shape[1])
                b = float(np.log(rate / (1.0 - rate)))
            else:
                lr = LogisticRegression(C=self.C, max_iter=500).fit(Xm[rows], yg)
                w, b = lr.coef_[0].astype(np.float64), float(lr.intercept_[0])
            kept.append(g)
            coef.append(w[: X.shape[1]])
            mcoef.append(w[X.shape[1] : n_fixed])
            tcoef.append(w[n_fixed:])
            intercept.append(b)
            counts.append(np.bincount(m_idx[rows], minlength=len(self.models_)).astype(np.float64))
        self.groups_ = tuple(kept)  # the last is POOLED whenever any group was fitted
        self.coef_ = np.asarray(coef).reshape(len(kept), X.shape[1])
        self.model_coef_ = np.asarray(mcoef).reshape(len(kept), len(self.models_))
        # (groups, models, n_terms) per-model term deviations, or None without per_model_terms
        self.model_term_coef_ = (
            np.asarray(tcoef).reshape(len(kept), len(self.models_), self.n_terms) if self.per_model_terms else None
        )
        self.intercept_ = np.asarray(intercept)
        self.counts_ = np.asarray(counts).reshape(len(kept), len(self.models_))
        return self

    def predict_proba(self, terms: Array, extras: Array, group: str, models: Sequence[str], priors: Array, *,
                      in_range: bool = False) -> Array:  # fmt: skip
        """P(good) of each of ``models`` answering ``group``'s prompt with task ``terms`` (ids; ``in_range``:
        the caller kept only ids in ``[0, n_terms)``) and ``extras``; ``priors`` where a model had no
        feedback."""
        require_fitted(self, "groups_")
        out = np.array(priors, dtype=np.float64)
        if not self.groups_:
            return out
        g = self.groups_.index(group) if group in self.groups_ else len(self.groups_) - 1
        w = self.coef_[g]
        t = np.asarray(terms, dtype=np.int64)
        if not in_range:
            t = t[(t >= 0) & (t < self.n_terms)]
        z0 = float(w[t].sum() + w[self.n_terms :] @ extras) + self.intercept_[g]
        known, offset, n, n_k, j = self._per_model(g, tuple(models))
        dev = self.model_term_coef_
        if dev is not None and len(t):  # the answering model's own reading of the words
            offset = offset + dev[g][j[:, None], t].sum(axis=1)
        p = 1.0 / (1.0 + np.exp(-(z0 + offset)))
        out[known] = (n * p + self.prior_strength * out[known]) / n_k
        return out

    def _per_model(self, g: int, models: tuple[str, ...]) -> tuple[Any, Array, Array, Array, Any]:
        """(which of ``models`` had feedback, their offsets, feedback counts, counts + prior strength, their
        indices among ``models_``) for group ``g``: the same for every decision over the same candidates, so
        cached (``models`` is the candidates' models in order; a refit makes a new estimator)."""
        cache: dict[tuple[int, tuple[str, ...]], tuple[Any, Array, Array, Array, Any]]
        cache = self.__dict__.setdefault("_per_model_cache", {})
        hit = cache.get((g, models))
        if hit is None:
            idx = [self.model_index_.get(m, -1) for m in models]
            j = np.asarray(idx, dtype=np.int64)
            known: Any = slice(None)
            if min(idx) < 0:  # some model had no feedback: it keeps its prior
                known = j >= 0
                j = j[known]
            n = self.counts_[g, j]
            hit = cache[(g, models)] = (known, self.model_coef_[g, j], n, n + self.prior_strength, j)
            if len(cache) > 1024:  # candidate sets are few; bound it anyway
                cache.clear()
        return hit

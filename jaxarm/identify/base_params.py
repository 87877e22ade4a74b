"""Base parameters: the identifiable combinations of the standard parameters (Gautier & Khalil
1990; Gautier 1991), found numerically from the regressor's column space."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..dynamics.kinematics import _body_model_numpy
from ..model import checks
from ..model.arm import Arm
from .linear_model import LINK_PARAMETERS, IdentificationError, parameter_names


@dataclasses.dataclass(frozen=True, eq=False)
class BaseParameters:
    """The identifiable combinations beta = K pi of the standard parameters.

    ``independent`` (r,) column indices kept, in base order; ``dependent`` the others;
    ``K`` (r, p) with ``K[:, independent] = 1`` and ``Y = Y[:, independent] @ K`` for every
    regressor of the arm; ``descriptions`` (r,) e.g. "Izz1 + Iyy2 + 0.0625 m3";
    ``unidentifiable``: standard parameters that enter no base parameter (zero regressor column).
    ``condition_number`` of the base columns of Y; ``condition_number_scaled`` after scaling each
    column to unit norm. ``rtol``: the rank tolerance used (see :func:`base_parameters`).
    """

    rank: int
    rtol: float
    independent: tuple
    dependent: tuple
    K: np.ndarray
    standard_names: tuple
    descriptions: tuple
    unidentifiable: tuple
    condition_number: float
    condition_number_scaled: float
    method: str

    @property
    def names(self) -> tuple:
        """The standard parameter each base parameter is anchored on (its independent column)."""
        return tuple(self.standard_names[k] for k in self.independent)

    def project(self, pi) -> np.ndarray:
        """beta = K pi (r,) for a standard vector pi (p,)."""
        return self.K @ np.asarray(pi, dtype=float)

    def table(self) -> list[dict]:
        """One dict per base parameter: index, name, description."""
        return [{"index": k, "name": name, "combination": d} for k, (name, d) in enumerate(zip(self.names, self.descriptions))]


def grouping_order(arm: Arm, drives: bool = True) -> list[int]:
    """Column order for Gautier's sequential selection that gives the classic regrouping
    (Khalil & Bennis 1995) in any convention: all parameters in link order, except, for each
    revolute joint about the a axis of its link frame (z in modified DH, usually +-y in standard
    DH), the mass, the first moment along a and the second diagonal inertia across a (Iyy for
    a = z), which come after all others; for a prismatic joint its link's six inertia entries.
    Those are the parameters that merge into the same and the previous links' (e.g.
    "Izz1 + Iyy2 + 0.0625 m3") -- or vanish -- instead of the other way round.
    A joint axis not along a link-frame axis is treated like z."""
    checks.check_arm(arm, "grouping_order")
    names = parameter_names(arm, drives)
    axes = _body_model_numpy(arm).link_rotation[:, 2, :]  # joint axis (body z) in link frame i
    last = set()
    for i, rev in enumerate(arm.is_revolute):
        if not rev:
            last |= {f"{p}{i + 1}" for p in LINK_PARAMETERS[4:]}
            continue
        a = int(np.argmax(np.abs(axes[i]))) if np.max(np.abs(axes[i])) > 1 - 1e-9 else 2
        across = [c for c in range(3) if c != a][1]
        last |= {f"m{i + 1}", f"m{'xyz'[a]}{i + 1}", f"I{'xyz'[across] * 2}{i + 1}"}
    first = [k for k, name in enumerate(names) if name not in last]
    return first + [k for k, name in enumerate(names) if name in last]


def _format_coefficient(c: float, name: str) -> str:
    if abs(c - 1.0) < 1e-9:
        return f"+ {name}"
    if abs(c + 1.0) < 1e-9:
        return f"- {name}"
    return f"{'-' if c < 0 else '+'} {abs(c):.6g} {name}"


def _as_rows(Y, func: str, name: str = "Y") -> np.ndarray:
    Y = np.asarray(Y, dtype=float)
    if Y.ndim == 3:
        Y = Y.reshape(-1, Y.shape[-1])
    if Y.ndim != 2 or Y.shape[0] == 0 or Y.shape[1] == 0:
        raise ValueError(f"{func}: {name}: expected shape (N * n, p) or (N, n, p), got {np.shape(Y)}")
    if not np.all(np.isfinite(Y)):
        raise ValueError(f"{func}: {name}: expected finite values")
    return Y


def base_parameters(Y, *, rtol: float = 1e-8, names=None, order=None) -> BaseParameters:
    """The base parameters of a regressor Y ((N * n, p) stacked or (N, n, p)).

    Each column is scaled to unit norm; columns with norm <= rtol * (largest norm) are zero
    (unidentifiable). The rest are reduced to their triangular factor R (Y_scaled = Q R, Q
    orthogonal, same column relations) and selected

    * ``order="pivoted"``: by QR with column pivoting (``scipy.linalg.qr(pivoting=True)``),
      rank = #{|R_kk| > rtol |R_00|};
    * otherwise (a sequence of column indices, e.g. :func:`grouping_order`, or by default the
      natural order): sequentially in that order, keeping a
      column when its distance to the span of the kept ones exceeds ``rtol`` (Gautier 1990's QR
      in a chosen order, done with re-orthogonalised Gram-Schmidt so a rejected column cannot
      perturb later decisions).

    The dependent columns are expressed in the independent ones by least squares,
    ``Y_dep = Y_ind K_dep``, coefficients below 1e-9 (relative to the column norms) set to 0, so
    beta = pi_ind + K_dep pi_dep (Gautier & Khalil 1990). The default ``rtol`` = 1e-8 separates
    structural dependencies (distance ~1e-13 on random samples) from real but poorly excited
    directions; run it on random states for the arm's structure, on a log's regressor to see
    what that log identifies.
    """
    from scipy import linalg

    Yr = _as_rows(Y, "base_parameters")
    p = Yr.shape[1]
    if not (np.isfinite(rtol) and 0 < rtol < 1):
        raise ValueError(f"base_parameters: rtol: expected 0 < rtol < 1, got {rtol!r}")
    names = tuple(str(x) for x in names) if names is not None else tuple(f"p{k}" for k in range(p))
    if len(names) != p:
        raise ValueError(f"base_parameters: names: expected {p} names (one per column of Y), got {len(names)}")
    norms = np.linalg.norm(Yr, axis=0)
    nonzero = norms > rtol * norms.max() if norms.max() > 0 else np.zeros(p, dtype=bool)
    if not nonzero.any():
        raise IdentificationError("base_parameters: Y is zero: no parameter is identifiable")
    scale = np.where(nonzero, norms, 1.0)
    R0 = linalg.qr(Yr / scale, mode="r", check_finite=False)[0][:p]  # (<= p, p): same Gram matrix

    candidates = [k for k in range(p) if nonzero[k]]
    if isinstance(order, str) and order == "pivoted":
        method = "pivoted QR"
        sub = R0[:, candidates]
        _, Rp, piv = linalg.qr(sub, mode="economic", pivoting=True, check_finite=False)
        diag = np.abs(np.diag(Rp))
        rank = int(np.sum(diag > rtol * diag[0]))
        independent = [candidates[k] for k in piv[:rank]]
    else:
        if order is None:
            seq, method = list(range(p)), "sequential (column order)"
        else:
            seq = [int(k) for k in order]
            if sorted(seq) != list(range(p)):
                raise ValueError(f"base_parameters: order: expected a permutation of 0..{p - 1} or 'pivoted'")
            method = "sequential (given order)"
        basis = np.zeros((R0.shape[0], 0))
        independent = []
        for k in seq:
            if not nonzero[k]:
                continue
            v = R0[:, k].copy()
            for _ in range(2):  # Gram-Schmidt twice is enough (Giraud et al. 2005)
                v -= basis @ (basis.T @ v)
            dist = np.linalg.norm(v)
            if dist > rtol:
                independent.append(k)
                basis = np.column_stack([basis, v / dist])
    rank = len(independent)
    dependent = [k for k in range(p) if k not in independent]
    R_ind = R0[:, independent]
    Ks = np.zeros((rank, p))
    Ks[:, independent] = np.eye(rank)
    dep_nz = [k for k in dependent if nonzero[k]]
    if dep_nz:
        coef = linalg.lstsq(R_ind, R0[:, dep_nz], check_finite=False)[0]
        coef[np.abs(coef) < 1e-9] = 0.0
        Ks[:, dep_nz] = coef
    K = Ks * scale[None, :] / scale[independent][:, None]  # undo the column scaling
    descriptions = []
    for row, k in enumerate(independent):
        terms = [names[k]] + [_format_coefficient(K[row, j], names[j]) for j in dependent if K[row, j] != 0.0]
        descriptions.append(" ".join(terms))
    unidentifiable = tuple(names[j] for j in dependent if not np.any(K[:, j]))
    s_scaled = np.linalg.svd(R_ind, compute_uv=False)
    s = np.linalg.svd(R_ind * scale[independent][None, :], compute_uv=False)
    return BaseParameters(
        rank=rank,
        rtol=float(rtol),
        independent=tuple(independent),
        dependent=tuple(dependent),
        K=K,
        standard_names=names,
        descriptions=tuple(descriptions),
        unidentifiable=unidentifiable,
        condition_number=float(s[0] / s[-1]),
        condition_number_scaled=float(s_scaled[0] / s_scaled[-1]),
        method=method,
    )

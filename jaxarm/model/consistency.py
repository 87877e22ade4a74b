"""Physical consistency of one link's inertial parameters (mass, COM, inertia about the COM).

A set (m, c, I_c) is *physically consistent* when some non-negative mass distribution has exactly
these moments. Wensing, Kim & Slotine (IEEE RA-L 2017, "Linear Matrix Inequalities for
Physically-Consistent Inertial Parameter Identification") show this holds iff the 4x4
pseudo-inertia

    J = [[Sigma, h], [h^T, m]],   Sigma = integral r r^T dm = 0.5 tr(I_o) 1 - I_o,   h = m c,

is positive semidefinite, where I_o is the inertia about the link origin. For m > 0, J >= 0 is
the same as Sigma_c = 0.5 tr(I_c) 1 - I_c >= 0 (Schur complement), i.e. the principal moments obey
the triangle inequalities I1 + I2 >= I3; those in turn imply I_c >= 0. :func:`check_link` tests
each of these separately so a report says which one failed and by how much; it decides J >= 0
through that factorisation about the COM, so the verdict is as precise as I_c itself.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["pseudo_inertia", "LinkConsistency", "check_link", "DriveConsistency", "check_drive", "consistency_report"]


def pseudo_inertia(mass, com, inertia):
    """The (4, 4) pseudo-inertia J = [[Sigma, h], [h^T, m]] about the link origin.

    mass: scalar; com: (3,) in the link frame; inertia: (3, 3) about the COM, link axes.
    I_o = I_c + m (c.c 1 - c c^T) (Ch.10 eq. 10.13), Sigma = 0.5 tr(I_o) 1 - I_o, h = m c
    (Wensing, Kim & Slotine 2017). Works on NumPy and JAX values (jit/grad-safe for the latter).
    """
    xp = jnp if any(isinstance(x, jax.Array) for x in (mass, com, inertia)) else np
    mass, com, inertia = xp.asarray(mass), xp.asarray(com), xp.asarray(inertia)
    eye = xp.eye(3, dtype=inertia.dtype)
    inertia_o = inertia + mass * ((com * com).sum() * eye - com[:, None] * com[None, :])  # Ch.10 eq. 10.13
    sigma = 0.5 * xp.trace(inertia_o) * eye - inertia_o
    h = mass * com
    top = xp.concatenate([sigma, h[:, None]], axis=1)
    bottom = xp.concatenate([h, mass[None]])[None, :]
    return xp.concatenate([top, bottom], axis=0)


@dataclasses.dataclass(frozen=True)
class LinkConsistency:
    """Result of :func:`check_link`: one flag per condition and one sentence per failure."""

    mass_positive: bool
    inertia_symmetric: bool
    inertia_psd: bool
    triangle_inequalities: bool
    pseudo_inertia_psd: bool
    problems: tuple[str, ...] = ()
    massless: bool = False
    """Zero mass and zero inertia: an idealised frame-only link, not an inconsistency (``ok`` is
    still False because the mass is not positive; callers that excuse it check this flag)."""

    @property
    def ok(self) -> bool:
        """True when every condition holds."""
        return (
            self.mass_positive
            and self.inertia_symmetric
            and self.inertia_psd
            and self.triangle_inequalities
            and self.pseudo_inertia_psd
        )


def _fmt(values) -> str:
    return "(" + ", ".join(f"{v:.6g}" for v in values) + ")"


def check_link(mass, com, inertia, *, tol: float = 1e-9) -> LinkConsistency:
    """Check one link's inertial parameters for physical consistency.

    mass: scalar (kg); com: (3,) (m); inertia: (3, 3) about the COM (kg m^2). Concrete values only
    (NumPy or JAX arrays; converted to float64). Tolerances are relative: inertia conditions use
    ``tol * max|I|`` (the pseudo-inertia test too, through its factorisation about the COM), so
    float64 round-off never trips them. A zero-mass, zero-inertia link fails only ``mass_positive``.
    """
    m_arr = np.asarray(mass, dtype=np.float64)
    c = np.asarray(com, dtype=np.float64)
    inertia = np.asarray(inertia, dtype=np.float64)
    if m_arr.shape != () or c.shape != (3,) or inertia.shape != (3, 3):
        raise ValueError(
            "check_link: expected mass: scalar, com: (3,), inertia: (3, 3); "
            f"got shapes {m_arr.shape}, {c.shape}, {inertia.shape}"
        )
    if not (np.isfinite(m_arr) and np.isfinite(c).all() and np.isfinite(inertia).all()):
        raise ValueError("check_link: mass, com and inertia must be finite")
    m = float(m_arr)
    problems = []

    mass_positive = m > 0
    if not mass_positive:
        problems.append(f"mass {m:.6g} is not positive")

    scale = np.abs(inertia).max()
    atol = tol * scale  # zero for a zero inertia, which is then exactly symmetric, PSD, etc.

    asym = np.abs(inertia - inertia.T)
    inertia_symmetric = bool(asym.max() <= atol)
    if not inertia_symmetric:
        i, j = np.unravel_index(np.argmax(asym), asym.shape)
        problems.append(
            f"inertia is not symmetric: I[{i},{j}] = {inertia[i, j]:.6g} but I[{j},{i}] = {inertia[j, i]:.6g}"
        )

    sym = 0.5 * (inertia + inertia.T)
    moments = np.linalg.eigvalsh(sym)  # principal moments, ascending (Ch.10 eq. 10.19)
    inertia_psd = bool(moments[0] >= -atol)
    if not inertia_psd:
        problems.append(f"inertia is not positive semidefinite: principal moments {_fmt(moments)}")

    triangle_inequalities = True
    for i, j, k in ((0, 1, 2), (0, 2, 1), (1, 2, 0)):
        if moments[i] + moments[j] < moments[k] - atol:
            triangle_inequalities = False
            problems.append(
                f"principal moments {_fmt(moments)} violate the triangle inequality "
                f"{moments[i]:.6g} + {moments[j]:.6g} >= {moments[k]:.6g}"
            )
            break  # the sorted moments make one violated inequality the telling one

    # J = A diag(Sigma_c, m) A^T with A = [[1, c], [0, 1]] (shift of origin to the COM), so by
    # Sylvester's law of inertia J >= 0 iff m >= 0 and Sigma_c = 0.5 tr(I_c) 1 - I_c >= 0. Testing
    # the factors instead of eig(J) keeps the tolerance relative to I_c: eig(J) would carry round-off
    # of order eps m |c|^2, which swamps a small part's inertia when its COM is far from the origin.
    sigma_c = np.linalg.eigvalsh(0.5 * np.trace(sym) * np.eye(3) - sym)  # = (I_j + I_k - I_i) / 2
    pseudo_inertia_psd = bool(m >= 0 and 2 * sigma_c[0] >= -atol)  # same margin as the triangle test
    if m < 0:
        problems.append(
            "pseudo-inertia [[Sigma, h], [h^T, m]] is not positive semidefinite: "
            f"its mass entry m = {m:.6g} is negative"
        )
    elif not pseudo_inertia_psd:
        problems.append(
            "pseudo-inertia [[Sigma, h], [h^T, m]] is not positive semidefinite: the second moments of mass "
            f"about the COM, eig(0.5 tr(I) 1 - I) = {_fmt(sigma_c)}, must not be negative; "
            "no mass distribution has this inertia"
        )

    return LinkConsistency(
        mass_positive=mass_positive,
        inertia_symmetric=inertia_symmetric,
        inertia_psd=inertia_psd,
        triangle_inequalities=triangle_inequalities,
        pseudo_inertia_psd=pseudo_inertia_psd,
        problems=tuple(problems),
        massless=bool(m == 0.0 and not np.any(inertia)),
    )


@dataclasses.dataclass(frozen=True)
class DriveConsistency:
    """Result of :func:`check_drive`: friction that only dissipates, inertia that is not negative."""

    problems: tuple[str, ...] = ()
    massless: bool = False  # (drives are never "massless"; the field lets reports treat bodies and drives alike)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_drive(arm, j: int, *, tol: float = 1e-9) -> DriveConsistency:
    """Joint ``j``'s drive (0-based): rotor inertia >= 0, viscous friction >= 0, Coulomb levels in
    the sense of motion (Tc+ >= 0 for positive velocity, Tc- <= 0 for negative), static friction,
    Stribeck velocity and the tanh Coulomb scale >= 0, and a sigmoid (phi1, phi2, phi3) that
    rises with velocity (phi1 phi2 >= 0). Values within ``tol`` of the bound pass."""
    d = arm.drives
    value = lambda x: float(np.asarray(x)[j])  # noqa: E731
    tc = np.asarray(d.coulomb_friction)[j]
    phi = np.asarray(d.sigmoid_friction)[j]
    checks = [
        (value(d.rotor_inertia) >= -tol, f"rotor inertia {value(d.rotor_inertia):.6g} < 0"),
        (value(d.viscous_friction) >= -tol, f"viscous friction {value(d.viscous_friction):.6g} < 0: it would feed energy in"),
        (tc[0] >= -tol, f"Coulomb level for positive velocity Tc+ = {tc[0]:.6g} < 0: it would push along the motion"),
        (tc[1] <= tol, f"Coulomb level for negative velocity Tc- = {tc[1]:.6g} > 0: it would push along the motion"),
        (value(d.static_friction) >= -tol, f"static friction {value(d.static_friction):.6g} < 0"),
        (value(d.stribeck_velocity) >= -tol, f"Stribeck velocity {value(d.stribeck_velocity):.6g} < 0"),
        (value(d.coulomb_velocity_scale) >= -tol, f"Coulomb velocity scale {value(d.coulomb_velocity_scale):.6g} < 0"),
        (phi[0] * phi[1] >= -tol, f"sigmoid friction falls with velocity (phi1 phi2 = {phi[0] * phi[1]:.6g} < 0)"),
    ]
    return DriveConsistency(problems=tuple(msg for ok, msg in checks if not ok))


def consistency_report(arm, *, tol: float = 1e-9, drives: bool = False) -> dict:
    """Physical consistency of every body of an arm: ``{"joint 1": LinkConsistency, ...}`` in joint
    order, plus ``"payload"`` when the arm holds one (non-zero mass or inertia), and with
    ``drives=True`` ``"drive 1"``, ... (:func:`check_drive`). An entry that needs attention is one
    with ``not (report.ok or report.massless)``."""
    bodies = {f"joint {i + 1}": (arm.links.mass[i], arm.links.com[i], arm.links.inertia[i]) for i in range(arm.n)}
    payload = arm.payload
    if float(payload.mass) > 0 or np.any(np.asarray(payload.inertia)):
        bodies["payload"] = (payload.mass, payload.com, payload.inertia)
    report = {
        label: check_link(np.asarray(m), np.asarray(c), np.asarray(inertia), tol=tol)
        for label, (m, c, inertia) in bodies.items()
    }
    if drives:
        report.update({f"drive {j + 1}": check_drive(arm, j, tol=tol) for j in range(arm.n)})
    return report

"""Payload identification: the mass, centre of mass and inertia of a load held by the tool, from a
short log with the load attached (alone, or as the difference with a log without it).

The payload's torques are linear in its ten inertial parameters pi_p = (m, m c, I_o) in the tool
frame (first moment and inertia about the tool origin; Atkeson,
An & Hollerbach 1986). Held rigidly by the last link, its parameters in the last link's frame are
a linear function of pi_p (the rigid-body transformation below), so its torques are the last
link's columns of the arm's regressor (:func:`jaxarm.regressor`) times that 10 x 10 map:

    tau - ID(arm without payload) = Y_n(q, qd, qdd) T(tool) pi_p

solved by least squares with standard deviations (:func:`jaxarm.least_squares`). With a second log
of the same motion without the payload, the difference of the two logs' torques is fitted
instead, which cancels whatever the arm's model gets wrong (friction, link errors) as long as it is
the same on both runs. An estimate outside the physically consistent set is moved onto it
(:func:`jaxarm.parameters_to_log_cholesky` with ``repair``) and the result says so.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from ..model.arm import Arm, Payload
from ..model.consistency import check_link
from .fit import _check_log, least_squares, predict_torques
from .linear_model import IdentificationError, regressor

PAYLOAD_PARAMETERS = ("m", "mx", "my", "mz", "Ixx", "Ixy", "Ixz", "Iyy", "Iyz", "Izz")  # tool frame, about the tool origin


def payload_to_link(tool, pi_p) -> np.ndarray:
    """The standard parameters (10,) in the last link's frame of a payload with parameters ``pi_p``
    (10,) in the tool frame (``tool`` (4, 4): the tool frame in the last link's frame). Linear in
    pi_p: m' = m, h' = R h + m p, I' = R I Rᵀ + m (|p|^2 1 - p pᵀ) + 2 (p . R h) 1 - p (R h)ᵀ - (R h) pᵀ
    (the inertia of the same points about the link origin)."""
    tool = np.asarray(tool, dtype=float)
    R, p = tool[:3, :3], tool[:3, 3]
    m, h = pi_p[0], np.asarray(pi_p[1:4])
    xx, xy, xz, yy, yz, zz = pi_p[4:]
    inertia = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    Rh = R @ h
    inertia = R @ inertia @ R.T + m * ((p @ p) * np.eye(3) - np.outer(p, p)) + 2 * (p @ Rh) * np.eye(3) - np.outer(p, Rh) - np.outer(Rh, p)
    return np.concatenate([[m], Rh + m * p, inertia[[0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]])


def _payload_matrix(tool) -> np.ndarray:
    """T (10, 10) with payload_to_link(tool, pi_p) = T pi_p."""
    return np.stack([payload_to_link(tool, e) for e in np.eye(10)], axis=1)


@dataclasses.dataclass(frozen=True)
class PayloadIdentification:
    """Result of :func:`identify_payload`: ``mass``, ``com`` (3,) in the tool frame, ``inertia``
    (3, 3) about the COM (tool-frame axes) -- what :meth:`jaxarm.Arm.with_payload` takes, also as
    ``payload``; ``parameters`` (10,) and ``std`` (10,) in :data:`PAYLOAD_PARAMETERS` order;
    ``com_std`` (3,) (first order); ``consistent``: the least-squares estimate was physically
    consistent (else it was moved onto the consistent set: ``repaired``); ``rmse`` / ``rmse_without``
    (n,) the torque error with the payload model and without any payload; ``method``."""

    mass: float
    com: np.ndarray
    inertia: np.ndarray
    parameters: np.ndarray
    std: np.ndarray
    com_std: np.ndarray
    consistent: bool
    repaired: bool
    rmse: np.ndarray
    rmse_without: np.ndarray
    method: str
    condition_number: float

    @property
    def payload(self) -> Payload:
        return Payload(mass=np.asarray(self.mass), com=self.com, inertia=self.inertia)

    def report(self) -> dict:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in dataclasses.asdict(self).items()}


def identify_payload(arm: Arm, log, *, baseline=None) -> PayloadIdentification:
    """Identify the payload the tool of ``arm`` holds in ``log`` (preprocessed: q, dq, ddq, tau).

    ``arm``: the identified (or nominal) arm; a payload it already has is ignored. ``baseline``:
    optional preprocessed log of the same motion without the payload, sampled at the same times
    (same length): the payload is then fitted to the difference of the two logs' torques.
    """
    func = "identify_payload"
    _check_log(arm, log, func)
    empty = arm.replace(payload=Payload(mass=np.asarray(0.0), com=np.zeros(3), inertia=np.zeros((3, 3))))
    n = arm.n
    Y = np.asarray(regressor(empty, log.q, log.dq, log.ddq, drives=False))[:, :, 10 * (n - 1):10 * n]
    Yp = np.einsum("knp,pr->knr", Y, _payload_matrix(np.asarray(arm.tool)))
    if baseline is not None:
        _check_log(arm, baseline, func, ("tau",))
        if len(baseline) != len(log) or not np.allclose(baseline.t - baseline.t[0], log.t - log.t[0], atol=1e-9):
            raise IdentificationError(f"{func}: baseline: expected the same motion sampled at the same times as the log "
                                      f"({len(log)} samples), got {len(baseline)}")
        target, method = log.tau - baseline.tau, "difference of the logs with and without the payload"
    else:
        target, method = log.tau - predict_torques(empty, log.q, log.dq, log.ddq), "torques minus the arm's model"
    try:
        fit = least_squares(Yp, target, names=PAYLOAD_PARAMETERS)
    except IdentificationError as exc:
        raise IdentificationError(f"{func}: the log does not excite every payload parameter ({exc}); move the last joints "
                                  "through larger rotations and accelerations") from None
    pi = fit.estimate
    m, h = pi[0], pi[1:4]
    if not m > max(3.0 * fit.std[0], 1e-6):
        raise IdentificationError(f"{func}: the estimated payload mass is {m:.4g} +- {fit.std[0]:.2g} kg, not distinguishable "
                                  "from zero: the log shows no payload")
    com = h / m
    xx, xy, xz, yy, yz, zz = pi[4:]
    inertia_o = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    inertia = inertia_o - m * ((com @ com) * np.eye(3) - np.outer(com, com))
    consistent = check_link(m, com, inertia).ok
    repaired = False
    if not consistent:
        from .consistent import PriorNudgedWarning, log_cholesky_to_parameters, parameters_to_log_cholesky

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PriorNudgedWarning)
            pi = np.asarray(log_cholesky_to_parameters(parameters_to_log_cholesky(pi[None], repair=True)))[0]
        m, com = pi[0], pi[1:4] / pi[0]
        xx, xy, xz, yy, yz, zz = pi[4:]
        inertia = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]]) - m * ((com @ com) * np.eye(3) - np.outer(com, com))
        repaired = True
    # first-order std of c = h / m
    cov = fit.covariance
    J = np.zeros((3, 10))
    J[:, 0] = -h / m**2
    J[:, 1:4] = np.eye(3) / m
    com_std = np.sqrt(np.diag(J @ cov @ J.T))
    rmse = np.sqrt(np.mean((target - np.einsum("knr,r->kn", Yp, pi)) ** 2, axis=0))
    return PayloadIdentification(
        mass=float(m), com=np.asarray(com, dtype=float), inertia=np.asarray(inertia, dtype=float), parameters=np.asarray(pi),
        std=fit.std, com_std=com_std, consistent=bool(consistent), repaired=repaired, rmse=rmse,
        rmse_without=np.sqrt(np.mean(target**2, axis=0)), method=method, condition_number=fit.condition_number,
    )

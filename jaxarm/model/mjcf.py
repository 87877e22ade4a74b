"""MuJoCo (MJCF) export.

:func:`to_mjcf` writes an arm as nested MuJoCo bodies, one per joint, in jaxarm's canonical body
frames (:func:`jaxarm.arm.body_model`: z on the joint axis), so each joint is a ``hinge`` or
``slide`` about ``0 0 1`` at the body origin. What each field becomes:

* link inertials -> ``<inertial pos mass fullinertia>`` (COM and the full inertia tensor about
  it in the body frame; ``inertiafromgeom="false"``, no bounds or balancing, so MuJoCo only
  diagonalizes it, to rounding);
* reflected rotor inertia ``G^2 Jm`` -> joint ``armature``; viscous ``B G^2`` -> ``damping``;
  Coulomb ``|G| Tc`` -> ``frictionloss`` (symmetric in MuJoCo: asymmetric friction is written as
  the mean magnitude, with a warning and a comment);
* position limits -> joint ``range`` (when both ends are finite); torque limits ->
  ``actuatorfrcrange`` and a ``<motor>`` per joint with that ``ctrlrange`` (gear 1, so the
  control is the joint torque);
* ``base`` -> a static body holding the chain; ``tool`` -> a site named ``tool`` in the last body;
* gravity, the RK4 integrator and the timestep -> ``<option>``; contacts are disabled (there are
  no geoms). Every joint states ``armature``, ``damping`` and ``frictionloss`` explicitly, so no
  default class can add any.

MuJoCo's dynamics then match jaxarm's: ``M`` from ``mj_fullM`` equals :func:`jaxarm.mass_matrix`
(armature included) and ``qfrc_inverse`` from ``mj_inverse`` equals
:func:`jaxarm.inverse_dynamics` with the viscous term (MuJoCo's passive force is ``-damping qd``);
MuJoCo's frictionloss is a soft constraint, not exactly ``Tc sign(qd)``.

MuJoCo rejects a moving body with zero mass, or whose principal inertias are not positive or
break the triangle inequality A + B >= C (e.g. a massless DH link that only carries a rotor
inertia). :func:`to_mjcf` raises a ``ValueError`` naming the joint for those rather than alter
the model; velocity limits and the electrical motor model have no MuJoCo field and are noted
in a comment.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np

from .arm import Arm
from .urdf import _atomic_write, _canonical, _num, _nums, _symmetric_coulomb

__all__ = ["to_mjcf", "save_mjcf"]

MJ_MINVAL = 1e-15  # MuJoCo's mjMINVAL: smallest mass / inertia of a moving body


def _quaternion(R) -> np.ndarray:
    """Unit quaternion (w, x, y, z) of a rotation matrix (Shepperd's method: divide by the
    largest of the four candidates, so it is accurate for every rotation)."""
    R = np.asarray(R, dtype=float)
    t = np.trace(R)
    k = int(np.argmax([t, R[0, 0], R[1, 1], R[2, 2]]))
    if k == 0:
        s = 2.0 * np.sqrt(1.0 + t)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    elif k == 1:
        s = 2.0 * np.sqrt(1.0 + R[0, 0] - R[1, 1] - R[2, 2])
        q = [(R[2, 1] - R[1, 2]) / s, 0.25 * s, (R[0, 1] + R[1, 0]) / s, (R[0, 2] + R[2, 0]) / s]
    elif k == 2:
        s = 2.0 * np.sqrt(1.0 + R[1, 1] - R[0, 0] - R[2, 2])
        q = [(R[0, 2] - R[2, 0]) / s, (R[0, 1] + R[1, 0]) / s, 0.25 * s, (R[1, 2] + R[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + R[2, 2] - R[0, 0] - R[1, 1])
        q = [(R[1, 0] - R[0, 1]) / s, (R[0, 2] + R[2, 0]) / s, (R[1, 2] + R[2, 1]) / s, 0.25 * s]
    q = np.array(q)
    return q / np.linalg.norm(q)


def _pose(elem, R, p):
    elem.set("pos", _nums(p))
    elem.set("quat", _nums(_quaternion(R)))


def _check_body(i, mass, inertia):
    """Raise the error MuJoCo would, but naming the jaxarm joint and the numbers."""
    principal = np.linalg.eigvalsh(inertia)
    a, b, c = principal
    if mass < MJ_MINVAL or a <= 0 or a + b < c:
        raise ValueError(
            f"to_mjcf: joint {i + 1}: MuJoCo needs every moving body to have positive mass and principal "
            f"inertias that are positive with A + B >= C; got mass {float(mass)!r}, principal inertias {principal.tolist()}"
        )


def to_mjcf(arm: Arm, *, timestep: float = 0.001) -> str:
    """The arm as MuJoCo MJCF text (see the module docstring). ``timestep`` (s) for ``<option>``."""
    if not (np.ndim(timestep) == 0 and np.isreal(timestep) and np.isfinite(timestep) and timestep > 0):
        raise ValueError(f"to_mjcf: timestep: expected a positive number of seconds, got {timestep!r}")
    timestep = float(timestep)
    c = _canonical(arm)
    n = arm.n
    for i in range(n):
        _check_body(i, c.mass[i], c.inertia[i])
    coulomb, asym = _symmetric_coulomb(c, arm, "to_mjcf")

    root = ET.Element("mujoco", model=arm.name)
    root.append(ET.Comment(f" Written by jaxarm from the {arm.convention!r} arm {arm.name!r}; body frames have z on the joint axis. "))
    if asym.size:
        root.append(ET.Comment(f" Asymmetric Coulomb friction [+, -] per joint {c.coulomb.tolist()} written as the mean magnitude. "))
    vel = np.asarray(arm.limits.velocity, dtype=float)
    if np.any(np.isfinite(vel)):
        root.append(ET.Comment(f" Velocity limits {vel.tolist()} have no MuJoCo field. "))
    if np.any(np.asarray(arm.drives.torque_constant) != 0):
        root.append(ET.Comment(" The electrical motor model (torque constant, resistance, voltage limit) is not exported. "))
    ET.SubElement(
        root,
        "compiler",
        angle="radian",
        autolimits="true",
        inertiafromgeom="false",
        boundmass="0",
        boundinertia="0",
        balanceinertia="false",
    )
    option = ET.SubElement(root, "option", gravity=_nums(c.gravity), integrator="RK4", timestep=_num(timestep))
    ET.SubElement(option, "flag", contact="disable")

    world = ET.SubElement(root, "worldbody")
    parent = ET.SubElement(world, "body", name="base")
    _pose(parent, c.base[:3, :3], c.base[:3, 3])
    lims = arm.limits
    for i in range(n):
        body = ET.SubElement(parent, "body", name=f"link{i + 1}")
        _pose(body, c.rotation[i], c.translation[i])
        I = c.inertia[i]
        ET.SubElement(
            body,
            "inertial",
            pos=_nums(c.com[i]),
            mass=_num(c.mass[i]),
            fullinertia=_nums([I[0, 0], I[1, 1], I[2, 2], I[0, 1], I[0, 2], I[1, 2]]),
        )
        joint = ET.SubElement(
            body,
            "joint",
            name=f"joint{i + 1}",
            type="hinge" if arm.is_revolute[i] else "slide",
            pos="0 0 0",
            axis="0 0 1",
            armature=_num(c.armature[i]),
            damping=_num(c.damping[i]),
            frictionloss=_num(coulomb[i]),
            stiffness="0",
        )
        lo, hi = (float(x) for x in np.asarray(lims.position[i]))
        if np.isfinite(lo) and np.isfinite(hi):
            joint.set("range", f"{_num(lo)} {_num(hi)}")
        torque = float(np.asarray(lims.torque[i]))
        if np.isfinite(torque):
            joint.set("actuatorfrcrange", f"{_num(-torque)} {_num(torque)}")
        parent = body
    site = ET.SubElement(parent, "site", name="tool")
    _pose(site, c.tip[:3, :3], c.tip[:3, 3])

    actuator = ET.SubElement(root, "actuator")
    for i in range(n):
        motor = ET.SubElement(actuator, "motor", name=f"motor{i + 1}", joint=f"joint{i + 1}", gear="1")
        torque = float(np.asarray(lims.torque[i]))
        if np.isfinite(torque):
            motor.set("ctrlrange", f"{_num(-torque)} {_num(torque)}")
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def save_mjcf(arm: Arm, path, *, timestep: float = 0.001) -> None:
    """Write :func:`to_mjcf` to ``path`` atomically (temporary file in the same folder, os.replace)."""
    _atomic_write(path, to_mjcf(arm, timestep=timestep))

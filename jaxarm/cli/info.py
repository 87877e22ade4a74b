"""``jaxarm info ARM``: the DH table, inertias, drives, limits and physical consistency."""

from __future__ import annotations

import numpy as np

from .common import EXIT_OK, _fmt, _load_arm, _table

_CONVENTION_TEXT = {
    "standard": "standard (distal) DH: T_i = Rz(theta_i + q_i) Tz(d_i) Tx(a_i) Rx(alpha_i)",
    "modified": "modified (proximal, Craig) DH: T_i = Rx(alpha_{i-1}) Tx(a_{i-1}) Rz(theta_i + q_i) Tz(d_i)",
    "placement": "placements (URDF-like): fixed xyz, rpy in the parent frame, then motion about axis",
}


def _unit(arm, i, revolute: str, prismatic: str) -> str:
    return revolute if arm.joint_types[i] == "revolute" else prismatic


def _info_text(arm, spec: str) -> str:
    n = arm.n
    types = "".join("R" if t == "revolute" else "P" for t in arm.joint_types)
    g = np.asarray(arm.gravity)
    out = [
        f"{arm.name}: {n} joints ({types}), {arm.convention} convention",
        f"gravity [m/s^2]: ({', '.join(_fmt(v) for v in g)})",
        "",
    ]
    kin = arm.kinematics
    out.append(f"Kinematics -- {_CONVENTION_TEXT[arm.convention]}")
    if arm.convention == "placement":
        headers = ["joint", "type", "x [m]", "y [m]", "z [m]", "roll [rad]", "pitch [rad]", "yaw [rad]", "axis"]
        rows = [
            [i + 1, arm.joint_types[i], *(_fmt(v) for v in kin.xyz[i]), *(_fmt(v) for v in kin.rpy[i]),
             "(" + ", ".join(_fmt(v, 4) for v in kin.axis[i]) + ")"]
            for i in range(n)
        ]
    else:
        if arm.convention == "modified":
            headers = ["joint", "type", "a_{i-1} [m]", "alpha_{i-1} [rad]", "d_i [m]", "theta_i [rad]"]
        else:
            headers = ["joint", "type", "a_i [m]", "alpha_i [rad]", "d_i [m]", "theta_i [rad]"]
        rows = [
            [i + 1, arm.joint_types[i], _fmt(kin.a[i]), _fmt(kin.alpha[i]), _fmt(kin.d[i]), _fmt(kin.theta[i])]
            for i in range(n)
        ]
    out.append(_table(headers, rows))
    if any(t == "prismatic" for t in arm.joint_types):
        out.append("  (for a prismatic joint q adds to d; for a revolute one to theta)")
    out.append("")

    links = arm.links
    out.append("Inertial parameters (link frame; inertia tensor about the COM in kg m^2)")
    headers = ["link", "mass [kg]", "com x [m]", "com y [m]", "com z [m]", "Ixx", "Iyy", "Izz", "Ixy", "Ixz", "Iyz"]
    rows = []
    for i in range(n):
        I = np.asarray(links.inertia[i])
        rows.append([i + 1, _fmt(links.mass[i]), *(_fmt(c) for c in links.com[i]),
                     _fmt(I[0, 0]), _fmt(I[1, 1]), _fmt(I[2, 2]), _fmt(I[0, 1]), _fmt(I[0, 2]), _fmt(I[1, 2])])
    out.append(_table(headers, rows))
    pm = float(np.asarray(arm.payload.mass))
    if pm > 0 or np.any(np.asarray(arm.payload.inertia)):
        pc, pI = np.asarray(arm.payload.com), np.asarray(arm.payload.inertia)
        out.append(f"  payload: mass {_fmt(pm)} kg, com ({', '.join(_fmt(c) for c in pc)}) m in the tool frame, "
                   f"inertia diag ({', '.join(_fmt(pI[k, k]) for k in range(3))}) kg m^2")
    out.append("")

    dr = arm.drives
    out.append("Drives (motor side; joint torque = G x motor torque; Kt = 0: no electrical model)")
    headers = ["joint", "gear G", "rotor Jm [kg m^2]", "viscous B [N m s/rad]", "Coulomb Tc+ [N m]", "Tc- [N m]",
               "Kt [N m/A]", "R [ohm]", "V limit [V]"]
    rows = []
    for i in range(n):
        kt, r = float(dr.torque_constant[i]), float(dr.resistance[i])
        rows.append([i + 1, _fmt(dr.gear_ratio[i]), _fmt(dr.rotor_inertia[i]), _fmt(dr.viscous_friction[i]),
                     _fmt(dr.coulomb_friction[i][0]), _fmt(dr.coulomb_friction[i][1]),
                     _fmt(kt) if kt > 0 else "-", _fmt(r) if r > 0 else "-", _fmt(dr.voltage_limit[i])])
    out.append(_table(headers, rows))
    extra = []
    for field, label in (("static_friction", "static (Stribeck) Ts [N m]"), ("stribeck_velocity", "Stribeck velocity"),
                         ("coulomb_velocity_scale", "Coulomb tanh scale")):
        values = np.asarray(getattr(dr, field))
        if np.any(values):
            extra.append(f"  {label}: " + ", ".join(_fmt(v) for v in values))
    sig = np.asarray(dr.sigmoid_friction)
    if np.any(sig):
        extra.append("  sigmoid friction (phi1, phi2, phi3), joint side: "
                     + "; ".join("(" + ", ".join(_fmt(v) for v in row) + ")" for row in sig))
    out.extend(extra)
    out.append("")

    lim = arm.limits
    out.append("Limits (joint side; inf = none)")
    headers = ["joint", "q min", "q max", "qd max", "tau max", "units"]
    rows = [[i + 1, _fmt(lim.position[i][0]), _fmt(lim.position[i][1]), _fmt(lim.velocity[i]), _fmt(lim.torque[i]),
             _unit(arm, i, "rad, rad/s, N m", "m, m/s, N")] for i in range(n)]
    out.append(_table(headers, rows))
    out.append("")

    for label, T in (("base (frame 0 in the world)", arm.base), ("tool (in the last link frame)", arm.tool)):
        T = np.asarray(T)
        if not np.array_equal(T, np.eye(4)):
            out.append(f"{label}: translation ({', '.join(_fmt(v) for v in T[:3, 3])}) m, rotation rows "
                       + "; ".join("(" + ", ".join(_fmt(v, 4) for v in row) + ")" for row in T[:3, :3]))
    if not np.array_equal(np.asarray(arm.base), np.eye(4)) or not np.array_equal(np.asarray(arm.tool), np.eye(4)):
        out.append("")

    from ..model.consistency import consistency_report

    out.append("Physical consistency (Wensing, Kim & Slotine 2017: pseudo-inertia >= 0)")
    for label, report in consistency_report(arm, drives=True).items():
        if label.startswith("drive") and report.ok:
            continue  # drives are listed only when one needs attention
        name = label.replace("joint", "link")
        if report.ok:
            out.append(f"  {name}: OK")
        elif report.massless:
            out.append(f"  {name}: OK (massless: no mass, no inertia)")
        else:
            out.append(f"  {name}: INCONSISTENT")
            out.extend(f"    - {p}" for p in report.problems)
    return "\n".join(out)


def _cmd_info(args) -> int:
    arm = _load_arm(args.arm, strict=False)
    print(_info_text(arm, args.arm))
    return EXIT_OK

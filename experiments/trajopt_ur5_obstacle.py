"""UR5 reach around a spherical obstacle that the unconstrained solution would hit.

    python experiments/trajopt_ur5_obstacle.py [--plot trajopt_ur5_obstacle.png]

The UR5 of example-robot-data (its URDF read by ``jaxarm.load_arm``; the file comes with the
Crocoddyl environment, ``python experiments/trajopt_crocoddyl.py --setup``, or any installed
``example-robot-data``) reaches 0.46 m in 1 s (RK3, dt = 10 ms, T = 100) from rest to rest:
effort (u / u_max)^2, goal 1e4 |p - p*|^2 and rest 1e2 |qd_T|^2 at the end, a posture and
joint-speed regularization along the path, the URDF's torque limits as the input box. A 6 cm
sphere is placed on the unconstrained solution's tool path, half-way; the constrained problem
keeps the tool and the wrist (link 4's origin) 2 cm outside it. One JSON line per solve, then
the gradient of the optimal effort with respect to the sphere's centre (implicit function theorem
at the optimum; which way moving the obstacle would save effort), checked against central
differences of the same local optimum (the problem has neighbouring local optima; see below). Skips with a message when no UR5 URDF is found.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jaxarm  # noqa: E402
from jaxarm import trajopt  # noqa: E402
from jaxarm.trajopt import terms  # noqa: E402
from trajopt_crocoddyl import VENV, robots_folder  # noqa: E402
from trajopt_ddp import emit, equal_axes, summary, timed, tool_path  # noqa: E402

Q0 = np.array([0.0, -1.0, 1.5, -0.5, 1.57, 0.0])
OFFSET = np.array([0.0, 0.35, 0.3])
T, DT = 100, 0.01
RADIUS, MARGIN, WRIST = 0.06, 0.02, 4


def ur5_urdf():
    """example-robot-data's UR5 URDF: from an installed example_robot_data, else the Crocoddyl env."""
    try:
        import example_robot_data  # noqa: F401

        robots = Path(example_robot_data.getModelPath("ur_description/urdf/ur5_robot.urdf")) / "robots"
    except Exception:  # example-robot-data 6 ships its files only (cmeel layout): this environment's, else Crocoddyl's
        robots = robots_folder(Path(sys.executable)) or robots_folder(VENV / "bin" / "python")
    if robots is None or not (robots / "ur_description/urdf/ur5_robot.urdf").exists():
        return None
    return robots / "ur_description/urdf/ur5_robot.urdf"


def plot(path, arm, free, res, centre, goal):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(11, 4.5))
    ax = fig.add_subplot(1, 2, 1, projection="3d")
    for q, label, colour in ((free.q, "unconstrained", "tab:red"), (res.q, "around the sphere", "tab:blue")):
        p = tool_path(arm, q)
        ax.plot(*p.T, color=colour, label=f"tool, {label}")
    wrist = np.asarray(jax.vmap(lambda q: terms.link_point(arm, q, WRIST, jnp.zeros(3)))(res.q))
    ax.plot(*wrist.T, color="tab:blue", ls=":", label="wrist, around the sphere")
    u, v = np.mgrid[0:2 * np.pi:24j, 0:np.pi:12j]
    ax.plot_surface(centre[0] + RADIUS * np.cos(u) * np.sin(v), centre[1] + RADIUS * np.sin(u) * np.sin(v),
                    centre[2] + RADIUS * np.cos(v), color="grey", alpha=0.3)
    ax.scatter(*goal, color="k", marker="x", label="goal")
    equal_axes(ax, np.concatenate([tool_path(arm, free.q), tool_path(arm, res.q), wrist, centre[None] + RADIUS, centre[None] - RADIUS]))
    ax.legend(fontsize=7)
    ax.set_title("UR5 reach, tool paths")
    ax2 = fig.add_subplot(1, 2, 2)
    t = np.arange(T + 1) * DT
    for q, label, colour in ((free.q, "unconstrained", "tab:red"), (res.q, "around the sphere", "tab:blue")):
        d = np.linalg.norm(tool_path(arm, q) - centre, axis=1) - RADIUS
        ax2.plot(t, 1e3 * d, color=colour, label=label)
    ax2.axhline(1e3 * MARGIN, color="grey", ls="--", label="margin")
    ax2.axhline(0.0, color="k", lw=0.8)
    ax2.set_xlabel("t (s)")
    ax2.set_ylabel("tool distance outside the sphere (mm)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plot", default=None, help="PNG of the tool paths and the clearance")
    args = ap.parse_args(argv)
    urdf = ur5_urdf()
    if urdf is None:
        print("no UR5 URDF found: pip install example-robot-data, or python experiments/trajopt_crocoddyl.py --setup",
              file=sys.stderr)
        return
    emit(device=str(jax.devices()[0]), jax=jax.__version__, dtype="float64", urdf=str(urdf))
    arm = jaxarm.load_arm(str(urdf), base_link="base_link", tip_link="tool0")
    lim = np.asarray(arm.limits.torque)
    p0 = tool_path(arm, Q0[None])[0]
    goal = p0 + OFFSET
    costs = (terms.effort(1.0 / lim**2) + terms.tool_position(goal, 1e4) + terms.joint_velocity(1e2)
             + terms.joint_position(Q0, 1.0, when="path") + terms.joint_velocity(0.1, when="path"))
    free_problem = trajopt.ocp(arm, Q0, T, DT, costs=costs)
    # the problems closed over (their arm a constant of the compiled solver), what changes an argument
    free, first, solve = timed(jaxarm.jit(lambda: trajopt.ddp(free_problem)))
    path = tool_path(arm, free.q)
    centre = path[T // 2]
    emit(case="ur5_unconstrained", first_call_s=round(first, 2), solve_s=round(solve, 3),
         position_error_m=float(np.linalg.norm(path[-1] - goal)), **summary(free))
    keep_out = (terms.keep_out_sphere("centre", RADIUS, margin=MARGIN)
                + terms.keep_out_sphere("centre", RADIUS, link=WRIST, margin=MARGIN))
    problem = trajopt.ocp(arm, Q0, T, DT, costs=costs, constraints=keep_out, params={"centre": jnp.asarray(centre)})
    tight = dict(tol=1e-10, tol_violation=1e-8, max_iterations=400)

    def solve_around(p, u, x):
        return trajopt.ddp(p, u, x, **tight)

    res, first, solve = timed(jaxarm.jit(lambda c, u, x: solve_around(problem.replace(params={"centre": c}), u, x)),
                              jnp.asarray(centre), free.u, free.x)
    path_c = tool_path(arm, res.q)
    wrist = np.asarray(jax.vmap(lambda q: terms.link_point(arm, q, WRIST, jnp.zeros(3)))(res.q))
    emit(case="ur5_obstacle", first_call_s=round(first, 2), solve_s=round(solve, 3),
         unconstrained_min_clearance_m=float(np.min(np.linalg.norm(path - centre, axis=1)) - RADIUS),
         min_clearance_m=float(np.min(np.linalg.norm(path_c - centre, axis=1)) - RADIUS),
         wrist_min_clearance_m=float(np.min(np.linalg.norm(wrist - centre, axis=1)) - RADIUS),
         unconstrained_cost=float(free.cost), position_error_m=float(np.linalg.norm(path_c[-1] - goal)),
         **summary(res))

    def effort(c, u0=free.u, x0=free.x):
        r = solve_around(problem.replace(params={"centre": c}), u0, x0)
        return jnp.sum((r.u / lim) ** 2) * DT

    grad, first, warm = timed(jaxarm.jit(jax.grad(effort)), jnp.asarray(centre), repeats=1)
    value = jaxarm.jit(effort)
    # central differences of the optimum the gradient is of: the problem has neighbouring local
    # optima, and warm-started from the free solution a step of the centre by 1e-6 m along y (or
    # -1e-5 m along x) lands the solve in another one (effort -3.7e-3 lower along y); warm-started
    # from the constrained optimum itself, the perturbed solves stay in its basin
    h = 1e-6
    base = float(value(jnp.asarray(centre)))
    fd = [(float(value(jnp.asarray(centre + h * e), res.u, res.x)) - float(value(jnp.asarray(centre - h * e), res.u, res.x))) / (2 * h)
          for e in np.eye(3)]
    emit(case="ur5_obstacle_gradient", effort=base,
         d_effort_d_centre=np.asarray(grad).round(8).tolist(), central_differences=np.round(fd, 8).tolist(),
         max_relative_difference=float(np.max(np.abs(np.asarray(grad) - fd)) / np.max(np.abs(fd))),
         gradient_first_call_s=round(first, 2), gradient_s=round(warm, 3))
    if args.plot:
        plot(args.plot, arm, free, res, centre, goal)


if __name__ == "__main__":
    main()

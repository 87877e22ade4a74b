"""Crocoddyl's side of experiments/trajopt_crocoddyl.py: the same reach, solved by SolverBoxFDDP.

Runs under Python with Crocoddyl installed (its own virtual environment: crocoddyl 3.1 needs
pin 3.8, which the main environment's Pinocchio may not be); reads the problem as JSON on stdin
and prints one JSON object. Not a jaxarm module: it imports only numpy, pinocchio and crocoddyl.

The problem, in Crocoddyl's terms (each cost = weight * activation(residual); a quadratic
activation is 0.5 |r|^2_W, so every weight is twice jaxarm's w in w |r|^2):

- running node k < T: IntegratedActionModelEuler (semi-implicit Euler, v+ = v + a dt,
  q+ = q + v+ dt, cost times dt) of DifferentialActionModelFreeFwdDynamics (ABA) with
  ActuationModelFull, cost sum_i w_i u_i^2 (ResidualModelControl) + w_posture |q - q0|^2 +
  w_speed |v|^2 (ResidualModelState), u_lb <= u <= u_ub;
- terminal node: w_goal |p_tool - goal|^2 (ResidualModelFrameTranslation) + w_vel |v|^2
  (ResidualModelState, position part weighted 0);
- start: x0 at every knot and the quasi-static inputs (gravity torques), Crocoddyl's default.
"""

import json
import sys
import time

import crocoddyl
import numpy as np
import pinocchio as pin


def build(spec, goal):
    model = pin.buildModelFromUrdf(spec["urdf"])
    if spec.get("locked"):
        ids = [model.getJointId(name) for name in spec["locked"]]
        model = pin.buildReducedModel(model, ids, pin.neutral(model))
    state = crocoddyl.StateMultibody(model)
    actuation = crocoddyl.ActuationModelFull(state)
    nu, nv = actuation.nu, model.nv
    frame = model.getFrameId(spec["tip_frame"])
    dt = spec["dt"]

    effort = crocoddyl.CostModelSum(state, nu)
    effort.addCost("effort", crocoddyl.CostModelResidual(
        state, crocoddyl.ActivationModelWeightedQuad(2.0 * np.asarray(spec["w_effort"], float)),
        crocoddyl.ResidualModelControl(state, nu)), 1.0)
    x0 = np.concatenate([np.asarray(spec["q0"], float), np.zeros(nv)])
    effort.addCost("posture", crocoddyl.CostModelResidual(
        state, crocoddyl.ActivationModelWeightedQuad(np.concatenate([np.full(nv, 2.0 * spec["w_posture"]),
                                                                     np.full(nv, 2.0 * spec["w_speed"])])),
        crocoddyl.ResidualModelState(state, x0, nu)), 1.0)
    running = crocoddyl.IntegratedActionModelEuler(
        crocoddyl.DifferentialActionModelFreeFwdDynamics(state, actuation, effort), dt)
    running.u_lb = np.asarray(spec["u_lb"], float)
    running.u_ub = np.asarray(spec["u_ub"], float)

    terminal_costs = crocoddyl.CostModelSum(state, nu)
    terminal_costs.addCost("goal", crocoddyl.CostModelResidual(
        state, crocoddyl.ActivationModelQuad(3),
        crocoddyl.ResidualModelFrameTranslation(state, frame, np.asarray(goal, float), nu)), 2.0 * spec["w_goal"])
    terminal_costs.addCost("rest", crocoddyl.CostModelResidual(
        state, crocoddyl.ActivationModelWeightedQuad(np.concatenate([np.zeros(nv), np.full(nv, 2.0 * spec["w_vel"])])),
        crocoddyl.ResidualModelState(state, np.zeros(state.nx), nu)), 1.0)
    terminal = crocoddyl.IntegratedActionModelEuler(
        crocoddyl.DifferentialActionModelFreeFwdDynamics(state, actuation, terminal_costs), 0.0)

    problem = crocoddyl.ShootingProblem(x0, [running] * spec["T"], terminal)
    return problem, x0


def solve(spec, goal):
    t0 = time.perf_counter()
    problem, x0 = build(spec, goal)
    built = time.perf_counter() - t0
    solver = crocoddyl.SolverBoxFDDP(problem)
    xs = [x0] * (spec["T"] + 1)
    us = list(problem.quasiStatic(xs[:-1]))
    t0 = time.perf_counter()
    converged = solver.solve(xs, us, spec["max_iterations"], False)
    solved = time.perf_counter() - t0
    return solver, converged, built, solved


def main():
    spec = json.load(sys.stdin)
    goals = spec["goals"]
    rows = []
    for i, goal in enumerate(goals):
        times = []
        for _ in range(spec["repeats"] if i == 0 else 1):
            solver, converged, built, solved = solve(spec, goal)
            times.append(solved)
        rows.append({"iterations": int(solver.iter), "cost": float(solver.cost), "converged": bool(converged),
                     "solve_s": float(np.median(times)), "build_s": built})
        if i == 0:
            first = {"xs": np.asarray(solver.xs).tolist(), "us": np.asarray(solver.us).tolist()}
    print(json.dumps({"crocoddyl": crocoddyl.__version__, "pinocchio": pin.__version__, "solves": rows, "trajectory": first}))


if __name__ == "__main__":
    main()

"""Layer 2, the dynamics of one state: kinematics, recursive Newton-Euler, the composite-body mass
matrix, forward dynamics, energies, friction and motors. Each recursion is written once, in the
component algebra of :mod:`jaxarm.dynamics.algebra`.

Every function takes a single state (q, qd, ... of shape (n,)); batch with ``jax.vmap``.
"""

from .composite_body import coriolis_matrix, mass_matrix, mass_matrix_by_columns
from .drives import friction_torques, reflected_inertia
from .energy import kinetic_energy, potential_energy
from .forward import forward_dynamics
from .kinematics import forward_kinematics, jacobian, tool_pose
from .motors import DAC, motor_current, motor_torque, motor_voltage, saturate_voltage
from .newton_euler import bias_forces, gravity_torques, inverse_dynamics, joint_wrenches, rigid_body_torques

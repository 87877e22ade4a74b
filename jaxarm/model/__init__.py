"""Layer 1, the arm as data: the :class:`Arm` pytree and its body model, argument checks, arm files
(TOML), URDF and MJCF, the parts database and physical consistency. The bundled arms live in
``arms/``."""

from .arm import DH, Arm, Drives, Limits, Links, Payload, Placements, body_model, make_arm, stack_arms, validate_arm
from .arm_files import ArmFileError, PhysicalConsistencyWarning, bundled_arms, load_arm, save_arm
from .consistency import LinkConsistency, check_link, consistency_report, pseudo_inertia
from .mjcf import save_mjcf, to_mjcf
from .urdf import UrdfError, load_urdf, save_urdf, urdf_joint_names

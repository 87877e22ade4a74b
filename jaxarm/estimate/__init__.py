"""Layer 4, estimation from measured motion: the generalized-momentum observer of external joint
torques and contact detection. Uses the layers below; never :mod:`jaxarm.identify` or
:mod:`jaxarm.control`."""

from .momentum_observer import MomentumObserver, detect_contact, detection_threshold, momentum_observer

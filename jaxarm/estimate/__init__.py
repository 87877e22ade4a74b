"""Layer 4, estimation from measured motion: the extended and unscented Kalman filters of the arm's states (and
external torques), the generalized-momentum observer of external joint torques and contact
detection. Uses the layers below; never :mod:`jaxarm.identify` or
:mod:`jaxarm.control`."""

from .kalman import KalmanEstimate, extended_kalman_filter, kalman_filter, unscented_kalman_filter
from .momentum_observer import MomentumObserver, contact_link, detect_contact, detection_threshold, momentum_observer

"""Layer 4, control: linearization about trajectories, time-varying LQR, resolved-rate motion
and trajectory optimization. Uses the layers below; never :mod:`jaxarm.identify`."""

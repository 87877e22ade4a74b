"""Layer 0, what every other layer uses: spatial algebra (rotations, transforms), atomic file
writes, the compiler options of :func:`jaxarm.jit`, and the tracers jax wraps values in (which
transformations a call runs under). Imports nothing from jaxarm."""

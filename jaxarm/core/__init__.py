"""Layer 0, what every other layer uses: spatial algebra (rotations, transforms), atomic file
writes, and the compiler options of :func:`jaxarm.jit`. Imports nothing from jaxarm."""

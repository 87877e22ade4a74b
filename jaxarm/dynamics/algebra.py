"""The component algebra the dynamics are written in: 3-vectors as tuples of scalars,
rotations as tuples of rows, and the constant folding of a known arm.

Why: under ``jax.vmap``, code written with 3-vectors and 3x3 matrices become arrays of shape
(B, 3) and (B, 3, 3); XLA:CPU turns every tiny product on them into its own loop over the batch
(with slices, broadcasts and transposes between them), a few thousand HLO operations and a
hundred fused loops for one inverse dynamics. Here every vector is a tuple of three scalars and
every rotation a tuple of three rows, so the traced program contains scalar arithmetic only;
batched, each scalar becomes one (B,) array (structure of arrays) and XLA fuses the whole
recursion into a few elementwise loops that LLVM vectorizes over the batch.

Two further points, both measured:
- :func:`sincos` evaluates sine and cosine with polynomials (vectorized) instead of the scalar
  libm calls XLA:CPU emits for ``jnp.sin`` / ``jnp.cos`` (about 12 ns per value in float64);
- how the scalars are put back into arrays matters (:func:`vector`, :func:`matrix`);
- an arm closed over by a jit (not passed to it) is known while tracing: its parameters enter as
  :class:`Known` scalars, so its structural zeros and ones (DH twists of 0 and 90 degrees,
  principal inertias, gravity along one axis) fold away at trace time. The bundled Panda's
  forward dynamics shrinks from 4762 to 2044 traced operations, and a batched RK3 rollout of it runs ~1.5x
  faster and compiles ~2x faster. A traced arm (``jax.grad`` with respect to it) takes the same
  code with tracers in place of Knowns.

Every recursion of :mod:`jaxarm.dynamics` (Newton-Euler, the composite-body mass matrix,
forward dynamics, and so the rollouts) is written in this algebra; it is the one implementation.
One forward dynamics becomes a single elementwise fusion of a few thousand scalar operations;
XLA:CPU's MLIR fusion emitters compile that into slow code, and slowly, so :func:`jaxarm.jit`
turns them off (:mod:`jaxarm.core.xla`; with them on, a 1000-step RK3 rollout ran about 2x slower).
The test suite checks the recursions against array-based oracles written independently
(``tests/oracles.py``), Pinocchio, closed forms and identities.
"""

from __future__ import annotations

from decimal import Decimal, getcontext
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import Tracer
try:  # jax >= 0.4.3x; older releases had it in jax.core
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
    from jax.core import Primitive
from jax.interpreters import ad, batching, mlir

from ..core import xla as _xla
from ..model.checks import _is_concrete as _concrete

# --------------------------------------------------------------------------------------
# sine and cosine


def _split_half_pi(bits: int, parts: int = 3):
    """pi/2 as a sum of `parts` doubles, each but the last with `bits` significant bits, so
    k * part is exact for integers |k| < 2^(mantissa - bits) (Cody & Waite range reduction)."""
    getcontext().prec = 80
    pi = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899")
    rest = Fraction(pi / 2)
    out = []
    for _ in range(parts - 1):
        exp = int(np.floor(np.log2(float(rest))))
        scale = Fraction(2) ** (bits - 1 - exp)
        head = Fraction(int(rest * scale), 1) / scale  # truncate to `bits` significant bits
        out.append(float(head))
        rest -= head
    out.append(float(rest))
    return tuple(out)


# float64: three 30-bit parts, exact products for |k| < 2^23 (|x| < 1.3e7 rad);
# float32: three 11-bit parts, exact for |k| < 2^13 (|x| < 1.2e4 rad).
_HALF_PI_PARTS = {8: _split_half_pi(30), 4: _split_half_pi(11)}
# Taylor series on |r| <= pi/4, truncated where the remainder drops below half an ulp:
# sin to r^15 (next term (pi/4)^17 / 17! = 4.6e-17), cos to r^16 (next 2e-18) in float64;
# sin to r^9 (1.7e-9), cos to r^10 (1.1e-10) in float32.
_TERMS = {8: (7, 8), 4: (4, 5)}


def _taylor(r2, count, first):
    """sum_{k=1..count} (-1)^k r2^(k-1) / (first + 2k - 2)! ... by Horner (first = 3 for sin, 2 for cos)."""
    coeffs = []
    for k in range(1, count + 1):
        n = first + 2 * (k - 1)
        coeffs.append((-1.0) ** k / float(np.prod(np.arange(1, n + 1, dtype=float))))
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = c + r2 * acc
    return acc


def sincos(x):
    """(sin x, cos x), elementwise, as vectorizable polynomial arithmetic (on a single value, XLA's
    own sine and cosine: see :func:`_sincos_lowering`).

    Cody-Waite reduction x = k pi/2 + r with |r| <= pi/4 (pi/2 split in three parts so the
    products k * part are exact), Taylor polynomials for sin r and cos r, and the quadrant k
    mod 4 selecting and signing them. Accurate to about one ulp for |x| < 1.3e7 in float64
    (1.2e4 in float32, where the argument itself is then uncertain by more than 1e-3); beyond,
    the error grows like |x| * 2^-53. Derivatives: d sin = cos dx, d cos = -sin dx (the
    primitive's JVP rule, so grad, jacfwd and hessian all work).
    """
    x = jnp.asarray(x)
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.result_type(float)
    return tuple(_sincos_p.bind(x.astype(dtype)))


def _sincos_polynomial(x):
    """(sin x, cos x) by Cody-Waite reduction and Taylor polynomials (see :func:`sincos`)."""
    dtype = x.dtype
    size = jnp.dtype(dtype).itemsize
    size = 8 if size >= 8 else 4
    p1, p2, p3 = _HALF_PI_PARTS[size]
    n_sin, n_cos = _TERMS[size]
    k = jnp.round(x * (2.0 / np.pi))
    r = ((x - k * p1) - k * p2) - k * p3
    r2 = r * r
    s = r + r * r2 * _taylor(r2, n_sin, 3)  # sin r = r - r^3/3! + ...
    c = 1.0 + r2 * _taylor(r2, n_cos, 2)  # cos r = 1 - r^2/2! + ...
    quadrant = k - 4.0 * jnp.floor(k * 0.25)  # k mod 4 in {0, 1, 2, 3}
    odd = (quadrant == 1.0) | (quadrant == 3.0)
    sin_x = jnp.where(odd, c, s)
    cos_x = jnp.where(odd, s, c)
    sin_x = jnp.where(quadrant >= 2.0, -sin_x, sin_x)  # quadrants 2, 3: sin < 0
    cos_x = jnp.where((quadrant == 1.0) | (quadrant == 2.0), -cos_x, cos_x)  # quadrants 1, 2: cos < 0
    return sin_x, cos_x


# Arrays of fewer entries than this take XLA's own sine and cosine (see _sincos_lowering).
NATIVE_BELOW = 2


def _sincos_lowering(ctx, x):
    """The polynomials where the operand has at least :data:`NATIVE_BELOW` entries (a batch: they
    vectorize), XLA's own sine and cosine on fewer (a single state, the knots of a trajectory
    optimizer's sequential loops). On a few values the polynomials are no faster than the library
    calls they replace, and each is ~40 operations that XLA compiles again in every fusion that
    reads it: the Panda's trajectory optimizer (``trajopt.ddp``) compiles 21.3k lines of optimized
    HLO, and its first call is 0.4-0.6 s shorter, where the polynomials everywhere gave 23.7k
    (XLA's sine and cosine everywhere, its pass over all knots included: 18.2k lines, but a 5 %
    slower solve). Batches keep the polynomials: at batch 4, XLA's made a rollout 25 % slower."""
    (aval,) = ctx.avals_in
    if aval.size >= NATIVE_BELOW:
        return mlir.lower_fun(_sincos_polynomial, multiple_results=True)(ctx, x)
    return mlir.lower_fun(lambda v: (jax.lax.sin(v), jax.lax.cos(v)), multiple_results=True)(ctx, x)


_sincos_p = Primitive("jaxarm_sincos")
_sincos_p.multiple_results = True
_sincos_compiled = jax.jit(lambda x: tuple(_sincos_p.bind(x)))
_sincos_p.def_impl(_sincos_compiled)  # eagerly: compiled, so that it takes the same form as in a jit
_sincos_p.def_abstract_eval(lambda x: [jax.core.ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)] * 2)
mlir.register_lowering(_sincos_p, _sincos_lowering)
batching.primitive_batchers[_sincos_p] = lambda args, dims: (_sincos_p.bind(args[0]), [dims[0]] * 2)


def _sincos_jvp(primals, tangents):  # (JAX calls it only where the tangent is not a symbolic zero)
    (x,), (dx,) = primals, tangents
    s, c = _sincos_p.bind(x)
    return (s, c), (c * dx, -s * dx)


ad.primitive_jvps[_sincos_p] = _sincos_jvp


# --------------------------------------------------------------------------------------
# 3-vectors as tuples of scalars, rotations as tuples of rows


def _same(a, b) -> bool:
    """Whether a and b are tracers of one kind, dtype, shape and weak type, so that lax's
    primitives apply to them as they are."""
    if type(a) is not type(b) or not isinstance(a, Tracer):
        return False
    x, y = a.aval, b.aval
    return x.dtype == y.dtype and x.shape == y.shape and x.weak_type == y.weak_type


# a b, a + b, a - b: the primitive itself where :func:`_same` holds, the operator otherwise (Knowns,
# numbers, mixed dtypes or shapes). The operator on two tracers goes through jnp's promotion and a
# nested jit (about 4x the primitive's tracing time, for the same equation), and under the
# trajectory optimizer's forward mode vmapped over directions it also put a broadcast_in_dim before
# products with constants: 740 of them in the Panda's ddp, whose compile took 3.1 s instead of 2.5.
def mul(a, b):
    return lax.mul(a, b) if _same(a, b) else a * b


def plus(a, b):
    return lax.add(a, b) if _same(a, b) else a + b


def minus(a, b):
    return lax.sub(a, b) if _same(a, b) else a - b


def _dot3(a0, b0, a1, b1, a2, b2):
    """a0 b0 + a1 b1 + a2 b2."""
    return plus(plus(mul(a0, b0), mul(a1, b1)), mul(a2, b2))


def mv(R, v):
    """R v."""
    return tuple(_dot3(R[i][0], v[0], R[i][1], v[1], R[i][2], v[2]) for i in range(3))


def mtv(R, v):
    """R^T v."""
    return tuple(_dot3(R[0][i], v[0], R[1][i], v[1], R[2][i], v[2]) for i in range(3))


def cross(a, b):
    return (minus(mul(a[1], b[2]), mul(a[2], b[1])), minus(mul(a[2], b[0]), mul(a[0], b[2])),
            minus(mul(a[0], b[1]), mul(a[1], b[0])))


def add(*vs):
    out = []
    for c in zip(*vs):
        acc = c[0]
        for x in c[1:]:
            acc = plus(acc, x)
        out.append(acc)
    return tuple(out)


def scale(s, v):
    return (mul(s, v[0]), mul(s, v[1]), mul(s, v[2]))


def dot(a, b):
    return _dot3(a[0], b[0], a[1], b[1], a[2], b[2])


def sym_mv(I, v):
    """I v for a symmetric I given by its six entries (xx, xy, xz, yy, yz, zz)."""
    xx, xy, xz, yy, yz, zz = I
    return (_dot3(xx, v[0], xy, v[1], xz, v[2]), _dot3(xy, v[0], yy, v[1], yz, v[2]), _dot3(xz, v[0], yz, v[1], zz, v[2]))


class Known:
    """A scalar whose value is known while the program is traced: an entry of an arm that is a
    compile-time constant (closed over by the user's ``jit``, not passed to it as an argument).

    Arithmetic with a Known folds at trace time: ``0 * x`` is 0, ``1 * x`` is x, ``0 + x`` is x,
    and two Knowns combine into a Known. The zeros of an arm's structure (DH twists of 0 and
    +-90 degrees, centres of mass on an axis, principal inertias, gravity along one axis) then
    cost nothing in the compiled program: 34 % of the Panda's forward-dynamics multiplications
    had a constant 0 or +-1 operand (measured on the traced program). A traced arm (``jax.grad``
    with respect to it, ``vmap`` over arms) gives tracers here instead, and the same equations.

    ``0 * x`` is folded to 0 even where x could be inf or NaN; a rollout whose state becomes
    non-finite is still flagged by its divergence check, which looks at the state itself.
    Operators only: jax arrays defer to ``__rmul__`` etc. for this type; :func:`materialize`
    turns it into an array.
    """

    __slots__ = ("value",)
    __array_ufunc__ = None  # numpy scalars and arrays defer to the reflected operators below

    def __init__(self, value):
        self.value = float(value)

    def __repr__(self):
        return f"Known({self.value!r})"

    def __mul__(self, other):
        if isinstance(other, Known):
            return Known(self.value * other.value)
        if self.value == 0.0:
            return ZERO
        if self.value == 1.0:
            return other
        if self.value == -1.0:
            return -other
        if _strong(other):  # the equation the operator makes, without jnp's promotion (see mul)
            return lax.mul(other.dtype.type(self.value), other)
        return self.value * other

    __rmul__ = __mul__

    def __add__(self, other):
        if isinstance(other, Known):
            return Known(self.value + other.value)
        if self.value == 0.0:
            return other
        if _strong(other):
            return lax.add(other, other.dtype.type(self.value))
        return other + self.value

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, Known):
            return Known(self.value - other.value)
        if self.value == 0.0:
            return -other
        if _strong(other):
            return lax.sub(other.dtype.type(self.value), other)
        return self.value - other

    def __rsub__(self, other):  # other - self, other not Known
        if self.value == 0.0:
            return other
        if _strong(other):
            return lax.sub(other, other.dtype.type(self.value))
        return other - self.value

    def __neg__(self):
        return Known(-self.value)

    def __truediv__(self, other):
        if isinstance(other, Known):
            return Known(_divide(self.value, other.value))
        return ZERO if self.value == 0.0 else self.value / other

    def __rtruediv__(self, other):  # other / self
        return other * Known(_divide(1.0, self.value))


ZERO = Known(0.0)


def _strong(x) -> bool:
    """Whether x is a tracer of a floating dtype that is not weakly typed: a Known's value then
    enters lax's primitive as a constant of x's dtype, the equation jnp's operator would make."""
    if not isinstance(x, Tracer):
        return False
    aval = x.aval
    return not aval.weak_type and jnp.issubdtype(aval.dtype, jnp.floating)


def _divide(a: float, b: float) -> float:
    """a / b with IEEE semantics (inf, nan), as the same division of arrays would give: a
    singular matrix then fails where it fails for a traced arm, not as a ZeroDivisionError."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def rsqrt(x):
    """1 / sqrt(x) for x > 0, NaN otherwise; a Known stays Known (NumPy)."""
    if isinstance(x, Known):
        with np.errstate(invalid="ignore", divide="ignore"):
            return Known(float(1.0 / np.sqrt(np.float64(x.value))))
    return _rsqrt_newton(jnp.asarray(x))


# Initial guesses of 1/sqrt(x) from the exponent (Lomont 2003, "Fast inverse square root"; the
# float64 constant from Robertson 2012), within 3.5 % for every normal x; each Newton step
# y <- y (3/2 - x y^2 / 2) squares the relative error (times 3/2), so 4 steps reach float64's
# round-off and 3 float32's.
_RSQRT_MAGIC = {8: (jnp.int64, 0x5FE6EB50C7B537A9, 4), 4: (jnp.int32, 0x5F375A86, 3)}


@jax.custom_jvp
def _rsqrt_newton(x):
    """1 / sqrt(x) by multiplications only. XLA:CPU counts sqrt, rsqrt and division as expensive
    and will not duplicate them into several consumers, so each pivot of an unrolled Cholesky
    factorization written with them ends a loop fusion, and the cheap kinematics and mass-matrix
    entries upstream are recomputed in every one of the ~40 fusions that follow (Panda forward
    dynamics: 43 fusions, 118 evaluations of the 6 joints' sine and cosine). With multiplications
    only, the whole forward dynamics is one fusion: batched twice as fast for the Panda, a third
    faster for the Puma 560, and compiled in half the time (docs/benchmarks.md). Accurate to
    1-2 ulp; NaN for x <= 0, inf or NaN, and for subnormal x (below 2.2e-308 in float64, 1.2e-38
    in float32), where the exponent trick does not apply."""
    size = 8 if jnp.dtype(x.dtype).itemsize >= 8 else 4
    itype, magic, steps = _RSQRT_MAGIC[size]
    xf = x.astype(jnp.float64 if size == 8 else jnp.float32)
    bits = jax.lax.bitcast_convert_type(xf, itype)
    y = jax.lax.bitcast_convert_type(itype(magic) - (bits >> 1), xf.dtype)
    half = 0.5 * xf
    for _ in range(steps):
        y = y * (1.5 - half * y * y)
    ok = (xf >= jnp.finfo(xf.dtype).tiny) & (xf < jnp.inf)
    return jnp.where(ok, y, jnp.nan).astype(x.dtype)


@_rsqrt_newton.defjvp
def _rsqrt_newton_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    y = _rsqrt_newton(x)
    return y, -0.5 * y * y * y * dx  # d x^(-1/2) = -x^(-3/2) dx / 2


def materialize(x, dtype):
    """An array for x: a Known becomes a constant of ``dtype``, anything else passes through."""
    return jnp.asarray(x.value, dtype) if isinstance(x, Known) else x


def _knowns(a):
    """The entries of a concrete array as Knowns (a nested list of its shape), entries within
    8 ulps of the array's largest being snapped to 0: cos(pi/2) = 6e-17 is the rounding of an
    exact zero, and folding it keeps the DH structure (the change is below the rounding of every
    product it enters)."""
    a = np.asarray(a)
    tol = 8 * np.finfo(a.dtype).eps * (np.max(np.abs(a)) if a.size else 0.0)
    snapped = np.where(np.abs(a) <= tol, 0.0, a).astype(float)
    return jax.tree_util.tree_map(Known, snapped.tolist())


class Entries:
    """An array handed to the recursions as its entries, traced scalars already read from it
    (:func:`per_state_entries`): indexing gives the entry, or the entries of a sub-array, and
    :func:`scalar`, :func:`_vec` and :func:`_sym` take them as they are."""

    __slots__ = ("cells", "dtype")

    def __init__(self, cells: np.ndarray, dtype):
        self.cells, self.dtype = cells, dtype

    def __getitem__(self, i):
        c = self.cells[i]
        return Entries(c, self.dtype) if isinstance(c, np.ndarray) else c


def per_state_entries(arrays, witness, groups):
    """The entries of the unbatched traced ``arrays`` (a list), read once per state of the batch
    ``witness`` (a traced state) belongs to, as :class:`Entries`.

    For a traced arm's inertial parameters in the derivative of a batched forward dynamics (the
    gradient of a batch of rollouts with respect to a shared arm: identification). Read directly,
    each parameter entry is one unbatched scalar, and in reverse mode vmap sums its cotangent over
    the batch on its own: XLA:CPU made one reduction per entry (138 in a Puma 560's stage loop) and
    fused into each of them the deep cotangent expression it sums (Newton-Euler's reverse sweep),
    evaluated again for every entry. Here the entries are put in vectors, made per state (a
    select on a predicate of the state that is never true), and read by one split each: their
    cotangents form a (batch, entries) array per vector, computed once (:func:`cotangent_once`)
    and summed over the batch by one reduction.

    ``groups``: the entries' vectors, as lists of (array index, entry index) pairs; entries in no
    group stay unread (None). Keep the vectors short: a split's cotangent is a chain of selects,
    one per entry, evaluated for each entry (k^2 selects for k entries)."""
    never = lax.stop_gradient(jnp.ravel(witness)[0]) < -jnp.inf  # false, NaN included
    cells = [np.empty(jnp.shape(x), dtype=object) for x in arrays]
    dtype = jnp.result_type(*arrays)
    for group in groups:
        flat = jnp.stack([arrays[a][index] for a, index in group]).astype(dtype)
        flat = cotangent_once(jnp.where(never, jnp.zeros((), dtype), flat), witness)
        for (a, index), part in zip(group, entries(flat)):
            cells[a][index] = part
    return [Entries(c, dtype) for c in cells]


def scalar(x):
    """A scalar parameter: a Known if it is concrete, else the tracer."""
    return Known(np.asarray(x)) if _concrete(x) else x


def _vec(a):
    if isinstance(a, Entries):
        return tuple(a.cells)
    if _concrete(a):
        return tuple(_knowns(a))
    return (a[0], a[1], a[2])


def _mat(A):
    if isinstance(A, Entries):
        return tuple(tuple(row) for row in A.cells)
    if _concrete(A):
        return tuple(tuple(row) for row in _knowns(A))
    return tuple((A[i, 0], A[i, 1], A[i, 2]) for i in range(3))


def _sym(A):
    """The six entries of a symmetric 3x3 A, off-diagonals averaged over both triangles: the same
    value for a symmetric A, and a symmetric gradient with respect to A (so a gradient step on an
    inertia tensor keeps it symmetric)."""
    if isinstance(A, Entries):
        A = A.cells
        if all(A[r, c] is A[c, r] for r, c in ((0, 1), (0, 2), (1, 2))):  # read symmetric
            return (A[0, 0], A[0, 1], A[0, 2], A[1, 1], A[1, 2], A[2, 2])
    elif _concrete(A):
        A = np.asarray(A)
        K = _knowns(0.5 * (A + A.T))
        return (K[0][0], K[0][1], K[0][2], K[1][1], K[1][2], K[2][2])
    return (A[0, 0], 0.5 * (A[0, 1] + A[1, 0]), 0.5 * (A[0, 2] + A[2, 0]), A[1, 1], 0.5 * (A[1, 2] + A[2, 1]), A[2, 2])


# --------------------------------------------------------------------------------------
# Assembling scalars into arrays


def _dtype(values, dtype):
    if dtype is not None:
        return dtype
    traced = [x for x in values if not isinstance(x, Known)]
    return jnp.result_type(*traced) if traced else jnp.result_type(float)


def entries(x, *, whole=False, stored=False):
    """The entries of a traced vector x (n,) as a list of n scalars, by one split. In reverse mode
    their cotangents are put back into one array by a chain of selects (:func:`vector`'s form), not
    by the concatenate that JAX's transpose of a split is: XLA:CPU fuses a concatenate of deep
    scalar expressions into a loop that re-derives them for every entry it writes, and the
    cotangents of a joint vector read by Newton-Euler are deep expressions (the whole reverse
    sweep). Anything else (numpy arrays, lists, None) is returned as it is: indexing it folds as
    before.

    ``whole``: on a CPU, every entry also reads the first and the last entry (it is computed as
    ``x[i] + 0 * (x[0] + x[-1])``: the same number for finite values, NaN where an end is not
    finite). Batched, x is an (B, n) array read by XLA:CPU's loop fusions one row at a time; LLVM
    vectorizes such a loop over B and loads n rows' entries at once, and where the last member of
    that access group is missing (a fusion reading entries 1..n-1 only: the first joint of the
    Puma 560 and the Panda turns about gravity, and its angle drops out of the dynamics) it runs
    the last vector's worth of rows as scalar code (LLVM's ``requiresScalarEpilogue``). At batch 16
    in float32 (8 lanes) that was half the rows: a 1000-step RK3 rollout of the Puma ran at 2.9e6
    steps/s, against 5.8e6 at batch 8. Joint angles are read this way (:func:`joint_frames`). On
    other platforms, for a single vector (a batch of one), and without ``whole``, a plain split.

    ``stored``: in reverse mode, for a single vector (not batched, nor under a ``jax.vmap``),
    the entries' cotangents are first computed into buffers of their own (:func:`_stored_scalars`,
    on a CPU), and the select chain then reads them. Where the cotangents are the reverse sweep
    of a traced arm (a rollout's gradient with respect to the arm: the joint angles' cotangents
    read every body's parameters), XLA:CPU otherwise fused the whole sweep into the chain's
    fusion, and its fusion
    emitters (a plain ``jax.jit``'s default) compiled that vector-valued fusion into code that
    took about 1.5 ms a call where the arithmetic is a few microseconds: a 200-step rollout's
    gradient with respect to a 7-joint arm took 572 ms a call, 63 ms stored (XLA's classic loop
    emitter, which :func:`jaxarm.jit` selects, was unaffected; see :func:`joint_frames`)."""
    if not isinstance(x, jax.Array) or jnp.ndim(x) != 1:
        return x
    return list(_entries_p.bind(x, whole=bool(whole), stored=bool(stored)))


def cotangent_once(x, witness=None):
    """x itself; in reverse mode its cotangent is computed once, into an array of its own.

    XLA:CPU fuses an elementwise producer into every consumer that can take it, so a deep
    cotangent (Newton-Euler's reverse sweep, read by the Runge-Kutta stage loop's several
    accumulators) is otherwise computed once per consumer. On a CPU the transpose here is the
    result of a conditional (:func:`_stored`), which XLA:CPU never fuses into its consumers, so the
    cotangent is materialized and its consumers read it (on other platforms it is the identity). Without
    differentiation and in forward mode it is the identity and costs nothing (no operation is
    emitted).

    ``witness``: a traced value the derivative is taken at and that is at hand in the reverse pass
    (the state of a forward dynamics); the conditional's predicate then reads its first entry (as
    :func:`stored_after`). Without it the predicate reads the cotangent's own first entry, and its
    fusion evaluates the whole cotangent expression for that entry, which at batch 1 is all of it:
    with the state as witness, plain reverse mode through 1000 RK3 steps got faster (see
    docs/how-it-works.md, "Stored cotangents by conditionals")."""
    # a witness that is not traced would be a constant of the program, and XLA would fold the
    # conditional away: the cotangent's own entry then
    if isinstance(witness, jax.core.Tracer) and witness.size and jnp.size(x):
        return _cotangent_once_after_p.bind(x, witness)
    return _cotangent_once_p.bind(x)


# The primitives behind entries, cotangent_once and vector(cotangent_by_split=True) (the
# documented way to give an operation its own transformation rules, ``jax.extend.core.Primitive``):
# a split, the identity and the select chain when evaluated, differing from the plain operations
# only in the programs their transposes emit.

def _zero(x):
    """A symbolic zero tangent for x (an array or an abstract value; floating point here)."""
    return ad.Zero(jax.core.ShapedArray(x.shape, x.dtype))


_entries_p = Primitive("jaxarm_entries")
_entries_p.multiple_results = True


def _entries_impl(x, whole=False, stored=False):
    n = x.shape[-1]
    if not hasattr(jax.lax, "split"):  # an older jax without lax.split: slices
        return [jax.lax.index_in_dim(x, i, axis=x.ndim - 1, keepdims=False) for i in range(n)]
    return [part.reshape(x.shape[:-1]) for part in jax.lax.split(x, (1,) * n, axis=x.ndim - 1)]


def _entries_abstract(x, whole=False, stored=False):
    return [jax.core.ShapedArray(x.shape[:-1], x.dtype, weak_type=x.weak_type)] * x.shape[-1]


def _entries_batch(args, dims, whole=False, stored=False):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)  # the entries' axis stays the last
    return _entries_p.bind(x, whole=whole, stored=stored), [0] * x.shape[-1]


def _entries_jvp(primals, tangents, whole=False, stored=False):
    (x,), (t,) = primals, tangents
    out = _entries_p.bind(x, whole=whole, stored=stored)
    if type(t) is ad.Zero:
        return out, [_zero(o) for o in out]
    return out, _entries_p.bind(t, whole=whole, stored=stored)


def _entries_transpose(cts, x, whole=False, stored=False):
    aval = x.aval
    live = [(i, c) for i, c in enumerate(cts) if type(c) is not ad.Zero]
    if not live:
        return [_zero(aval)]
    # (see entries; under a jax.vmap the primitive's batching rule is the identity)
    if stored and len(aval.shape) == 1 and len(live) > 1:
        kept = _stored_scalars_p.bind(*(jnp.asarray(c, aval.dtype) for _, c in live))
        live = [(i, c) for (i, _), c in zip(live, kept)]
    position = jax.lax.broadcasted_iota(np.int32, aval.shape, len(aval.shape) - 1)
    out = jnp.zeros(aval.shape, aval.dtype)
    for i, c in live:
        out = jnp.where(position == i, jnp.asarray(c, aval.dtype)[..., None], out)
    return [out]


def _entries_read_whole(x, whole=False, stored=False):
    """On a CPU, entries that read the vector's first and last entries as well (``whole``): each
    plus zero times their sum (see :func:`entries`). A single vector (not batched, or a batch of
    one) has no loop over the batch to vectorize: its entries are the split's."""
    parts = _entries_impl(x)
    if not whole or len(parts) < 2 or x.size == x.shape[-1]:
        return parts
    touch = jnp.zeros((), x.dtype) * (parts[0] + parts[-1])
    return [p + touch for p in parts]


_entries_p.def_impl(lambda x, whole=False, stored=False: _entries_read_whole(x, whole and jax.default_backend() == "cpu"))
_entries_p.def_abstract_eval(_entries_abstract)
mlir.register_lowering(_entries_p, mlir.lower_fun(_entries_impl, multiple_results=True))
mlir.register_lowering(_entries_p, mlir.lower_fun(_entries_read_whole, multiple_results=True), platform="cpu")
batching.primitive_batchers[_entries_p] = _entries_batch
ad.primitive_jvps[_entries_p] = _entries_jvp
ad.primitive_transposes[_entries_p] = _entries_transpose


def _stored_scalars(*values):
    """The values, each computed into a buffer of its own: the results of one conditional
    (:func:`_stored`'s, its predicate reading the first value's first entry)."""
    return _stored_all(values, values[0])


# the identity on its operands; on a CPU, in a program for one device compiled by XLA's fusion
# emitters (a plain jax.jit), lowered to _stored_scalars (elsewhere the identity: XLA:GPU forms its
# fusions differently, and a conditional there synchronizes; a partitioned program's predicate
# would be gathered from one device; XLA:CPU's classic loop emitter, which jaxarm.jit selects,
# compiled the fused form well, and the stored form ran slower there: a 200-step Panda rollout's
# whole-arm gradient 19.0 -> 27.9 ms)
_stored_scalars_p = Primitive("jaxarm_stored_scalars")
_stored_scalars_p.multiple_results = True
_stored_scalars_p.def_impl(lambda *values: list(values))
_stored_scalars_p.def_abstract_eval(lambda *values: list(values))
mlir.register_lowering(_stored_scalars_p, lambda ctx, *values: list(values))
_STORED_SCALARS = mlir.lower_fun(_stored_scalars, multiple_results=True)


def _stored_scalars_cpu(ctx, *values):
    if _one_device(ctx) and _xla.fusion_emitters_active():
        return _STORED_SCALARS(ctx, *values)
    return list(values)


mlir.register_lowering(_stored_scalars_p, _stored_scalars_cpu, platform="cpu")
# batched (a jax.vmap around the transpose, or around a loop whose transposed body holds it): the
# identity (entries' stored form is for a single vector)
batching.primitive_batchers[_stored_scalars_p] = lambda args, dims: (list(args), list(dims))
ad.primitive_jvps[_stored_scalars_p] = lambda primals, tangents: (_stored_scalars_p.bind(*primals), list(tangents))
ad.primitive_transposes[_stored_scalars_p] = lambda cts, *values: list(cts)

_cotangent_once_p = Primitive("jaxarm_cotangent_once")
_materialized_p = Primitive("jaxarm_materialized")


def _identity_jvp(p):
    def jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return p.bind(x), (t if type(t) is ad.Zero else p.bind(t))
    return jvp


def _identity_transpose(into):
    def transpose(ct, x):
        return [ct if type(ct) is ad.Zero else into.bind(ct)]
    return transpose


def _stored(x, witness=None):
    """x computed into a buffer of its own: the result of a conditional (XLA:CPU fuses no producer
    into a conditional's branches nor the branches into the conditional's consumers), whose
    predicate XLA cannot know (the first entry of ``witness``, by default x, equals itself: false
    only for a NaN, where the other branch gives x as well). The predicate reads one entry: its
    fusion evaluates x's expression at that entry only (at batch 1, that is the whole of x: a cheap
    witness, such as a step's input state, spares it). Measured against the product with the
    identity used before (a dot, which XLA:CPU does not fuse either, but which it ran at about 7 us
    for a (256, 6) x (6, 6) product): plain reverse mode through 1000 RK3 steps 10 % faster for the
    Puma at batches 16 and 256 and 4-7 % for the Panda (1 % at batch 1), compile within 0.5 s of
    before."""
    if x.size == 0:
        return x
    return _stored_all((x,), x if witness is None else witness)[0]


def _stored_all(values, witness):
    """The values (a tuple) as the results of one conditional whose predicate reads the first
    entry of ``witness`` (see :func:`_stored`)."""
    first = witness.reshape(-1)[0]
    return jax.lax.cond(first == first, lambda *v: v, lambda *v: tuple(x * jnp.ones((), x.dtype) for x in v), *values)


for _p, _into in ((_cotangent_once_p, _materialized_p), (_materialized_p, _cotangent_once_p)):
    _p.def_impl(lambda x: x)
    _p.def_abstract_eval(lambda x: x)
    mlir.register_lowering(_p, lambda ctx, x: [x])
    batching.primitive_batchers[_p] = (lambda p: lambda args, dims: (p.bind(args[0]), dims[0]))(_p)
    ad.primitive_jvps[_p] = _identity_jvp(_p)
    ad.primitive_transposes[_p] = _identity_transpose(_into)


def _dot_identity(x):
    """x as a product with the identity over its last axis, at least as a (1, n) matrix (a
    vector-matrix dot would be rewritten into a fusible reduce)."""
    n = x.shape[-1]
    eye = jnp.eye(n, dtype=x.dtype)
    return jnp.dot(x.reshape(-1, n), eye, precision=jax.lax.Precision.HIGHEST).reshape(x.shape)


_STORED = mlir.lower_fun(_stored, multiple_results=False)
_DOT_IDENTITY = mlir.lower_fun(_dot_identity, multiple_results=False)


def _materialized_cpu(ctx, x):
    """On a CPU: stored by a conditional (:func:`_stored`) in a program for one device; in a
    program partitioned over several (``jax.sharding``), whose conditional's predicate would be
    gathered from the device holding the first entry at every use, by a product with the
    identity, which each device computes on its own part."""
    return (_STORED if _one_device(ctx) else _DOT_IDENTITY)(ctx, x)


def _one_device(ctx):
    """Whether the program being lowered runs on one device (not partitioned by ``jax.sharding``)."""
    return getattr(ctx.module_context.axis_context, "num_devices", None) == 1


# on a CPU the materialized cotangent is stored (_materialized_cpu); elsewhere (GPU, TPU) it is x
# itself: XLA:GPU forms its fusions differently, and a conditional there synchronizes
mlir.register_lowering(_materialized_p, _materialized_cpu, platform="cpu")


def vector(values, dtype=None, *, cotangent_by_split=False):
    """Stack n scalars into an (n,) array as a chain of selects on a constant mask (Knowns become
    constants of ``dtype``, by default that of the other values).

    Measured on XLA:CPU (batched under vmap): ``jnp.stack`` of a few deep scalar expressions is
    fused into one loop whose per-element code re-derives every shared subexpression (orders of
    magnitude slower than the arithmetic, and slow to compile); the select chain keeps one fused
    loop that evaluates the recursion once per state.

    ``cotangent_by_split``: in reverse mode, read the scalars' cotangents from the array's by one
    split (a primitive whose transpose is :func:`entries`), instead of the select chain's own
    transpose, a select and a sum per entry. For a vector whose cotangent arrives as an array of
    its own (forward dynamics' tangent, whose cotangent comes from the Runge-Kutta stage loop):
    XLA:CPU fused each of those sums with the scalar arithmetic after it and evaluated that once
    per entry summed. Where the cotangent is itself a deep expression (a traced arm's Newton-Euler),
    the n reads of a split pull it into n fusions instead (the Panda's mass gradient: 60.8k ->
    86.7k lines of optimized HLO), so the plain select chain stays the default.
    """
    dtype = _dtype(values, dtype)
    values = [jnp.asarray(materialize(x, dtype), dtype) for x in values]
    if not cotangent_by_split or any(jnp.ndim(v) for v in values):
        return _select_chain(values)
    return _vector_p.bind(*values)


def _select_chain(values):
    n = len(values)
    out = values[-1][..., None] * jnp.ones(n, values[-1].dtype)
    for j in range(n - 1):
        mask = np.zeros(n, dtype=bool)
        mask[j] = True
        out = jnp.where(mask, values[j][..., None], out)
    return out


# vector(cotangent_by_split=True)'s primitive: the select chain when evaluated; in reverse mode
# the cotangents of the scalars are the entries of the array's cotangent, read by one split.
_vector_p = Primitive("jaxarm_vector")


def _vector_abstract(*values):
    v = values[0]
    return jax.core.ShapedArray(v.shape + (len(values),), v.dtype, weak_type=v.weak_type)


def _vector_batch(args, dims):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size,) + a.shape)
            for a, d in zip(args, dims)]
    return _vector_p.bind(*args), 0


def _vector_jvp(primals, tangents):
    out = _vector_p.bind(*primals)
    if all(type(t) is ad.Zero for t in tangents):
        return out, _zero(out)
    return out, _vector_p.bind(*(ad.instantiate_zeros(t) for t in tangents))


def _vector_transpose(ct, *values):
    if type(ct) is ad.Zero:
        return [_zero(v.aval) if ad.is_undefined_primal(v) else None for v in values]
    parts = _entries_p.bind(ct, whole=False)
    return [part if ad.is_undefined_primal(v) else None for part, v in zip(parts, values)]


_vector_p.def_impl(lambda *values: _select_chain(list(values)))
_vector_p.def_abstract_eval(_vector_abstract)
mlir.register_lowering(_vector_p, mlir.lower_fun(lambda *values: _select_chain(list(values)), multiple_results=False))
batching.primitive_batchers[_vector_p] = _vector_batch
ad.primitive_jvps[_vector_p] = _vector_jvp
ad.primitive_transposes[_vector_p] = _vector_transpose


def matrix(rows, dtype=None):
    """Stack an n x m nested list of scalars into an (n, m) array.

    A stack of more than eight operands is not fused with its producers by XLA:CPU (they
    become separate loops and the stack a copy), which is fast for the mass matrix's entries;
    fewer go through :func:`vector`.
    """
    n, m = len(rows), len(rows[0])
    flat = [x for r in rows for x in r]
    dtype = _dtype(flat, dtype)
    if n * m <= 8:
        return vector(flat, dtype).reshape(n, m)
    return jnp.stack([jnp.asarray(materialize(x, dtype), dtype) for x in flat]).reshape(n, m)


_stored_after_p = Primitive("jaxarm_stored_after")
_stored_after_p.def_impl(lambda x, witness: x)
_stored_after_p.def_abstract_eval(lambda x, witness: x)
mlir.register_lowering(_stored_after_p, lambda ctx, x, witness: [x])
_STORED_AFTER = mlir.lower_fun(_stored, multiple_results=False)
_DOT_IDENTITY_OF_FIRST = mlir.lower_fun(lambda x, witness: _dot_identity(x), multiple_results=False)


def _stored_after_cpu(ctx, x, witness):
    """As :func:`_materialized_cpu`: the conditional (its predicate read from the witness) in a
    program for one device, the product with the identity in one partitioned over several."""
    return (_STORED_AFTER if _one_device(ctx) else _DOT_IDENTITY_OF_FIRST)(ctx, x, witness)


mlir.register_lowering(_stored_after_p, _stored_after_cpu, platform="cpu")


def _stored_after_batch(args, dims):
    (x, witness), (dx, dw) = args, dims
    if dx is None:
        x, dx = jnp.broadcast_to(x, (witness.shape[dw],) + x.shape), 0
    return _stored_after_p.bind(jnp.moveaxis(x, dx, 0), witness), 0


def _stored_after_jvp(primals, tangents):
    (x, witness), (t, _) = primals, tangents
    return _stored_after_p.bind(x, witness), (t if type(t) is ad.Zero else _cotangent_once_p.bind(t))


batching.primitive_batchers[_stored_after_p] = _stored_after_batch
ad.primitive_jvps[_stored_after_p] = _stored_after_jvp


# cotangent_once with a witness: the identity; its transpose stores the cotangent by the
# conditional of stored_after, whose predicate reads the witness
_cotangent_once_after_p = Primitive("jaxarm_cotangent_once_after")
_cotangent_once_after_p.def_impl(lambda x, witness: x)
_cotangent_once_after_p.def_abstract_eval(lambda x, witness: x)
mlir.register_lowering(_cotangent_once_after_p, lambda ctx, x, witness: [x])


def _cotangent_once_after_batch(args, dims):
    (x, witness), (dx, _) = args, dims
    if dx is None:
        return _cotangent_once_after_p.bind(x, witness), None
    return _cotangent_once_after_p.bind(jnp.moveaxis(x, dx, 0), witness), 0


def _cotangent_once_after_jvp(primals, tangents):
    (x, witness), (t, _) = primals, tangents
    return _cotangent_once_after_p.bind(x, witness), (t if type(t) is ad.Zero else _cotangent_once_after_p.bind(t, witness))


def _cotangent_once_after_transpose(ct, x, witness):
    if type(ct) is ad.Zero:
        return [_zero(x.aval), None]
    return [_stored_after_p.bind(ct, witness), None]


batching.primitive_batchers[_cotangent_once_after_p] = _cotangent_once_after_batch
ad.primitive_jvps[_cotangent_once_after_p] = _cotangent_once_after_jvp
ad.primitive_transposes[_cotangent_once_after_p] = _cotangent_once_after_transpose


def stored_after(x, witness):
    """x itself, computed into a buffer of its own on a CPU: XLA:CPU then evaluates x once and its
    consumers read it, instead of fusing x's expression into each of them (a Runge-Kutta stage's
    acceleration is read by the next stages and the step's sum: written out, each stage's
    forward dynamics was otherwise compiled into every fusion downstream, and a 1000-step RK3
    rollout of the Puma 560 at batch 16 took 15 ms instead of 5). ``witness``: a value available
    before x and cheap to read (a step's input state); its first entry is the predicate of the
    conditional that stores x. In reverse mode the cotangent is stored likewise
    (:func:`cotangent_once`). On other platforms (GPU, TPU) x itself: XLA:GPU forms its fusions
    differently, and a conditional there synchronizes with the host."""
    x, witness = jnp.asarray(x), jnp.asarray(witness)
    if x.size == 0 or witness.size == 0:
        return x
    return _stored_after_p.bind(x, witness)


# --------------------------------------------------------------------------------------
# clips that store one array in reverse mode
# jax differentiates jnp.clip as minimum(maximum(x, lo), hi) and keeps, for the reverse pass, the
# weights of the maximum and of the minimum apart. Inside a rollout's time loop XLA:CPU writes
# each stored array into its own (steps, batch, n) buffer, one kernel per step, so at small
# batches their number costs more than their size. The rule below keeps one weight and gives
# jax's derivative to the last bit, ties (a value exactly on a limit) included.


def is_symbolic_zero(t) -> bool:
    """Whether a custom JVP rule defined with ``symbolic_zeros=True`` got no tangent here."""
    return isinstance(t, jax.custom_derivatives.SymbolicZero)


def instantiated(primal, tangent):
    """The tangent as an array: zeros of the primal's shape and dtype for a symbolic zero."""
    return jnp.zeros_like(primal) if is_symbolic_zero(tangent) else tangent


def clip_weight(x, lo, hi):
    """d clip(x, lo, hi) / dx exactly as jax differentiates ``jnp.clip`` (``minimum(maximum(x, lo),
    hi)``, whose derivative splits a tie evenly): 1 inside, 0 outside, 1/2 where x equals a bound.
    ``lo`` and ``hi`` broadcast against x's trailing axes."""
    lo, hi = (lax.broadcast_in_dim(jnp.asarray(b, x.dtype), x.shape, tuple(range(x.ndim - jnp.ndim(b), x.ndim)))
              for b in (lo, hi))
    one, half, zero = (jnp.full(x.shape, v, x.dtype) for v in (1.0, 0.5, 0.0))
    m = lax.max(x, lo)
    w_lo = lax.select(lax.gt(x, lo), one, lax.select(lax.eq(x, lo), half, zero))
    w_hi = lax.select(lax.lt(m, hi), one, lax.select(lax.eq(m, hi), half, zero))
    return lax.mul(w_lo, w_hi)


def saturated_plain(u, limit):
    """``clip(u, -limit, limit)`` as jax differentiates it by its own rules."""
    return jnp.clip(u, -limit, limit)


@jax.custom_jvp
def saturated(u, limit):
    """``clip(u, -limit, limit)`` for u and limit of one dtype, limit broadcasting against u's
    trailing axes: the input clip of the drives (joint torques at their limits, motor voltages at
    the drives' voltage limits). In reverse mode one stored array (the clip's weight); where the
    limit itself is differentiated, jax's own rules."""
    return saturated_plain(u, limit)


def _saturated_jvp(primals, tangents):
    u, limit = primals
    tu, tlim = tangents
    if not is_symbolic_zero(tlim):  # differentiated limits: jax's own rules
        return jax.jvp(saturated_plain, primals, tuple(map(instantiated, primals, tangents)))
    return saturated(u, limit), clip_weight(u, -limit, limit) * instantiated(u, tu)


saturated.defjvp(_saturated_jvp, symbolic_zeros=True)

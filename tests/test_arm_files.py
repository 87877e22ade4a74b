"""Arm files (Swartz's Manipulator Database as TOML): every error path names file, joint and
field on one line; save -> load is bit-exact; save is atomic; consistency warnings."""

import os
import textwrap
import warnings

import jax
import numpy as np
import pytest

from jaxarm import arm_files
from jaxarm.arm import make_arm, stack_arms
from jaxarm.arm_files import (
    MOTOR_FIELDS,
    ArmFileError,
    PhysicalConsistencyWarning,
    arm_from_toml,
    arm_to_toml,
    bundled_arms,
    load_arm,
    save_arm,
)

GOOD = """\
name = "tiny"
convention = "standard"
gravity = [0.0, 0.0, -9.81]

[[joint]]
type = "revolute"
a = 0.3
alpha = 1.5707963267948966
d = 0.1
theta = 0.0
mass = 2.0
com = [-0.1, 0.0, 0.0]
inertia = [0.01, 0.02, 0.02]

[[joint]]
type = "revolute"
a = 0.25
alpha = 0.0
d = 0.0
theta = 0.0
mass = 1.0
com = [-0.1, 0.0, 0.0]
inertia = [0.005, 0.01, 0.01]
"""


def write(tmp_path, text, name="bad_arm.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def assert_leaves_identical(a, b):
    """Every leaf equal (np.array_equal) and bit-identical, static fields equal."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True)
        assert x.tobytes() == y.tobytes()


def test_good_file_loads(tmp_path):
    arm = load_arm(write(tmp_path, GOOD, "tiny.toml"))
    assert arm.n == 2 and arm.name == "tiny" and arm.convention == "standard"
    np.testing.assert_array_equal(arm.links.inertia[1], np.diag([0.005, 0.01, 0.01]))
    assert np.all(arm.drives.gear_ratio == 1) and np.all(np.isinf(arm.limits.torque))


def test_name_defaults_to_file_stem(tmp_path):
    arm = load_arm(write(tmp_path, GOOD.replace('name = "tiny"\n', ""), "my_arm.toml"))
    assert arm.name == "my_arm"


# ---------------------------------------------------------------------------------------------
# Error paths: each bad file must give one line naming the file, the joint (or top-level field)
# and the field.

J2 = GOOD.index("[[joint]]", GOOD.index("[[joint]]") + 1)  # start of joint 2


def joint2(old, new):
    """GOOD with `old` replaced by `new` inside joint 2 only."""
    head, tail = GOOD[:J2], GOOD[J2:]
    assert old in tail
    return head + tail.replace(old, new, 1)


BAD_FILES = {
    "unknown top-level field": (GOOD.replace("gravity", 'colour = "red"\ngravity'), ["colour", "unknown top-level field", "convention"]),
    "unknown joint field": (joint2("mass = 1.0", "mass = 1.0\nmas = 1.0"), ["joint 2", "mas:", "unknown field", "inertia"]),
    "unknown motor field": (GOOD + "\n[joint.motor]\ngear = 2.0\n", ["joint 2", "motor.gear", "gear_ratio"]),
    "unknown limits field": (GOOD + "\n[joint.limits]\nspeed = 2.0\n", ["joint 2", "limits.speed", "velocity"]),
    "wrong length com": (joint2("com = [-0.1, 0.0, 0.0]", "com = [-0.1, 0.0]"), ["joint 2", "com", "3 numbers"]),
    "negative mass": (joint2("mass = 1.0", "mass = -1.0"), ["joint 2", "mass", "non-negative"]),
    "non-symmetric inertia": (
        joint2("inertia = [0.005, 0.01, 0.01]", "inertia = [[0.005, 0.001, 0.0], [0.0, 0.01, 0.0], [0.0, 0.0, 0.01]]"),
        ["joint 2", "inertia", "symmetric"],
    ),
    "inertia wrong length": (joint2("inertia = [0.005, 0.01, 0.01]", "inertia = [0.005, 0.01, 0.01, 0.0]"), ["joint 2", "inertia", "6 values"]),
    "unknown joint type": (joint2('type = "revolute"', 'type = "spherical"'), ["joint 2", "type", "'revolute' or 'prismatic'"]),
    "missing joint type": (joint2('type = "revolute"\n', ""), ["joint 2", "type", "missing"]),
    "missing DH value": (joint2("alpha = 0.0\n", ""), ["joint 2", "alpha", "missing", "a, alpha, d, theta"]),
    "non-number value": (joint2("d = 0.0", 'd = "0.0"'), ["joint 2", "d:", "expected a number"]),
    "infinite DH value": (joint2("d = 0.0", "d = inf"), ["joint 2", "d:", "finite"]),
    "nan mass": (joint2("mass = 1.0", "mass = nan"), ["joint 2", "mass", "finite"]),
    "infinite motor value": (GOOD + "\n[joint.motor]\nrotor_inertia = inf\n", ["joint 2", "motor.rotor_inertia", "finite"]),
    "boolean value": (joint2("mass = 1.0", "mass = true"), ["joint 2", "mass", "expected a number"]),
    "non-number in a vector": (joint2("com = [-0.1, 0.0, 0.0]", 'com = [-0.1, "x", 0.0]'), ["joint 2", "com[1]", "expected a number"]),
    "TOML syntax error": (GOOD.replace("d = 0.1", "d = = 0.1"), ["TOML syntax error", "line 9"]),
    "empty joint list": (GOOD[: GOOD.index("[[joint]]")], ["joint", "at least one [[joint]]"]),
    "joint not tables": (GOOD[: GOOD.index("[[joint]]")].replace("gravity", "joint = 3\ngravity"), ["joint", "array of [[joint]] tables"]),
    "parts and mass": (
        joint2("mass = 1.0", 'mass = 1.0\nparts = [{ shape = "sphere", radius = 0.05, mass = 1.0 }]'),
        ["joint 2", "parts", "not both", "mass"],
    ),
    "bad part": (
        joint2("mass = 1.0\ncom = [-0.1, 0.0, 0.0]\ninertia = [0.005, 0.01, 0.01]", 'parts = [{ shape = "sphere", radius = -0.05, mass = 1.0 }]'),
        ["joint 2", "parts[0]", "radius"],
    ),
    "unknown convention": (GOOD.replace('"standard"', '"craig"'), ["convention", "'modified'"]),
    "missing convention": (GOOD.replace('convention = "standard"\n', ""), ["convention", "missing"]),
    "gravity wrong length": (GOOD.replace("[0.0, 0.0, -9.81]", "[0.0, -9.81]"), ["gravity", "3 numbers"]),
    "name not a string": (GOOD.replace('"tiny"', "7"), ["name", "string"]),
    "limits not a table": (joint2("mass = 1.0", "limits = 3\nmass = 1.0"), ["joint 2", "limits", "table"]),
    "limits reversed": (GOOD + "\n[joint.limits]\nposition = [1.0, -1.0]\n", ["joint 2", "limits.position", "lower < upper"]),
    "limits position length": (GOOD + "\n[joint.limits]\nposition = [1.0]\n", ["joint 2", "limits.position", "2 numbers"]),
    "coulomb wrong length": (GOOD + "\n[joint.motor]\ncoulomb_friction = [0.1, -0.1, 0.0]\n", ["joint 2", "motor.coulomb_friction", "2 numbers"]),
    "negative resistance": (GOOD + "\n[joint.motor]\nresistance = -2.0\n", ["joint 2", "resistance", ">= 0"]),
    "zero gear ratio": (GOOD + "\n[joint.motor]\ngear_ratio = 0\n", ["joint 2", "gear_ratio", "non-zero"]),
    "base not rigid": (GOOD.replace("gravity", "base = [[2.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]\ngravity"), ["base", "rigid"]),
    "base wrong shape": (GOOD.replace("gravity", "base = [[1.0, 0, 0], [0, 1, 0], [0, 0, 1]]\ngravity"), ["base", "4x4"]),
    "tool unknown key": (GOOD.replace("gravity", "tool = { xyzz = [0, 0, 1] }\ngravity"), ["tool.xyzz", "xyz, rpy"]),
    "payload negative mass": (GOOD.replace("\n[[joint]]", "\n[payload]\nmass = -1.0\n\n[[joint]]", 1), ["payload.mass", "non-negative"]),
    "payload unknown field": (GOOD.replace("\n[[joint]]", "\n[payload]\nweight = 1.0\n\n[[joint]]", 1), ["payload.weight", "mass, com, inertia"]),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_error_names_file_joint_and_field(tmp_path, case):
    text, needles = BAD_FILES[case]
    path = write(tmp_path, text)
    with pytest.raises(ArmFileError) as info:
        load_arm(path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert path.name in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


PLACEMENT = """\
convention = "placement"

[[joint]]
type = "revolute"
xyz = [0.0, 0.0, 0.3]
rpy = [0.0, 0.0, 0.0]
axis = [0.0, 0.0, 1.0]
mass = 1.0

[[joint]]
type = "prismatic"
xyz = [0.2, 0.0, 0.0]
rpy = [0.0, 0.0, 0.0]
axis = [1.0, 0.0, 0.0]
mass = 0.5
"""


@pytest.mark.parametrize(
    "old, new, needles",
    [
        ("axis = [1.0, 0.0, 0.0]", "axis = [1.0, 1.0, 0.0]", ["joint 2", "axis", "unit"]),
        ("axis = [1.0, 0.0, 0.0]", "axis = [1.0, 0.0, 0.0]\nalpha = 0.0", ["joint 2", "alpha", "unknown field", "'placement'", "xyz, rpy, axis"]),
        ("rpy = [0.0, 0.0, 0.0]\naxis = [1.0", "axis = [1.0", ["joint 2", "rpy", "missing"]),
    ],
)
def test_placement_errors(tmp_path, old, new, needles):
    head, tail = PLACEMENT.split('type = "prismatic"')
    path = write(tmp_path, head + 'type = "prismatic"' + tail.replace(old, new, 1))
    with pytest.raises(ArmFileError) as info:
        load_arm(path)
    msg = str(info.value)
    assert path.name in msg and "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_missing_file_and_unknown_bundled_name(tmp_path):
    with pytest.raises(ArmFileError, match="no such file"):
        load_arm(tmp_path / "nope.toml")
    with pytest.raises(ArmFileError) as info:
        load_arm("no_such_arm")
    assert "no_such_arm" in str(info.value) and "puma560" in str(info.value)  # lists the bundled arms


def test_bundled_names():
    assert {"two_link_planar", "rp_arm", "puma560", "stanford_arm", "panda", "cmu_dd_arm"} <= set(bundled_arms())


def test_arm_from_toml_uses_where():
    with pytest.raises(ArmFileError, match=r"^<mine>: joint 2: mass"):
        arm_from_toml(joint2("mass = 1.0", "mass = -1.0"), where="<mine>")


# ---------------------------------------------------------------------------------------------
# Alternative spellings


def test_inertia_forms_agree(tmp_path):
    I = np.array([[0.02, -0.001, 0.002], [-0.001, 0.03, 0.0005], [0.002, 0.0005, 0.025]])
    six = f"[{I[0, 0]}, {I[0, 1]}, {I[0, 2]}, {I[1, 1]}, {I[1, 2]}, {I[2, 2]}]"
    full = "[" + ", ".join("[" + ", ".join(repr(float(v)) for v in row) + "]" for row in I) + "]"
    a = load_arm(write(tmp_path, joint2("inertia = [0.005, 0.01, 0.01]", f"inertia = {six}"), "six.toml"))
    b = load_arm(write(tmp_path, joint2("inertia = [0.005, 0.01, 0.01]", f"inertia = {full}"), "full.toml"))
    assert_leaves_identical(a, b)
    np.testing.assert_array_equal(a.links.inertia[1], I)


def test_integers_symmetric_coulomb_and_transform_table(tmp_path):
    text = GOOD.replace("gravity", "tool = { xyz = [0, 0, 0.1], rpy = [0, 0, 1.5707963267948966] }\ngravity")
    text = text.replace("mass = 2.0", "mass = 2") + "\n[joint.motor]\ncoulomb_friction = 0.3\ngear_ratio = -50\n"
    arm = load_arm(write(tmp_path, text, "alt.toml"))
    np.testing.assert_array_equal(arm.drives.coulomb_friction, [[0.0, 0.0], [0.3, -0.3]])
    np.testing.assert_array_equal(arm.drives.gear_ratio, [1.0, -50.0])
    assert arm.links.mass.dtype == np.float64 and arm.links.mass[0] == 2.0
    np.testing.assert_allclose(arm.tool[:3, 3], [0, 0, 0.1])
    np.testing.assert_allclose(arm.tool[:3, 0], [0, 1, 0], atol=1e-15)


def test_parts_build_the_link(tmp_path):
    text = joint2(
        "mass = 1.0\ncom = [-0.1, 0.0, 0.0]\ninertia = [0.005, 0.01, 0.01]",
        'parts = [{ shape = "sphere", radius = 0.05, mass = 1.0, xyz = [-0.1, 0.0, 0.0] },\n'
        '         { shape = "sphere", radius = 0.05, mass = 1.0, xyz = [0.1, 0.0, 0.0] }]',
    )
    arm = load_arm(write(tmp_path, text, "parts.toml"))
    assert arm.links.mass[1] == 2.0
    np.testing.assert_allclose(arm.links.com[1], 0.0, atol=1e-15)
    i_ball = 2 / 5 * 0.05**2
    np.testing.assert_allclose(np.diag(arm.links.inertia[1]), [2 * i_ball, 2 * (i_ball + 0.01), 2 * (i_ball + 0.01)])


# ---------------------------------------------------------------------------------------------
# Physical consistency


def test_inconsistent_link_warns_and_strict_raises(tmp_path):
    # principal moments (0.001, 0.01, 0.02): 0.001 + 0.01 < 0.02
    path = write(tmp_path, joint2("inertia = [0.005, 0.01, 0.01]", "inertia = [0.001, 0.01, 0.02]"), "incons.toml")
    with pytest.warns(PhysicalConsistencyWarning) as record:
        load_arm(path)
    assert len(record) == 1
    msg = str(record[0].message)
    assert path.name in msg and "joint 2" in msg and "triangle" in msg
    assert record[0].filename == __file__  # the warning points at the caller
    with pytest.raises(ArmFileError, match=r"joint 2: physically inconsistent.*strict=True"):
        load_arm(path, strict=True)


def test_massless_link_is_not_reported(tmp_path):
    text = joint2("mass = 1.0\ncom = [-0.1, 0.0, 0.0]\ninertia = [0.005, 0.01, 0.01]", "")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arm = load_arm(write(tmp_path, text, "massless.toml"), strict=True)
    assert arm.links.mass[1] == 0.0


def test_inconsistent_payload_warns(tmp_path):
    text = GOOD.replace("\n[[joint]]", "\n[payload]\nmass = 1.0\ninertia = [0.001, 0.001, 0.01]\n\n[[joint]]", 1)
    with pytest.warns(PhysicalConsistencyWarning, match="payload"):
        arm = load_arm(write(tmp_path, text, "payload.toml"))
    assert float(arm.payload.mass) == 1.0


# ---------------------------------------------------------------------------------------------
# Saving


def rich_arm():
    """An arm that uses every writable field, awkward floats included."""
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 3))
    S = A @ A.T / 10  # second moments of some mass distribution...
    I = np.trace(S) * np.eye(3) - S  # ...so a consistent inertia with off-diagonal terms
    base = np.eye(4)
    c, s = np.cos(0.3), np.sin(0.3)
    base[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    base[:3, 3] = [0.1, -0.2, 0.05]
    extra = {}
    if "sigmoid_friction" in MOTOR_FIELDS:
        extra["sigmoid_friction"] = [[0.5, 5.1, 0.04], [0.0, 0.0, 0.0], [0.3, 17.1, -0.02]]
    if "static_friction" in MOTOR_FIELDS and "stribeck_velocity" in MOTOR_FIELDS:
        extra["static_friction"] = [0.0, 0.4, 0.0]
        extra["stribeck_velocity"] = [0.0, 0.05, 0.0]
    arm = make_arm(
        ["revolute", "prismatic", "revolute"],
        convention="placement",
        xyz=[[0, 0, 0.333], [0.1, -0.0, 1e-300], [0.0, 0.2, 0.3]],
        rpy=[[0, 0, 0], [np.pi / 2, 0.1, -0.2], [0, -np.pi / 3, 0]],
        axis=[[0, 0, 1], [1, 0, 0], [0, np.sqrt(0.5), np.sqrt(0.5)]],
        mass=[1.0 / 3.0, 2.5, 0.0],
        com=[[0.1, 0.2, -0.3], [0, 0, 0.1], [0, 0, 0]],
        inertia=np.stack([I, np.diag([0.01, 0.02, 0.03]), np.zeros((3, 3))]),
        gear_ratio=[-62.6111, 1.0, 100.0],
        rotor_inertia=[2e-4, 0.0, 3.3e-5],
        viscous_friction=[1.48e-3, 0.0, 7e-5],
        coulomb_friction=[[0.395, -0.435], [0.2, -0.2], [0.0, 0.0]],
        torque_constant=[0.2, 0.0, 1.5],
        resistance=[1.6, 0.0, 4.0],
        voltage_limit=[40.0, np.inf, 24.0],
        position_limits=[[-2.8, 2.8], [-np.inf, 0.5], [-np.inf, np.inf]],
        velocity_limits=[2.175, np.inf, 1.7976931348623157e308],
        torque_limits=[87.0, 12.0, np.inf],
        gravity=(0.0, -0.0, -9.80665),
        base=base,
        tool=np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0.107], [0, 0, 0, 1.0]]),
        name='weird "name" \\ with ünïcode, \t tab, \x7f del and \U0001F916',
        **extra,
    )
    return arm.with_payload(0.7, com=(0.0, 0.01, 0.05), inertia=[[1e-3, 1e-5, 0], [1e-5, 2e-3, 0], [0, 0, 1.5e-3]])


def test_rich_arm_round_trips_bit_exactly(tmp_path):
    arm = rich_arm()
    path = save_arm(arm, tmp_path / "rich.toml", comment="written by the test\nsecond line\x0c")
    text = path.read_text()
    assert text.startswith("# written by the test\n# second line\n")
    assert "-0.0" in text and "inf" in text  # signed zero and infinities survive as TOML floats
    assert_leaves_identical(load_arm(path), arm)


def test_save_writes_only_non_defaults(tmp_path):
    arm = load_arm(write(tmp_path, GOOD, "tiny.toml"))
    text = arm_to_toml(arm)
    for absent in ("[joint.motor]", "[joint.limits]", "[payload]", "base", "tool"):
        assert absent not in text
    for present in ('name = "tiny"', 'convention = "standard"', "gravity = [0.0, 0.0, -9.81]", "inertia = [0.005, 0.01, 0.01]"):
        assert present in text
    assert text.count("[[joint]]") == 2 and text.count("theta = 0.0") == 2


def test_save_refuses_batched_arm(tmp_path):
    arm = load_arm(write(tmp_path, GOOD, "tiny.toml"))
    batch = stack_arms([arm, arm])
    with pytest.raises(ArmFileError, match="batch axis"):
        save_arm(batch, tmp_path / "batch.toml")
    assert not (tmp_path / "batch.toml").exists()


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_save_is_atomic(tmp_path, monkeypatch, failing):
    target = tmp_path / "arm.toml"
    target.write_text("old contents\n")
    arm = load_arm(write(tmp_path, GOOD, "src.toml"))
    (tmp_path / "src.toml").unlink()

    def boom(*args, **kwargs):
        raise OSError(f"simulated {failing} failure")

    monkeypatch.setattr(arm_files.os, failing, boom)
    with pytest.raises(OSError, match="simulated"):
        save_arm(arm, target)
    monkeypatch.undo()
    assert target.read_text() == "old contents\n"
    assert os.listdir(tmp_path) == ["arm.toml"]  # no temporary file left behind
    save_arm(arm, target)  # and a normal save still works
    assert_leaves_identical(load_arm(target), arm)
    assert sorted(os.listdir(tmp_path)) == ["arm.toml"]


def test_save_keeps_file_mode(tmp_path):
    arm = load_arm(write(tmp_path, GOOD, "tiny.toml"))
    target = tmp_path / "moded.toml"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    save_arm(arm, target)
    assert os.stat(target).st_mode & 0o777 == 0o640
    fresh = save_arm(arm, tmp_path / "fresh.toml")
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(fresh).st_mode & 0o777 == 0o666 & ~mask


def test_write_atomic_writer_failure_and_mode(tmp_path):
    """The figure/binary path of the atomic writer: a writer failing half-way leaves the old file
    and no temporary file; a new file gets the umask's mode, not mkstemp's 0600."""
    target = tmp_path / "plot.png"
    target.write_bytes(b"old figure")

    def half_then_fail(handle):
        handle.write(b"partial")
        raise RuntimeError("renderer crashed")

    with pytest.raises(RuntimeError, match="renderer crashed"):
        arm_files.write_atomic(target, half_then_fail)
    assert target.read_bytes() == b"old figure"
    assert os.listdir(tmp_path) == ["plot.png"]
    fresh = arm_files.write_atomic(tmp_path / "new.png", lambda f: f.write(b"\x89PNG"))
    assert fresh.read_bytes() == b"\x89PNG"
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(fresh).st_mode & 0o777 == 0o666 & ~mask

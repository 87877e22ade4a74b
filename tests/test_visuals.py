"""URDF visual geometry for drawing (jaxarm.model.visuals) and the 3-D page that draws it.

Checks: the STL (binary and ASCII) and OBJ readers against a mesh written here; vertex clustering
keeps the shape within its grid cell and respects the triangle budget; a visual placed on a
welded link lands where the arm's own tool frame (read by load_urdf through the same fixed joints)
says; package:// names resolve in the folders above the file; and a real headless browser draws
every triangle of the UR5's meshes, on the screenshot.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

import jaxarm
from jaxarm.cli import main
from jaxarm.cli.viewer import html_view
from jaxarm.model.visuals import read_mesh, simplify, urdf_visuals

TETRA_V = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
TETRA_F = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]])


def _binary_stl(v, f):
    out = bytearray(b"\0" * 80) + struct.pack("<I", len(f))
    for tri in f:
        out += struct.pack("<3f", 0, 0, 0) + struct.pack("<9f", *v[tri].reshape(-1)) + b"\0\0"
    return bytes(out)


def _ascii_stl(v, f):
    lines = ["solid t"]
    for tri in f:
        lines += ["facet normal 0 0 0", "outer loop"] + [f"vertex {a} {b} {c}" for a, b, c in v[tri]] + ["endloop", "endfacet"]
    return "\n".join(lines + ["endsolid t"])


def test_mesh_readers(tmp_path):
    (tmp_path / "b.stl").write_bytes(_binary_stl(TETRA_V, TETRA_F))
    (tmp_path / "a.stl").write_text(_ascii_stl(TETRA_V, TETRA_F))
    (tmp_path / "t.obj").write_text("\n".join([f"v {a} {b} {c}" for a, b, c in TETRA_V] + ["f 1/1 3/1 2/1", "f 1 2 4", "f 1 4 3", "f 2 3 4"]))
    for name in ("b.stl", "a.stl", "t.obj"):
        v, f = read_mesh(tmp_path / name)
        np.testing.assert_allclose(v[f], TETRA_V[TETRA_F], err_msg=name)
    # COLLADA: millimetres, y up, a node that moves the geometry by (10, 0, 0) mm; one triangle list
    # with normals interleaved (stride 2) and one polygon list with a quad split into a fan
    pos = " ".join(f"{x:g}" for x in (1000 * TETRA_V).reshape(-1))
    tri = " ".join(f"{i} 0" for i in TETRA_F[:2].reshape(-1))
    dae = f"""<?xml version="1.0"?><COLLADA xmlns="http://www.collada.org/2005/11/COLLADASchema" version="1.4.1">
      <asset><unit name="millimeter" meter="0.001"/><up_axis>Y_UP</up_axis></asset>
      <library_geometries><geometry id="g"><mesh>
        <source id="p"><float_array id="pa" count="12">{pos}</float_array></source>
        <source id="n"><float_array id="na" count="3">0 0 1</float_array></source>
        <vertices id="v"><input semantic="POSITION" source="#p"/></vertices>
        <triangles count="2"><input semantic="VERTEX" source="#v" offset="0"/><input semantic="NORMAL" source="#n" offset="1"/><p>{tri}</p></triangles>
        <polylist count="1"><input semantic="VERTEX" source="#v" offset="0"/><vcount>4</vcount><p>0 3 2 1</p></polylist>
      </mesh></geometry></library_geometries>
      <library_visual_scenes><visual_scene id="s"><node id="a"><translate>10 0 0</translate>
        <instance_geometry url="#g"/></node></visual_scene></library_visual_scenes></COLLADA>"""
    (tmp_path / "t.dae").write_text(dae)
    v, f = read_mesh(tmp_path / "t.dae")
    y_up_to_z_up = np.array([[1.0, 0, 0], [0, 0, -1.0], [0, 1.0, 0]])  # (x, y, z) -> (x, -z, y)
    expected = np.concatenate([TETRA_V[TETRA_F[:2]], TETRA_V[[[0, 3, 2], [0, 2, 1]]]]) + [0.01, 0, 0]
    np.testing.assert_allclose(v[f], expected @ y_up_to_z_up.T, atol=1e-12)
    (tmp_path / "x.ply").write_text("ply")
    with pytest.raises(ValueError, match=r"x.ply: mesh format .ply is not read \(STL, OBJ or COLLADA\)"):
        read_mesh(tmp_path / "x.ply")
    (tmp_path / "x.dae").write_text("<COLLADA/>")
    with pytest.raises(ValueError, match="x.dae: cannot read the mesh: no triangles"):
        read_mesh(tmp_path / "x.dae")
    (tmp_path / "bad.stl").write_text("nothing here")
    with pytest.raises(ValueError, match="bad.stl: cannot read the mesh"):
        read_mesh(tmp_path / "bad.stl")


def test_simplify_keeps_the_shape_within_the_budget():
    # a finely tessellated sphere: 20k triangles
    th, ph = np.meshgrid(np.linspace(0.01, np.pi - 0.01, 100), np.linspace(0, 2 * np.pi, 101)[:-1], indexing="ij")
    v = np.stack([np.sin(th) * np.cos(ph), np.sin(th) * np.sin(ph), np.cos(th)], -1).reshape(-1, 3)
    idx = np.arange(100 * 100).reshape(100, 100)
    a, b, c, d = idx[:-1, :], idx[:-1, np.r_[1:100, 0]], idx[1:, :], idx[1:, np.r_[1:100, 0]]
    f = np.concatenate([np.stack([a, c, d], -1).reshape(-1, 3), np.stack([a, d, b], -1).reshape(-1, 3)])
    vs, fs = simplify(v, f, 2000)
    assert 500 < len(fs) <= 2000 and fs.max() < len(vs)
    r = np.linalg.norm(vs, axis=1)
    assert np.all(np.abs(r - 1) < 0.1)  # merged vertices stay near the surface
    small_v, small_f = simplify(TETRA_V, TETRA_F, 10)
    np.testing.assert_array_equal(small_f, TETRA_F)


URDF = """<robot name="probe">
  <material name="steel"><color rgba="0.5 0.6 0.7 1"/></material>
  <link name="base"><visual><geometry><mesh filename="package://probe_pkg/meshes/tetra.stl" scale="0.1 0.1 0.1"/></geometry></visual></link>
  <joint name="j1" type="revolute"><parent link="base"/><child link="l1"/><origin xyz="0 0 0.2" rpy="0 0 0.3"/>
    <axis xyz="0 0 1"/><limit lower="-3" upper="3" effort="10" velocity="2"/></joint>
  <link name="l1"><inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <visual><origin xyz="0.1 0 0"/><geometry><box size="0.2 0.04 0.04"/></geometry><material name="steel"/></visual></link>
  <joint name="j2" type="revolute"><parent link="l1"/><child link="l2"/><origin xyz="0.2 0 0" rpy="0.4 0 0"/>
    <axis xyz="0 1 0"/><limit lower="-3" upper="3" effort="10" velocity="2"/></joint>
  <link name="l2"><inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <joint name="weld" type="fixed"><parent link="l2"/><child link="marker"/><origin xyz="0.3 0.05 -0.1" rpy="0.2 -0.5 1.0"/></joint>
  <link name="marker"><visual><origin xyz="0 0.1 0"/><geometry><sphere radius="0.02"/></geometry>
    <material><color rgba="1 0 0 1"/></material></visual></link>
</robot>
"""


def test_visuals_sit_on_the_bodies_that_carry_them(tmp_path):
    pkg = tmp_path / "probe_pkg"
    (pkg / "meshes").mkdir(parents=True)
    (pkg / "urdf").mkdir()
    (pkg / "meshes" / "tetra.stl").write_bytes(_binary_stl(TETRA_V, TETRA_F))
    path = pkg / "urdf" / "probe.urdf"
    path.write_text(URDF)
    visuals, notes = urdf_visuals(path)
    assert notes == [] and [(v.link, v.body, v.color) for v in visuals] == [
        ("base", 0, None), ("l1", 1, "#8099b2"), ("marker", 2, "#ff0000")]
    np.testing.assert_allclose(visuals[0].vertices[visuals[0].faces], 0.1 * TETRA_V[TETRA_F])  # package:// and scale
    arm = jaxarm.load_arm(str(path))  # tip: the marker, welded to l2
    q = np.array([0.7, -1.1])
    frames, tool = (np.asarray(x) for x in jaxarm.forward_kinematics(arm, q))
    sphere = visuals[2]
    centre_world = frames[2][:3, :3] @ sphere.vertices.mean(axis=0) + frames[2][:3, 3]
    np.testing.assert_allclose(centre_world, tool[:3, :3] @ [0, 0.1, 0] + tool[:3, 3], atol=1e-12)
    box = visuals[1]
    np.testing.assert_allclose(box.vertices.min(axis=0), [0.0, -0.02, -0.02], atol=1e-12)
    np.testing.assert_allclose(box.vertices.max(axis=0), [0.2, 0.02, 0.02], atol=1e-12)
    (pkg / "meshes" / "tetra.stl").unlink()
    visuals, notes = urdf_visuals(path)
    assert len(visuals) == 2 and notes == ["link 'base': visual not drawn (package://probe_pkg/meshes/tetra.stl: not found)"]


def _ur5():
    from test_urdf import _robot_file

    return _robot_file("ur_description/urdf/ur5_robot.urdf")


def test_a_headless_browser_draws_the_ur5_meshes(tmp_path, capsys):
    from test_viewer import _chromium

    from PIL import Image

    path = _ur5()
    results = tmp_path / "run.npz"
    t = np.linspace(0, 1, 21)
    q = np.outer(np.sin(2 * t), [0.5, -0.8, 1.0, 0.3, 0.6, 0.2]) + np.array([0, -1.2, 1.2, 0, 0, 0])
    np.savez(results, t=t, q=q)
    page = tmp_path / "ur5.html"
    assert main(["view", path, "--traj", str(results), "--out", str(page)]) == 0
    out = capsys.readouterr().out
    assert "drew 7 meshes" in out and "collision" not in out  # the COLLADA visuals themselves
    data = __import__("json").loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page.read_text(), re.S).group(1))
    faces = sum(len(m["f"]) // 3 for m in data["meshes"])
    assert len(data["meshes"]) == 7 and faces > 10000
    dom = _chromium(f"file://{page}#t=0.5", tmp_path, "--dump-dom")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert f'data-triangles="{faces}"' in body, body
    shot = tmp_path / "shot.png"
    _chromium(f"file://{page}#t=0.5", tmp_path, "--window-size=900,700", f"--screenshot={shot}")
    px = np.asarray(Image.open(shot).convert("RGB"), dtype=int).reshape(-1, 3)
    grey = (np.abs(px[:, 0] - px[:, 1]) < 6) & (np.abs(px[:, 1] - px[:, 2]) < 6) & (px[:, 0] > 40) & (px[:, 0] < 200)
    assert grey.sum() > 5000, grey.sum()  # shaded grey surfaces, not only lines
    assert main(["view", path, "--traj", str(results), "--out", str(tmp_path / "sticks.html"), "--no-meshes"]) == 0
    assert '"meshes":[]' in (tmp_path / "sticks.html").read_text()

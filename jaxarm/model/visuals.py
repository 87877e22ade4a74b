"""The visual geometry of a URDF arm, for drawing (``jaxarm view``, ``simulate --animate x.html``).

Geometry is not part of the dynamics (:func:`jaxarm.load_urdf` reads kinematics and inertials);
this module reads each link's ``<visual>`` elements into triangle meshes expressed in the frame of
the jaxarm body that carries the link:

* body 0 is the base (``base_link`` and every link welded to it), body k (1..n) the child link of
  the k-th moving joint and every link welded to it (by fixed joints, or by joints off the chain,
  which the arm locks at 0), exactly as :func:`jaxarm.load_urdf` merges their inertias. The body
  frames are :func:`jaxarm.forward_kinematics`'s ``frames`` (for URDF arms, the child link frame
  of each joint).
* ``<mesh filename scale>``: binary or ASCII STL and Wavefront OBJ are read. ``package://pkg/...``
  is looked up in the folders above the URDF file (the usual ROS layout) and in
  ``ROS_PACKAGE_PATH``; relative names from the URDF's folder; ``file://`` as is. A visual mesh in
  another format (COLLADA ``.dae``, say) falls back to the link's ``<collision>`` mesh when that one
  can be read; what was used instead of what is reported in the notes.
* ``<box>``, ``<cylinder>`` (axis z) and ``<sphere>`` become meshes of their own; ``<material>``
  colours (inline or by name) are kept.
* Meshes are simplified by vertex clustering (Rossignac & Borrel 1993) to at most ``max_faces``
  triangles per link, so a page with every frame of a run stays small and draws quickly.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import xml.etree.ElementTree as ET

import numpy as np

from .urdf import UrdfError, _chain, _transform

__all__ = ["Visual", "urdf_visuals", "read_mesh"]

MESH_FORMATS = (".stl", ".obj")


@dataclasses.dataclass(frozen=True)
class Visual:
    """One drawable part: ``vertices`` (V, 3) in the frame of body ``body`` (0 = base, k = the
    child link of moving joint k), ``faces`` (F, 3) vertex indices, ``color`` "#rrggbb" or None,
    ``link`` the URDF link and ``source`` where the shape came from (a file name or a primitive)."""

    body: int
    vertices: np.ndarray
    faces: np.ndarray
    color: str | None
    link: str
    source: str


def _read_stl(data: bytes):
    if len(data) >= 84:
        count = struct.unpack_from("<I", data, 80)[0]
        if 84 + 50 * count == len(data):  # binary: 80-byte header, count, 50 bytes per triangle
            rec = np.frombuffer(data, dtype=np.dtype([("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")]), count=count, offset=84)
            tri = rec["v"].astype(float).reshape(-1, 3)
            return tri, np.arange(len(tri)).reshape(-1, 3)
    text = data.decode("ascii", errors="replace")
    verts = [[float(x) for x in line.split()[1:4]] for line in text.splitlines() if line.strip().startswith("vertex")]
    if not verts or len(verts) % 3:
        raise ValueError("not a binary STL, and no ASCII 'vertex' triples")
    tri = np.asarray(verts, dtype=float)
    return tri, np.arange(len(tri)).reshape(-1, 3)


def _read_obj(data: bytes):
    verts, faces = [], []
    for line in data.decode("utf-8", errors="replace").splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "v":
            verts.append([float(x) for x in parts[1:4]])
        elif parts[0] == "f":
            idx = [int(p.split("/")[0]) for p in parts[1:]]
            idx = [i - 1 if i > 0 else len(verts) + i for i in idx]
            faces += [[idx[0], idx[k], idx[k + 1]] for k in range(1, len(idx) - 1)]  # fan
    if not verts or not faces:
        raise ValueError("no 'v' and 'f' lines")
    return np.asarray(verts, dtype=float), np.asarray(faces, dtype=np.int64)


def read_mesh(path):
    """(vertices (V, 3), faces (F, 3)) of an STL (binary or ASCII) or OBJ file, in its own units."""
    ext = os.path.splitext(str(path))[1].lower()
    if ext not in MESH_FORMATS:
        raise ValueError(f"{os.path.basename(str(path))}: mesh format {ext or '(none)'} is not read (STL or OBJ)")
    with open(path, "rb") as f:
        data = f.read()
    try:
        return _read_stl(data) if ext == ".stl" else _read_obj(data)
    except (ValueError, struct.error) as exc:
        raise ValueError(f"{os.path.basename(str(path))}: cannot read the mesh: {exc}") from None


def simplify(vertices, faces, max_faces: int):
    """Vertex clustering: snap vertices to a grid, merge those in one cell (at their mean), drop the
    triangles that collapse and the duplicates; the grid is refined from coarse to fine and the
    finest result within ``max_faces`` is kept (the input itself when it is small enough)."""
    vertices, faces = np.asarray(vertices, float), np.asarray(faces, np.int64)
    if len(faces) <= max_faces:
        return vertices, faces
    lo, hi = vertices.min(axis=0), vertices.max(axis=0)
    size = float(np.max(hi - lo)) or 1.0
    best = coarse = None
    for cells in (8, 12, 16, 24, 32, 48, 64, 96, 128):
        key = np.floor((vertices - lo) / size * cells).astype(np.int64)
        _, cluster, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        cluster = cluster.reshape(-1)
        sums = np.zeros((len(counts), 3))
        np.add.at(sums, cluster, vertices)
        fc = cluster[faces]
        fc = fc[(fc[:, 0] != fc[:, 1]) & (fc[:, 1] != fc[:, 2]) & (fc[:, 0] != fc[:, 2])]
        _, first = np.unique(np.sort(fc, axis=1), axis=0, return_index=True)
        result = (sums / counts[:, None], fc[np.sort(first)])
        coarse = coarse or result
        if len(result[1]) > max_faces:
            break
        best = result
    if best is None:  # even the coarsest grid has too many: an even subset of its triangles
        best = (coarse[0], coarse[1][np.linspace(0, len(coarse[1]) - 1, max_faces).astype(int)])
    v, f = best
    used, f = np.unique(f, return_inverse=True)  # keep only the vertices in use
    return v[used], f.reshape(-1, 3)


def _box(x, y, z):
    v = np.array([[sx * x, sy * y, sz * z] for sx in (-0.5, 0.5) for sy in (-0.5, 0.5) for sz in (-0.5, 0.5)])
    f = np.array([[0, 1, 3], [0, 3, 2], [4, 6, 7], [4, 7, 5], [0, 4, 5], [0, 5, 1],
                  [2, 3, 7], [2, 7, 6], [0, 2, 6], [0, 6, 4], [1, 5, 7], [1, 7, 3]])
    return v, f


def _cylinder(radius, length, segments=20):
    a = np.linspace(0, 2 * np.pi, segments, endpoint=False)
    ring = np.stack([radius * np.cos(a), radius * np.sin(a)], axis=1)
    v = np.concatenate([np.c_[ring, np.full(segments, -length / 2)], np.c_[ring, np.full(segments, length / 2)],
                        [[0, 0, -length / 2], [0, 0, length / 2]]])
    f = []
    for k in range(segments):
        k1 = (k + 1) % segments
        f += [[k, k1, segments + k1], [k, segments + k1, segments + k], [2 * segments, k1, k], [2 * segments + 1, segments + k, segments + k1]]
    return v, np.asarray(f)


def _sphere(radius, rings=8, segments=14):
    v, f = [[0, 0, radius]], []
    for i in range(1, rings):
        th = np.pi * i / rings
        for k in range(segments):
            ph = 2 * np.pi * k / segments
            v.append([radius * np.sin(th) * np.cos(ph), radius * np.sin(th) * np.sin(ph), radius * np.cos(th)])
    v.append([0, 0, -radius])
    last = len(v) - 1
    for k in range(segments):
        k1 = (k + 1) % segments
        f.append([0, 1 + k, 1 + k1])
        f.append([last, 1 + (rings - 2) * segments + k1, 1 + (rings - 2) * segments + k])
    for i in range(rings - 2):
        for k in range(segments):
            k1 = (k + 1) % segments
            a, b, c, d = 1 + i * segments + k, 1 + i * segments + k1, 1 + (i + 1) * segments + k, 1 + (i + 1) * segments + k1
            f += [[a, c, d], [a, d, b]]
    return np.asarray(v, float), np.asarray(f)


def _resolve(filename: str, urdf_dir: str):
    """The file a URDF mesh ``filename`` names, or None."""
    if filename.startswith("file://"):
        path = filename[len("file://"):]
        return path if os.path.exists(path) else None
    if filename.startswith("package://"):
        rest = filename[len("package://"):]
        package, _, inner = rest.partition("/")
        roots = []
        folder = os.path.abspath(urdf_dir)
        while True:
            roots.append(folder)
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
        roots += [p for p in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep) if p]
        for root in roots:
            for candidate in (os.path.join(root, package, inner), os.path.join(root, inner) if os.path.basename(root) == package else None):
                if candidate and os.path.exists(candidate):
                    return candidate
        return None
    path = filename if os.path.isabs(filename) else os.path.join(urdf_dir, filename)
    return path if os.path.exists(path) else None


def _numbers(text, count, default):
    if text is None:
        return np.asarray(default, float)
    values = [float(x) for x in text.split()]
    if len(values) != count:
        raise ValueError(f"expected {count} numbers, got {text!r}")
    return np.asarray(values)


def _color(material, named):
    if material is None:
        return None
    c = material.find("color")
    if c is None and material.get("name") in named:
        return named[material.get("name")]
    if c is None or c.get("rgba") is None:
        return None
    r, g, b = (min(255, max(0, int(round(255 * float(x))))) for x in c.get("rgba").split()[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


def _shape(geometry, urdf_dir):
    """(vertices, faces, source) of a <geometry>, or (None, None, why)."""
    mesh = geometry.find("mesh")
    if mesh is not None:
        name = mesh.get("filename", "")
        path = _resolve(name, urdf_dir)
        if path is None:
            return None, None, f"{name}: not found"
        try:
            v, f = read_mesh(path)
        except (OSError, ValueError) as exc:
            return None, None, str(exc)
        return v * _numbers(mesh.get("scale"), 3, (1, 1, 1)), f, os.path.basename(path)
    for tag, build in (("box", lambda e: _box(*_numbers(e.get("size"), 3, None))),
                       ("cylinder", lambda e: _cylinder(float(e.get("radius")), float(e.get("length")))),
                       ("sphere", lambda e: _sphere(float(e.get("radius"))))):
        e = geometry.find(tag)
        if e is not None:
            v, f = build(e)
            return v, f, tag
    return None, None, "no mesh, box, cylinder or sphere"


def urdf_visuals(path, *, base_link=None, tip_link=None, max_faces: int = 3000):
    """The visual geometry of the chain ``base_link`` -> ``tip_link`` of a URDF file (as
    :func:`jaxarm.load_urdf` reads it): ``(visuals, notes)``, a list of :class:`Visual` and a list
    of one-line notes (fallbacks to collision meshes, shapes that could not be read)."""
    fname, _, links, tree, chain, moving, base, _ = _chain(path, base_link, tip_link)
    urdf_dir = os.path.dirname(os.path.abspath(os.fspath(path)))
    root = ET.parse(path).getroot()
    named = {}
    for m in root.findall("material"):
        col = _color(m, {})
        if col and m.get("name"):
            named[m.get("name")] = col
    elems = {e.get("name"): e for e in root.findall("link")}
    body_of = {base: 0}
    frame = {base: np.eye(4)}  # link frame in its body's frame
    index = {j.name: k + 1 for k, j in enumerate(moving)}
    for link in tree.subtree(base):
        for j in tree.children[link]:
            if j.name in index:
                body_of[j.child], frame[j.child] = index[j.name], np.eye(4)
            else:  # welded: fixed, or off the chain (locked at 0)
                body_of[j.child], frame[j.child] = body_of[link], frame[link] @ j.origin
    visuals, notes = [], []
    for link in tree.subtree(base):
        e = elems.get(link)
        if e is None:
            continue
        collisions = e.findall("collision")
        for k, vis in enumerate(e.findall("visual")):
            geometry = vis.find("geometry")
            if geometry is None:
                continue
            try:
                v, f, source = _shape(geometry, urdf_dir)
                origin = vis.find("origin")
                T = _transform(_numbers(None if origin is None else origin.get("xyz"), 3, (0, 0, 0)),
                               _numbers(None if origin is None else origin.get("rpy"), 3, (0, 0, 0)))
                if v is None and k < len(collisions) and collisions[k].find("geometry") is not None:
                    why = source
                    v, f, source = _shape(collisions[k].find("geometry"), urdf_dir)
                    if v is not None:
                        corigin = collisions[k].find("origin")
                        T = _transform(_numbers(None if corigin is None else corigin.get("xyz"), 3, (0, 0, 0)),
                                       _numbers(None if corigin is None else corigin.get("rpy"), 3, (0, 0, 0)))
                        notes.append(f"link '{link}': visual {why}; drew its collision mesh {source}")
                        source = f"{source} (collision)"
            except ValueError as exc:
                raise UrdfError(f"{fname}: link '{link}': visual: {exc}") from None
            if v is None:
                notes.append(f"link '{link}': visual not drawn ({source})")
                continue
            v, f = simplify(v, f, max_faces)
            M = frame[link] @ T
            visuals.append(Visual(body=body_of[link], vertices=v @ M[:3, :3].T + M[:3, 3], faces=np.asarray(f, np.int64),
                                  color=_color(vis.find("material"), named), link=link, source=source))
    return visuals, notes

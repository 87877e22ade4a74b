"""The visual geometry of a URDF arm, for drawing (``jaxarm view``, ``simulate --animate x.html``).

Geometry is not part of the dynamics (:func:`jaxarm.load_urdf` reads kinematics and inertials);
this module reads each link's ``<visual>`` elements into triangle meshes expressed in the frame of
the jaxarm body that carries the link:

* body 0 is the base (``base_link`` and every link welded to it), body k (1..n) the child link of
  the k-th moving joint and every link welded to it (by fixed joints, or by joints off the chain,
  which the arm locks at 0), exactly as :func:`jaxarm.load_urdf` merges their inertias. The body
  frames are :func:`jaxarm.forward_kinematics`'s ``frames`` (for URDF arms, the child link frame
  of each joint).
* ``<mesh filename scale>``: binary or ASCII STL, Wavefront OBJ and COLLADA (``.dae``: the
  triangles of its visual scene, placed by the nodes' transforms, in metres with z up) are read.
  ``package://pkg/...`` is looked up in the folders above the URDF file (the usual ROS layout) and in
  ``ROS_PACKAGE_PATH``; relative names from the URDF's folder; ``file://`` as is. A visual mesh that
  cannot be read falls back to the link's ``<collision>`` mesh when that one can be; what was used
  instead of what is reported in the notes.
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

MESH_FORMATS = (".stl", ".obj", ".dae")


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


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(elem, name):
    return [c for c in elem if _local(c.tag) == name]


def _node_matrix(node) -> np.ndarray:
    """The product of a COLLADA <node>'s transform elements, in document order (COLLADA 1.4, 5-88)."""
    M = np.eye(4)
    for c in node:
        tag, text = _local(c.tag), (c.text or "").split()
        v = np.asarray([float(x) for x in text]) if text else np.zeros(0)
        if tag == "matrix" and v.size == 16:
            M = M @ v.reshape(4, 4)
        elif tag == "translate" and v.size == 3:
            T = np.eye(4)
            T[:3, 3] = v
            M = M @ T
        elif tag == "scale" and v.size == 3:
            M = M @ np.diag([*v, 1.0])
        elif tag == "rotate" and v.size == 4:
            axis, angle = v[:3] / (np.linalg.norm(v[:3]) or 1.0), np.radians(v[3])
            K = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
            R = np.eye(4)
            R[:3, :3] = np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K
            M = M @ R
    return M


def _read_dae(data: bytes):
    """Triangles of a COLLADA document: every <instance_geometry> of the visual scene, placed by its
    nodes' transforms, in metres (<unit meter>) with z up (<up_axis>). <triangles>, <polylist> and
    <polygons> are read (polygons split into fans); materials, normals and textures are not."""
    root = ET.fromstring(data)
    find = {_local(e.tag): e for e in root}
    asset = find.get("asset")
    scale, up = 1.0, "Z_UP"
    if asset is not None:
        for c in asset:
            if _local(c.tag) == "unit" and c.get("meter"):
                scale = float(c.get("meter"))
            if _local(c.tag) == "up_axis" and c.text:
                up = c.text.strip()
    arrays = {e.get("id"): e for e in root.iter() if _local(e.tag) == "source" and e.get("id")}
    geometries = {e.get("id"): e for e in root.iter() if _local(e.tag) == "geometry" and e.get("id")}

    def positions(mesh, ref):
        ref = ref.lstrip("#")
        for vert in _children(mesh, "vertices"):
            if vert.get("id") == ref:
                for inp in _children(vert, "input"):
                    if inp.get("semantic") == "POSITION":
                        ref = inp.get("source", "").lstrip("#")
        src = arrays.get(ref)
        fa = next((c for c in src if _local(c.tag) == "float_array"), None) if src is not None else None
        if fa is None:
            raise ValueError(f"COLLADA source {ref!r} has no float_array")
        return np.asarray([float(x) for x in (fa.text or "").split()]).reshape(-1, 3)

    def triangles(geometry):
        mesh = next((c for c in geometry if _local(c.tag) == "mesh"), None)
        if mesh is None:
            return np.zeros((0, 3))
        out = []
        for prim in mesh:
            kind = _local(prim.tag)
            if kind not in ("triangles", "polylist", "polygons"):
                continue
            inputs = _children(prim, "input")
            stride = 1 + max((int(i.get("offset", 0)) for i in inputs), default=0)
            vin = next((i for i in inputs if i.get("semantic") == "VERTEX"), None)
            if vin is None:
                continue
            P = positions(mesh, vin.get("source", ""))
            off = int(vin.get("offset", 0))
            lists = [np.asarray([int(x) for x in (p.text or "").split()], dtype=np.int64) for p in _children(prim, "p")]
            if kind == "triangles":
                idx = np.concatenate(lists)[off::stride] if lists else np.zeros(0, np.int64)
                out.append(P[idx[: len(idx) // 3 * 3]].reshape(-1, 3, 3))
                continue
            if kind == "polylist":
                vc = _children(prim, "vcount")
                counts = [int(x) for x in (vc[0].text or "").split()] if vc else []
                flat = np.concatenate(lists)[off::stride] if lists else np.zeros(0, np.int64)
                polys, start = [], 0
                for c in counts:
                    polys.append(flat[start:start + c])
                    start += c
            else:
                polys = [lst[off::stride] for lst in lists]
            for poly in polys:
                if len(poly) >= 3:
                    fan = np.stack([np.full(len(poly) - 2, poly[0]), poly[1:-1], poly[2:]], axis=1)
                    out.append(P[fan])
        return np.concatenate(out) if out else np.zeros((0, 3, 3))

    tris = []

    def walk(node, M):
        M = M @ _node_matrix(node)
        for c in node:
            tag = _local(c.tag)
            if tag == "instance_geometry":
                g = geometries.get(c.get("url", "").lstrip("#"))
                if g is not None:
                    t = triangles(g)
                    if len(t):
                        tris.append(t @ M[:3, :3].T + M[:3, 3])
            elif tag == "node":
                walk(c, M)

    scenes = [e for e in root.iter() if _local(e.tag) == "visual_scene"]
    if scenes:
        for node in _children(scenes[0], "node"):
            walk(node, np.eye(4))
    else:  # no scene: every geometry as it is
        tris = [t for t in (triangles(g) for g in geometries.values()) if len(t)]
    if not tris:
        raise ValueError("no triangles in the COLLADA scene")
    tri = np.concatenate(tris).reshape(-1, 3) * scale
    if up == "Y_UP":  # to z up, a rotation: (x, y, z) -> (x, -z, y)
        tri = tri @ np.array([[1.0, 0, 0], [0, 0, -1.0], [0, 1.0, 0]]).T
    elif up == "X_UP":  # (x, y, z) -> (-z, y, x)
        tri = tri @ np.array([[0, 0, -1.0], [0, 1.0, 0], [1.0, 0, 0]]).T
    return tri, np.arange(len(tri)).reshape(-1, 3)


def read_mesh(path):
    """(vertices (V, 3), faces (F, 3)) of an STL (binary or ASCII), OBJ or COLLADA (.dae) file, in
    its own units (COLLADA: in metres, z up)."""
    ext = os.path.splitext(str(path))[1].lower()
    if ext not in MESH_FORMATS:
        raise ValueError(f"{os.path.basename(str(path))}: mesh format {ext or '(none)'} is not read (STL, OBJ or COLLADA)")
    with open(path, "rb") as f:
        data = f.read()
    try:
        if ext == ".dae":
            return _read_dae(data)
        return _read_stl(data) if ext == ".stl" else _read_obj(data)
    except (ValueError, struct.error, ET.ParseError) as exc:
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


def _origin(elem) -> np.ndarray:
    """The 4x4 placement of a <visual> or <collision> from its <origin xyz rpy> (identity if absent)."""
    o = elem.find("origin")
    return _transform(_numbers(None if o is None else o.get("xyz"), 3, (0, 0, 0)),
                      _numbers(None if o is None else o.get("rpy"), 3, (0, 0, 0)))


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
                T = _origin(vis)
                if v is None and k < len(collisions) and collisions[k].find("geometry") is not None:
                    why = source
                    v, f, source = _shape(collisions[k].find("geometry"), urdf_dir)
                    if v is not None:
                        T = _origin(collisions[k])
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

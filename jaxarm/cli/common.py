"""What every command shares: errors and exit codes, parsing of numbers and joint vectors,
loading arms, and plain-text tables."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import time
import warnings

import numpy as np

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
PD_BANDWIDTH = 10.0  # rad/s: default PD gains make every joint critically damped at this frequency
MAX_RESULT_BYTES = 4 * 1024**3  # refuse runs whose results alone would need more memory than this


class CommandError(Exception):
    """A user-facing failure: one line for stderr and the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def on_terminal(stream=None) -> bool:
    """Whether ``stream`` (default stderr) is a terminal that can redraw a line in place: its
    ``isatty()`` says so and ``TERM`` is not ``dumb``. The progress bar of ``jaxarm simulate`` and
    the status line of ``jaxarm identify`` are drawn only there; a pipe, a log file, a test or an
    editor's output pane gets none of them."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
    except ValueError:  # a closed stream
        return False


class _Status:
    """What a long command is doing, as one line on stderr with a spinner and the seconds spent
    (rich's ``Status``), redrawn in place and gone when the command ends. Only on a terminal: a
    pipe, a log file or a test sees nothing, so output and refusals stay as they are. Lines printed
    to stderr meanwhile (warnings) appear above it. ``stop()`` removes it (call it in a
    ``finally``)."""

    def __init__(self):
        self.status = None
        self.t0 = time.perf_counter()
        if on_terminal():
            from rich.console import Console

            self.status = Console(file=sys.stderr).status("")
            self.status.start()

    def __call__(self, what: str) -> None:
        if self.status is not None:
            self.status.update(_Elapsed(what, self.t0))

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


class _Elapsed:
    """A status text whose seconds count on: rich renders it afresh at every redraw."""

    def __init__(self, what: str, t0: float):
        self.what, self.t0 = what, t0

    def __rich__(self):
        from rich.text import Text

        return Text(f"{self.what} ({int(time.perf_counter() - self.t0)} s so far)", no_wrap=True, overflow="ellipsis")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises CommandError (one line) instead of printing usage."""

    def error(self, message):
        raise CommandError(f"{message} (see '{self.prog} --help')")


_NEGATIVE = re.compile(r"-(\d|\.\d)[\d.eE+\-,\s]*|-(inf|nan)", re.IGNORECASE)


def _protect_negative_numbers(argv):
    """argparse takes '-0.5,0' (or '-1e-3') for an option; a leading space makes it a value.
    Number parsing strips the space again. No option of this program starts with '-<digit>'."""
    return [" " + a if _NEGATIVE.fullmatch(a) else a for a in argv]


def _finite_number(text: str, label: str) -> float:
    """One finite number from user text (an option value or a CSV cell), or a CommandError naming it."""
    text = text.strip()
    try:
        v = float(text)
    except ValueError:
        raise CommandError(f"{label}: {text!r} is not a number") from None
    if not math.isfinite(v):
        raise CommandError(f"{label}: expected a finite number, got {text}")
    return v


def _numbers(tokens, option: str) -> list[float]:
    text = " ".join(tokens) if isinstance(tokens, (list, tuple)) else str(tokens)
    values = [_finite_number(part, option) for part in re.split(r"[,\s]+", text.strip()) if part]
    if not values:
        raise CommandError(f"{option}: expected numbers, got nothing")
    return values


def _joint_vector(tokens, option: str, arm, default=None, allow_scalar: bool = False) -> np.ndarray:
    """One number per joint (or one number for all joints when allow_scalar)."""
    if tokens is None:
        return np.full(arm.n, default, dtype=np.float64)
    values = _numbers(tokens, option)
    if allow_scalar and len(values) == 1:
        return np.full(arm.n, values[0])
    if len(values) != arm.n:
        scalar = "1 or " if allow_scalar else ""
        raise CommandError(f"{option}: expected {scalar}{arm.n} values (one per joint of {arm.name}), got {len(values)}")
    return np.asarray(values, dtype=np.float64)


def _positive(value, option: str, what: str) -> float:
    values = _numbers(value, option)
    if len(values) != 1:
        raise CommandError(f"{option}: expected one number, got {len(values)}")
    if not values[0] > 0:
        raise CommandError(f"{option}: expected {what} > 0, got {values[0]:g}")
    return values[0]


def _one_line(message) -> str:
    return re.sub(r"\s*\n\s*", " ", str(message)).strip()




def _load_arm(spec: str, strict: bool = False):
    """load_arm without the consistency warnings (``info`` reports them, the others summarise)."""
    from ..model.arm_files import ArmFileError, PhysicalConsistencyWarning, load_arm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhysicalConsistencyWarning)
        try:
            return load_arm(spec, strict=strict)
        except ArmFileError as exc:
            raise CommandError(_one_line(exc)) from None


def _inconsistent_links(arm) -> list[int]:
    """Joint numbers (1-based) of the physically inconsistent links; a massless link with zero
    inertia is an idealisation and is not reported (as in jaxarm.arm_files)."""
    from ..model.consistency import consistency_report

    reports = consistency_report(arm)
    return [i + 1 for i in range(arm.n) if not (reports[f"joint {i + 1}"].ok or reports[f"joint {i + 1}"].massless)]


def _consistency_note(arm, spec: str) -> str | None:
    bad = _inconsistent_links(arm)
    if not bad:
        return None
    which = f"link {bad[0]} has" if len(bad) == 1 else f"links {', '.join(map(str, bad))} have"
    return f"{arm.name}: {which} physically inconsistent inertial parameters (see 'jaxarm info {spec}'; --strict refuses such arms)"


def _require_motor_model(arm, option: str) -> None:
    kt = np.asarray(arm.drives.torque_constant)
    r = np.asarray(arm.drives.resistance)
    bad = np.flatnonzero(~((kt > 0) & (r > 0)))
    if bad.size:
        joints = "" if bad.size == arm.n else " for joint" + ("s " if bad.size > 1 else " ") + ", ".join(str(i + 1) for i in bad)
        raise CommandError(
            f"{option}: arm {arm.name} has no motor model{joints} "
            "(torque_constant and resistance must be > 0 in [joint.motor]); give joint torques instead"
        )




def _fmt(x, digits: int = 6) -> str:
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0.0:
        return "0"
    return f"{x:.{digits}g}"


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*(e[-+]?\d+)?|inf|-)", re.IGNORECASE)


def _table(headers, rows, indent: str = "  ") -> str:
    """A plain-text table (rich's ``Table`` without borders or colour, so it reads the same in a
    terminal, a log file and a pipe): numeric columns right-aligned, text columns left-aligned."""
    import io

    from rich.console import Console
    from rich.table import Table

    cells = [[str(c) for c in row] for row in rows]
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0),
                  header_style="", show_header=True)
    for k, h in enumerate(headers):
        numeric = bool(cells) and all(_NUMBER.fullmatch(r[k]) for r in cells)
        table.add_column(str(h), justify="right" if numeric else "left", no_wrap=True)
    for r in cells:
        table.add_row(*r)
    out = io.StringIO()
    Console(file=out, width=10_000, color_system=None, force_terminal=False, highlight=False,
            emoji=False, markup=False, soft_wrap=True).print(table, markup=False)
    return "\n".join(indent + line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())


class _Outputs:
    """Files written to temporaries beside their targets, renamed into place together."""

    def __init__(self):
        self.pending = []  # (temporary, final)

    @staticmethod
    def check(path: str, option: str, force: bool = False) -> None:
        """Before any work: the folder exists and is writable, and an existing file is only
        replaced when the user said so (--force)."""
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise CommandError(f"{option}: {path} is a directory")
        if os.path.lexists(path) and not force:
            raise CommandError(f"{option}: {path} already exists; pass --force to replace it (nothing was written)")
        if not os.path.isdir(folder):
            raise CommandError(f"{option}: {path}: directory {folder} does not exist")
        if not os.access(folder, os.W_OK):
            raise CommandError(f"{option}: {path}: directory {folder} is not writable")

    def write(self, path: str, writer) -> None:
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        self.pending.append((tmp, path))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # the permissions a plain open() would give
        with os.fdopen(fd, "wb") as f:
            writer(f)

    def commit(self) -> None:
        for tmp, path in self.pending:
            os.replace(tmp, path)
        self.pending = []

    def discard(self) -> None:
        for tmp, _ in self.pending:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self.pending = []


def _state_vectors(args, arm):
    q = _joint_vector(args.q, "--q", arm)
    qd = _joint_vector(args.qd, "--qd", arm, default=0.0)
    return q, qd


def _print_joint_table(arm, columns):
    """columns: list of (name, values (n,), unit for revolute joints, unit for prismatic joints)."""
    kinds = set(arm.joint_types)

    def unit(ur, up):
        return ur if kinds == {"revolute"} else up if kinds == {"prismatic"} else f"{ur} | {up}"

    def cells(values):
        # 12 significant digits of the column's largest entry: anything smaller than that
        # resolution is round-off (an exact zero computed as 8e-33, say) and prints as 0.
        values = np.asarray(values, dtype=np.float64)
        resolution = 1e-12 * float(np.max(np.abs(values), initial=0.0))
        return [f"{0.0 if abs(v) <= resolution else float(v):.12g}" for v in values]

    headers = ["joint", "type"] + [f"{name} [{unit(ur, up)}]" for name, _, ur, up in columns]
    printed = [cells(v) for _, v, _, _ in columns]
    rows = [[i + 1, arm.joint_types[i], *(col[i] for col in printed)] for i in range(arm.n)]
    print(_table(headers, rows, indent=""))

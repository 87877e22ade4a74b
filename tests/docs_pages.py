"""Reading the code out of the documentation: the python and shell blocks of a Markdown page.

Used by ``tests/test_docs.py`` (which executes the tutorials and checks every other page's code)
and handy by hand: ``python tests/docs_pages.py docs/quickstart.md`` runs one page in a temporary
folder and prints its output and time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
SKIP = "<!-- not run -->"  # put on the line before a block that only shows code
ELSEWHERE = "<!-- run by "  # "<!-- run by tests/x.py -->": a block that test runs (e.g. as two processes)


def _marker(text: str, match) -> str:
    """The line just before a fenced block (where its ``<!-- ... -->`` marker goes), stripped."""
    return (text[: match.start()].rstrip().splitlines()[-1:] or [""])[0].strip()


def blocks(path, language: str | None = None):
    """The fenced blocks of the page, in order, as (language, code), minus those marked SKIP;
    with ``language``, only that language's code."""
    text = Path(path).read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = _marker(text, m)
        if before == SKIP or before.startswith(ELSEWHERE):
            continue
        if language is None:
            out.append((m.group(1), m.group(2)))
        elif m.group(1) == language:
            out.append(m.group(2))
    return out


def block_run_by(path, test_file: str) -> str:
    """The one block of the page marked ``<!-- run by tests/<test_file> -->``, for that test to run."""
    text = Path(path).read_text(encoding="utf-8")
    found = [m.group(2) for m in FENCE.finditer(text) if _marker(text, m) == f"{ELSEWHERE}tests/{test_file} -->"]
    assert len(found) == 1, f"{path}: expected one block marked {ELSEWHERE}tests/{test_file} -->, found {len(found)}"
    return found[0]


def _commands(code: str):
    """The ``jaxarm ...`` lines of a bash block (installs and other tools are left out)."""
    return [ln.strip() for ln in code.splitlines() if ln.strip().startswith("jaxarm ")]


def page_script(path) -> str:
    """One Python script that does what the page shows, in the page's order: its python blocks
    as they are, and each ``jaxarm ...`` line of its bash blocks as ``python -m jaxarm ...``,
    echoed with its output and stopping at a non-zero exit."""
    parts = ["import shlex as _shlex, subprocess as _subprocess, sys as _sys\n"
             "def _jaxarm(line):\n"
             "    print('$', line, flush=True)\n"
             "    r = _subprocess.run([_sys.executable, '-m', 'jaxarm', *_shlex.split(line)[1:]])\n"
             "    if r.returncode:\n"
             "        raise SystemExit(f'{line!r} exited with {r.returncode}')\n"]
    for language, code in blocks(path):
        if language == "python":
            parts.append(code)
        elif language == "bash":
            parts += [f"_jaxarm({line!r})\n" for line in _commands(code)]
    return "\n".join(parts)


def run_page(path, workdir, timeout: float = 600.0, cache_dir=None):
    """Run :func:`page_script` of the page in ``workdir``. Returns (returncode, output, seconds).
    ``cache_dir``: a JAX persistent compilation cache shared by the pages' processes (and the
    ``jaxarm`` commands they run), so a program another page or command already compiled is not
    compiled again; None compiles everything (a new user's first run)."""
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), MPLBACKEND="Agg",
               JAXARM_CACHE_DIR="off", PYTHONUNBUFFERED="1")
    # as a user runs the page: without the optimization level the test suite compiles with (conftest.py)
    added = env.pop("JAXARM_TEST_UNOPTIMIZED", None)
    if added:
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(added, "").strip()
    if cache_dir is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
    r = subprocess.run([sys.executable, "-c", page_script(path)], cwd=workdir, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout + r.stderr, time.perf_counter() - start


CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
CLI_MARK = "<!-- cli-help:"


def cli_help() -> str:
    """``jaxarm COMMAND --help`` of every command, as Markdown, at a fixed width of 100 columns."""
    os.environ["COLUMNS"] = "100"
    from jaxarm.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    parts = []
    for name, p in sub.choices.items():
        parts.append(f"### jaxarm {name}\n\n```text\n{p.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def write_cli_help() -> None:
    text = CLI_PAGE.read_text(encoding="utf-8")
    head, mark, rest = text.partition(CLI_MARK)
    line = f"{CLI_MARK} generated by `python tests/docs_pages.py --write-cli` with Python {sys.version_info[0]}.{sys.version_info[1]}; tests/test_docs.py checks it is current -->"
    CLI_PAGE.write_text(head + line + "\n\n" + cli_help(), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-cli"]:
        write_cli_help()
        print(f"wrote {CLI_PAGE}")
        raise SystemExit(0)
    for page in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            code, out, seconds = run_page(page, tmp)
        print(out)
        print(f"{page}: exit {code}, {seconds:.1f} s")

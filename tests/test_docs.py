"""The documentation cannot rot: the site builds strictly, the quick start and every tutorial run
as written, every other page's code names things that exist, and the command reference covers
every command."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs_pages import CLI_MARK, CLI_PAGE, ELSEWHERE, ROOT, _commands, blocks, cli_help, run_page

DOCS = ROOT / "docs"


def _runs_something(path) -> bool:
    return any(language == "python" or (language in ("bash", "sh") and _commands(code)) for language, code in blocks(path))


PAGES = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
EXECUTED = [page for page in PAGES if _runs_something(DOCS / page)]
CHECKED = [page for page in PAGES if page not in EXECUTED]
# pages whose examples read the Panda excitation log of Gaz et al. (2019), which is not in the
# repository: the test puts it into the page's folder when a shared/data/panda/ folder lies beside
# the repository (as in CI), and skips the page otherwise
PANDA_LOG = ROOT.parent / "shared" / "data" / "panda" / "panda_excitation_traj1.csv"


def test_every_tutorial_and_guide_is_executed_and_in_the_site():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in ["quickstart.md", "how-it-works.md"] + [f"{d}/{p.name}" for d in ("tutorials", "guide") for p in (DOCS / d).glob("*.md")]:
        assert page in EXECUTED or not any(lang == "python" for lang, _ in blocks(DOCS / page)), page
    assert len(EXECUTED) >= 11
    for page in EXECUTED + CHECKED:
        assert page in nav or page == "architecture.md" and "architecture.md" in nav, f"{page} is not in mkdocs.yml's nav"


def test_blocks_run_elsewhere_are_run_there():
    """A block marked ``<!-- run by tests/x.py -->`` is read and run by that test file."""
    for page in PAGES:
        for line in (DOCS / page).read_text().splitlines():
            if line.strip().startswith(ELSEWHERE):
                test = ROOT / line.strip()[len(ELSEWHERE):].removesuffix("-->").strip()
                assert test.is_file(), f"{page}: {line.strip()}: no such test file"
                text = test.read_text()
                assert "block_run_by" in text and page in text, f"{page}: {test.name} does not run the block"


def test_a_page_runs_with_the_users_xla_flags_not_the_suites(tmp_path, monkeypatch):
    """The suite compiles with LLVM's optimization off (conftest.py); a page runs as a user runs
    it: with the XLA_FLAGS the user gave and without the one the suite added."""
    import conftest

    flags = os.environ.get("XLA_FLAGS", "")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=true " + conftest.UNOPTIMIZED)
    monkeypatch.setenv("JAXARM_TEST_UNOPTIMIZED", conftest.UNOPTIMIZED)
    page = tmp_path / "page.md"
    page.write_text("# flags\n\n```python\nimport os\nprint('XLA_FLAGS=' + os.environ.get('XLA_FLAGS', ''))\n```\n")
    code, output, _ = run_page(page, tmp_path)
    assert code == 0, output
    assert "XLA_FLAGS=--xla_cpu_use_thunk_runtime=true" in output and conftest.UNOPTIMIZED not in output, output
    if os.environ.get("JAXARM_TEST_OPTIMIZED") != "1":
        assert "xla_backend_optimization_level" in flags  # the suite itself runs with a level (its own or the user's)


# a page that compiles the same programs as another runs right after it, in the same test, so that
# it finds them in the shared compilation cache (the trajectory-optimization guide's Panda example
# is the tutorial's problem)
AFTER = {"guide/trajopt.md": "tutorials/trajectory-optimization.md"}
FIRST = [page for page in EXECUTED if page not in AFTER]


@pytest.mark.parametrize("page", FIRST)
def test_page_runs_as_written(page, tmp_path, compile_cache):
    for p in [page] + [later for later, before in AFTER.items() if before == page]:
        folder = tmp_path / p.replace("/", "_")
        folder.mkdir()
        if PANDA_LOG.name in (DOCS / p).read_text():
            if not PANDA_LOG.is_file():
                pytest.skip(f"{p} reads {PANDA_LOG.name} (Gaz et al. 2019), not found at {PANDA_LOG}")
            (folder / PANDA_LOG.name).symlink_to(PANDA_LOG)
        code, output, seconds = run_page(DOCS / p, folder, cache_dir=compile_cache)
        print(f"{p}: {seconds:.0f} s")
        assert code == 0, f"{p} failed after {seconds:.0f} s:\n{output[-4000:]}"
        assert output.strip(), f"{p} printed nothing"
        assert "Traceback" not in output


def _jaxarm_names(tree):
    """Dotted names ``jaxarm.a.b`` used as attribute chains, and ``from jaxarm.x import y`` pairs."""
    names, imports = set(), []
    aliases = {"jaxarm": "jaxarm"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "jaxarm":
            for a in node.names:
                imports.append((node.module, a.name))
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "jaxarm":
                    aliases[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, cur = [], node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in aliases and aliases[cur.id].split(".")[0] == "jaxarm":
                names.add(".".join([aliases[cur.id]] + chain[::-1]))
    return names, imports


def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for k, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: k + 1]))
        except ImportError:
            return None, ".".join(parts[: k + 1])
    return obj, None


@pytest.mark.parametrize("page", CHECKED + ["../README.md"])
def test_code_on_other_pages_parses_and_names_what_exists(page):
    """Pages whose examples take minutes (the measured experiments) are not run; their Python must
    still parse, and every ``jaxarm.`` name and import in it must exist."""
    path = DOCS / page
    for code in blocks(path, "python"):
        tree = ast.parse(code)
        names, imports = _jaxarm_names(tree)
        for module, name in imports:
            mod = importlib.import_module(module)
            assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), f"{page}: from {module} import {name}"
        for dotted in sorted(names):
            obj, missing = _resolve(dotted)
            # attributes of results (res.x, arm.links.mass) are not module names: only check
            # chains whose head resolves to a module and whose next part is absent from it
            if missing is not None:
                parent, _ = _resolve(missing.rsplit(".", 1)[0])
                assert not isinstance(parent, type(sys)), f"{page}: {dotted}: {missing} does not exist"


def test_readme_runs_as_written(tmp_path):
    """The README's short example runs (its shell blocks are the install and test commands, not
    run here)."""
    script = "\n\n".join(blocks(ROOT / "README.md", "python"))
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()


def test_command_reference_covers_every_command():
    from jaxarm.cli import build_parser

    text = (DOCS / "reference" / "cli.md").read_text()
    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name in commands:
        assert re.search(rf"\bjaxarm {re.escape(name)}\b", text), f"docs/reference/cli.md does not show 'jaxarm {name}'"


def test_command_reference_holds_the_current_help():
    """The options listed in the reference are the parser's own (argparse's layout differs between
    Python versions, so the check runs on the version that wrote them)."""
    text = CLI_PAGE.read_text()
    written = re.search(r"with Python (\d+)\.(\d+);", text)
    assert written, f"{CLI_PAGE}: the generated part is missing (python tests/docs_pages.py --write-cli)"
    if (int(written.group(1)), int(written.group(2))) != sys.version_info[:2]:
        pytest.skip(f"the reference was written with Python {written.group(1)}.{written.group(2)}")
    generated = text.split(CLI_MARK, 1)[1].split("\n", 1)[1].strip()
    assert generated == cli_help().strip(), "the CLI changed: run python tests/docs_pages.py --write-cli"


def test_site_builds_strictly(tmp_path):
    """mkdocs build --strict: a broken link, a missing page or an unresolvable API reference fails."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs and mkdocstrings are not installed (pip install -e '.[docs]')")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "inverse_dynamics" in api and "rollout" in api


PARSE_ONLY = r"""
import argparse, contextlib, io, json, os, runpy, sys

class _Parsed(Exception):
    pass

_parse, _parse_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
_inside = []

def _parse_and_stop(self, *args, **kwargs):
    _inside.append(1)
    try:
        _parse(self, *args, **kwargs)  # exits with the parser's message on an unknown option
    finally:
        _inside.pop()
    raise _Parsed

def _parse_known_and_stop(self, *args, **kwargs):
    out = _parse_known(self, *args, **kwargs)
    if _inside:
        return out
    raise _Parsed

argparse.ArgumentParser.parse_args = _parse_and_stop
argparse.ArgumentParser.parse_known_args = _parse_known_and_stop
results = []
for script, args in json.loads(sys.argv[1]):
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
        results.append([script, args, "ran without parsing its arguments"])
    except _Parsed:
        results.append([script, args, None])
    except SystemExit as exc:
        results.append([script, args, f"exit {exc.code}: {err.getvalue()[-800:]}"])
    finally:
        sys.path.pop(0)
print(json.dumps(results))
"""


def _experiment_commands():
    """The ``python experiments/...`` and ``python benchmarks/...`` lines of the docs' shell blocks
    (the measured experiments; minutes to tens of minutes each), as (page, script, arguments)."""
    import shlex
    from docs_pages import FENCE

    found = []
    for path in sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]:
        for m in FENCE.finditer(path.read_text(encoding="utf-8")):
            if m.group(1) not in ("bash", "sh"):
                continue
            text = re.sub(r"\\\n\s*", " ", m.group(2))  # continued lines
            for line in text.splitlines():
                line = line.split("#", 1)[0].split(">", 1)[0].strip()
                hit = re.match(r"(?:PYTHONPATH=\S+ )?python3? ((?:experiments|benchmarks)/\S+\.py)(.*)$", line)
                if not hit or "..." in line:
                    continue
                args = [a.strip("[]") for a in shlex.split(hit.group(2))]
                found.append((str(path.relative_to(ROOT)), hit.group(1), args))
    return found


def test_every_experiment_the_docs_name_exists_and_takes_the_options_shown():
    """The experiments take minutes each, so they are not run here; each command the docs show
    must name an existing script whose argument parser accepts the options as written (all of
    them in one process, each stopped right after its arguments are parsed)."""
    import json

    commands = _experiment_commands()
    assert len(commands) >= 15
    for page, script, _ in commands:
        assert (ROOT / script).is_file(), f"{page}: {script} does not exist"
    todo = sorted({(str(ROOT / script), tuple(args)) for _, script, args in commands})
    out = subprocess.run([sys.executable, "-c", PARSE_ONLY, json.dumps(todo)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(results) == len(todo)
    failed = [f"python {Path(script).relative_to(ROOT)} {' '.join(args)}: {why}" for script, args, why in results if why]
    assert not failed, "\n".join(failed)

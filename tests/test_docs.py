"""The documentation is executed: README.md and every page under docs/ but the generated
docs/api.md (whose signatures are not examples).

Rules for the code blocks of those files:

- every ```python block runs, in document order, with ``exec`` in one namespace per file,
  in a fresh temporary directory as the working directory and with ``MPLBACKEND=Agg``;
  an exception fails that file's test (one test per file, its id the file's path);
- in ```console blocks, each line starting with ``$ augmentedgp `` is run in-process by
  typer's ``CliRunner`` on ``augmentedgp.cli.app`` in the same directory, interleaved with
  the python blocks in document order, and must exit with code 0. A block that shows a
  failing command is preceded by a comment ``<!-- exit N -->`` (blank lines may lie
  between), and then each of its commands must exit with code N. Lines ending in a
  backslash continue on the next line; lines without ``$ `` are output and not checked;
- set-up commands (``$ pip``, ``$ pytest``, ``$ git``, ``$ python -m venv``,
  ``$ source``) are never run here: CI runs them itself, as ``.ci/run`` executes exactly
  the README's set-up commands. Any other command in a console block is an error;
- ```bash (or ```sh / ```shell) blocks may hold only such set-up commands (joined by
  ``&&`` or one per line), plus ``augmentedgp demo``, which tests/test_cli.py runs.

Other checks: every tutorial listed in docs/index.md exists and every tutorial file is
listed; every capability has a tutorial; relative links in the docs resolve; docs/api.md
is what ``python docs/gen_api.py`` writes; every public name has a docstring.

Time: JAX compilation dominates the examples (seconds per new model), so the files of
``SECOND_LANE`` run in one background worker process (started with ``spawn`` when the first
doc test runs), in parallel with the others, which run in the pytest process; each file's
test reports its own result either way. ``AGP_DOCS_WORKERS=0`` runs every file in-process.
The lanes group files that share compiled programs (same model, shapes and data).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import multiprocessing
import os
import re
import shlex
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOT_EXECUTED = {DOCS / "api.md"}  # generated

# One tutorial per capability (the list), by file name under docs/tutorials/.
CAPABILITIES = {
    "regression": "regression.md",
    "robust regression": "robust-regression.md",
    "classification": "classification.md",
    "counts": "counts.md",
    "multi-class": "multiclass.md",
    "Gibbs sampling": "gibbs.md",
    "particle flow": "particle-flow.md",
    "PAC-Bayes / DPP": "pac-bayes-dpp.md",
    "scaling out": "scaling.md",
    "scikit-learn, CLI and persistence": "sklearn-cli.md",
}

# Files run by the background worker; the rest (README.md first) run in the pytest process.
SECOND_LANE = ("robust-regression.md", "counts.md", "multiclass.md", "gibbs.md",
               "particle-flow.md")

SETUP = ("pip", "pytest", "git", "python -m venv", "python3 -m venv", "source")
SHELL_ALSO = ("augmentedgp demo",)  # allowed in bash blocks: run by tests/test_cli.py
FENCE = re.compile(r"^(?P<indent>[ ]{0,3})(?P<fence>`{3,})(?P<lang>[\w+-]*)[^\n]*\n"
                   r"(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)
EXIT_MARK = re.compile(r"<!--\s*exit\s+(\d+)\s*-->\s*$")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))
    return [f for f in files if f not in NOT_EXECUTED]


def blocks(text: str):
    """(language, body, first line number of the body, expected exit code) per fenced
    block, in document order."""
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n ")
        mark = EXIT_MARK.search(before.splitlines()[-1]) if before else None
        line = text.count("\n", 0, m.start("body")) + 1
        yield m.group("lang").lower(), m.group("body"), line, int(mark.group(1)) if mark else 0


def _is_setup(cmd: str) -> bool:
    return any(cmd == p or cmd.startswith(p + " ") for p in SETUP)


def console_commands(body: str):
    """The commands of a console block: lines starting with ``$ ``, with backslash
    continuations joined."""
    cmds, current = [], None
    for line in body.splitlines():
        if current is not None:
            current += " " + line.strip()
        elif line.startswith("$ "):
            current = line[2:].strip()
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
        else:
            cmds.append(current)
            current = None
    if current is not None:
        cmds.append(current)
    return cmds


def run_cli(cmd: str, expected: int, where: str):
    from typer.testing import CliRunner

    from augmentedgp.cli import app

    args = shlex.split(cmd)[1:]
    result = CliRunner().invoke(app, args)
    if result.exit_code != expected:
        detail = result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            import traceback

            detail += "".join(traceback.format_exception(result.exception))
        raise AssertionError(f"{where}: `{cmd}` exited with {result.exit_code}, expected "
                             f"{expected}\n{detail}")
    return result


def run_markdown(path: Path, text: str | None = None) -> dict:
    """Execute the python and console blocks of one Markdown file in document order (in
    the current directory); returns the python namespace. Raises on the first failure."""
    text = path.read_text() if text is None else text
    namespace = {"__name__": f"docs:{path.name}"}
    for lang, body, line, expected in blocks(text):
        where = f"{path.name}:{line}"
        if lang in ("python", "py"):
            if expected:
                raise AssertionError(f"{where}: exit markers apply to console blocks only")
            code = compile("\n" * (line - 1) + body, str(path), "exec", dont_inherit=True)
            exec(code, namespace)
        elif lang == "console":
            for cmd in console_commands(body):
                if cmd.startswith("augmentedgp "):
                    run_cli(cmd, expected, where)
                elif not _is_setup(cmd):
                    raise AssertionError(f"{where}: console command `{cmd}` is neither an "
                                         "`augmentedgp` command nor a set-up command")
        elif lang in ("bash", "sh", "shell"):
            for raw in body.splitlines():
                raw = raw.split("#", 1)[0].strip()
                for cmd in filter(None, (c.strip() for c in raw.split("&&"))):
                    if not (_is_setup(cmd) or cmd in SHELL_ALSO):
                        raise AssertionError(f"{where}: `{cmd}` in a shell block; shell "
                                             "blocks may hold set-up commands only")
    return namespace


def _close_figures():
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def run_file(path: str, workdir: str):
    """Worker entry point: run one Markdown file in ``workdir``; returns (traceback or
    None, captured output)."""
    os.environ["MPLBACKEND"] = "Agg"
    out = io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(workdir)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            run_markdown(Path(path))
        return None, out.getvalue()
    except BaseException:  # reported by the file's test in the pytest process
        return traceback.format_exc(), out.getvalue()
    finally:
        _close_figures()
        os.chdir(cwd)


def _worker_init():
    os.environ["MPLBACKEND"] = "Agg"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import augmentedgp  # noqa: F401  (float64 before any array)


@pytest.fixture(scope="module")
def second_lane(request, tmp_path_factory):
    """{file: future} for the SECOND_LANE files among the selected doc tests, submitted to
    one spawned worker process; empty when AGP_DOCS_WORKERS=0 or fewer than two doc files
    were selected."""
    selected = [item.callspec.params["path"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_doc_examples_run"
                and hasattr(item, "callspec")]
    if os.environ.get("AGP_DOCS_WORKERS", "1") == "0" or len(selected) < 2:
        yield {}
        return
    mine = [p for p in selected if p.name in SECOND_LANE]
    if not mine:
        yield {}
        return
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # inherited by the worker
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init)
    futures = {p: pool.submit(run_file, str(p), str(tmp_path_factory.mktemp(p.stem)))
               for p in mine}
    try:
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_examples_run(path, second_lane, tmp_path, monkeypatch):
    if path in second_lane:
        error, output = second_lane[path].result(timeout=900)
        if error is not None:
            pytest.fail(f"{path.name} failed in the worker process:\n{error}\n"
                        f"--- output ---\n{output[-4000:]}", pytrace=False)
        return
    monkeypatch.setenv("MPLBACKEND", "Agg")
    if "matplotlib" in sys.modules:
        sys.modules["matplotlib"].use("Agg")
    monkeypatch.chdir(tmp_path)
    # one BLAS thread, as conftest intends: a pytest plugin may import numpy (and start
    # OpenBLAS's threads) before conftest sets OPENBLAS_NUM_THREADS, and the worker
    # process runs beside this one
    from threadpoolctl import threadpool_limits

    try:
        with threadpool_limits(limits=1, user_api="blas"):
            run_markdown(path)
    finally:
        _close_figures()


def test_runner_fails_on_broken_examples(tmp_path, monkeypatch):
    """The runner is not vacuous: errors, wrong exit codes and stray commands fail."""
    monkeypatch.chdir(tmp_path)
    md = tmp_path / "broken.md"
    good = "Text\n\n```python\nx = 1\n```\n\n```python\nassert x == 1\n```\n"
    assert run_markdown(md, good)["x"] == 1
    with pytest.raises(ZeroDivisionError):
        run_markdown(md, "```python\n1 / 0\n```\n")
    with pytest.raises(AssertionError, match="exited with 0, expected 2"):
        run_markdown(md, "<!-- exit 2 -->\n```console\n$ augmentedgp info\n```\n")
    with pytest.raises(AssertionError, match="exited with 2, expected 0"):
        run_markdown(md, "```console\n$ augmentedgp predict missing_dir x.csv\n```\n")
    with pytest.raises(AssertionError, match="neither"):
        run_markdown(md, "```console\n$ rm -rf build\n```\n")
    with pytest.raises(AssertionError, match="set-up commands only"):
        run_markdown(md, "```bash\npip install . && python evil.py\n```\n")
    run_markdown(md, "<!-- exit 2 -->\n\n```console\n$ augmentedgp predict no_dir x.csv\n"
                     "Error: ...\n```\n")


def _index_targets():
    text = (DOCS / "index.md").read_text()
    return re.findall(r"\]\((tutorials/[^)#\s]+\.md)\)", text)


def test_index_lists_every_tutorial_and_capability():
    listed = _index_targets()
    assert listed, "docs/index.md lists no tutorials"
    for rel in listed:
        assert (DOCS / rel).is_file(), f"docs/index.md links to missing {rel}"
    files = {f"tutorials/{p.name}" for p in (DOCS / "tutorials").glob("*.md")}
    assert files == set(listed), f"tutorials not listed in docs/index.md: {files - set(listed)}"
    for capability, name in CAPABILITIES.items():
        assert f"tutorials/{name}" in listed, f"no tutorial for {capability} ({name})"
        text = (DOCS / "tutorials" / name).read_text()
        assert "```python" in text or "```console" in text, f"{name} has no examples"
    readme = (ROOT / "README.md").read_text()
    for name in CAPABILITIES.values():
        assert f"docs/tutorials/{name}" in readme, f"README.md does not link to {name}"


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    text = FENCE.sub("", path.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file = target.split("#", 1)[0]
        assert (path.parent / file).exists(), f"{path.name}: broken link {target}"


def _gen_api():
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_up_to_date():
    gen = _gen_api()
    assert gen.OUT.read_text() == gen.render(), \
        "docs/api.md is stale: run `python docs/gen_api.py`"


def test_every_public_name_has_a_docstring():
    missing = _gen_api().undocumented()
    assert not missing, f"public names without a docstring: {missing}"

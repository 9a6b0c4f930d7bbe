"""The optional dependencies stay optional: ``import augmentedgp`` and the core models work
without the extras' packages (scikit-learn, typer, pandas, pyarrow, matplotlib, Dask), and
the front ends that need one name the extra to install.

Each check runs in a fresh interpreter in which the extras' packages cannot be imported (a
meta-path finder refuses them, as if they were not installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("sklearn", "typer", "click", "pandas", "pyarrow", "matplotlib", "dask",
            "distributed")

BLOCK = """
import sys

class _NotInstalled:
    blocked = set({blocked!r})

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def run_without(code: str, blocked=OPTIONAL) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which ``blocked`` cannot be imported."""
    prelude = BLOCK.format(blocked=tuple(blocked))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_import_and_fit_without_the_extras():
    result = run_without("""
        import numpy as np
        import augmentedgp as agp

        X = np.linspace(-2, 2, 30)[:, None]
        y = np.sin(2 * X[:, 0])
        post = agp.fit(agp.GP(agp.kernels.RBF(), noise=0.1), X, y, max_iter=20)
        mean, var = post.predict_f(X)
        assert mean.shape == (30,) and var.shape == (30,)
        assert float(np.max(np.abs(np.asarray(mean) - y))) < 0.3
        loaded = [m for m in _NotInstalled.blocked if m in sys.modules]
        assert not loaded, loaded
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_the_estimators_name_the_sklearn_extra():
    result = run_without("""
        import augmentedgp as agp
        try:
            agp.sklearn.GPClassifier
        except ImportError as err:
            print(err)
        else:
            raise SystemExit("no ImportError")
    """)
    assert result.returncode == 0, result.stderr
    assert 'pip install "augmentedgp[sklearn]"' in result.stdout


def test_the_console_script_names_the_cli_extra():
    result = run_without("""
        sys.argv = ["augmentedgp", "demo"]
        from augmentedgp.launcher import main
        main()
    """)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert 'pip install "augmentedgp[cli]"' in result.stderr
    assert "Traceback" not in result.stderr


def test_a_command_needing_pandas_names_the_cli_extra():
    """typer installed, pandas not: the command that needs pandas exits 2 with the extra."""
    result = run_without("""
        sys.argv = ["augmentedgp", "datasets"]
        from augmentedgp.launcher import main
        main()
    """, blocked=("pandas", "pyarrow"))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "pandas" in result.stderr and 'pip install "augmentedgp[cli]"' in result.stderr
    assert "Traceback" not in result.stderr


def test_the_console_script_is_the_launcher():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'augmentedgp = "augmentedgp.launcher:main"' in text
    core = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    for name in ("scikit-learn", "typer", "pandas", "pyarrow", "matplotlib", "dask"):
        assert name not in core, f"{name} is a core dependency"

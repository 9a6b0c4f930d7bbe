"""The ``augmentedgp`` console script: runs :mod:`augmentedgp.cli`, which needs the ``cli``
extra (typer; pandas, pyarrow and scikit-learn for ``datasets``, ``fit``, ``predict`` and
``evaluate``).

Without one of those packages the command prints which extra to install and exits with
code 2 (bad usage, the click convention of the CLI) instead of raising a traceback.
"""

from __future__ import annotations

import sys

# top-level package of an optional dependency -> the extra that installs it
EXTRA_OF = {"typer": "cli", "click": "cli", "pandas": "cli", "pyarrow": "cli",
            "sklearn": "cli", "matplotlib": "plot"}


def missing_extra(err: ImportError) -> str | None:
    """The extra that installs the package whose import failed, or None when the failed
    import is not one of the optional dependencies."""
    name = (err.name or "").split(".")[0]
    return EXTRA_OF.get(name)


def _report(err: ImportError, extra: str) -> int:
    package = (err.name or "").split(".")[0]
    package = "scikit-learn" if package == "sklearn" else package
    print(f"augmentedgp: the command line needs {package}, which is not installed.\n"
          f'Install the {extra!r} extra: pip install "augmentedgp[{extra}]"', file=sys.stderr)
    return 2


def main() -> None:
    """Entry point of the ``augmentedgp`` command."""
    try:
        from augmentedgp.cli import main as cli_main
    except ImportError as err:
        extra = missing_extra(err)
        if extra is None:
            raise
        sys.exit(_report(err, extra))
    try:
        cli_main()
    except ImportError as err:  # a command that needs pandas, pyarrow or scikit-learn
        extra = missing_extra(err)
        if extra is None:
            raise
        sys.exit(_report(err, extra))


if __name__ == "__main__":
    main()

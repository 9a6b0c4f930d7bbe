"""Tables (CSV, Parquet) read into (X, y) at the public boundary, with errors that name the
file, the column and the 1-based data row. Used by the command line and by the distributed
executors' file and dataframe sources; pandas (the ``cli`` or ``distributed`` extra) is
imported on first use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

SUFFIXES = {".csv": "csv", ".txt": "csv", ".parquet": "parquet", ".pq": "parquet"}


def read_table(path: str | Path) -> pd.DataFrame:
    """A CSV or Parquet file as a pandas DataFrame (clear errors for missing, empty,
    unreadable or unsupported files, and for a header without rows)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist or is not a file")
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: unsupported file type {path.suffix.lower()!r}; use .csv or "
                         ".parquet")
    try:
        frame = pd.read_csv(path) if kind == "csv" else pd.read_parquet(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err}") from None
    if frame.shape[0] == 0:
        raise ValueError(f"{path} has a header but no data rows")
    return frame


def check_columns(frame, columns, where, numeric: bool = True) -> None:
    """Every value of ``columns`` present and (if ``numeric``) numeric and finite; rows are
    reported 1-based, counting data rows (the header is not a row)."""
    import pandas as pd

    for col in columns:
        values = frame[col]
        if numeric and not pd.api.types.is_numeric_dtype(values):
            bad = pd.to_numeric(values, errors="coerce").isna() & values.notna()
            row = int(np.argmax(bad.to_numpy()))
            raise ValueError(f"{where}: column {col!r} is not numeric (row {row + 1} holds "
                             f"{values.iloc[row]!r}); encode categorical columns as numbers")
        missing = values.isna().to_numpy()
        if numeric and pd.api.types.is_float_dtype(values):
            missing = missing | ~np.isfinite(values.to_numpy(dtype=float))
        if missing.any():
            row = int(np.argmax(missing))
            raise ValueError(f"{where}: column {col!r} has a missing or non-finite value in row "
                             f"{row + 1} ({int(missing.sum())} such rows in all)")


def features(frame: pd.DataFrame, where: str, names=None, exclude=(), role: str = "feature"
            ) -> pd.DataFrame:
    """The (n, d) feature columns as floats (a DataFrame, so column names travel on): the
    columns ``names``, or all columns but ``exclude``."""
    if names is None:
        names = [c for c in frame.columns if c not in exclude]
        if not names:
            raise ValueError(f"{where} has no feature columns besides the target")
    else:
        missing = [c for c in names if c not in frame.columns]
        if missing:
            raise ValueError(f"{where} lacks the {role} columns {missing[:10]}"
                             f"{' ...' if len(missing) > 10 else ''}")
    check_columns(frame, names, where)
    return frame[list(names)].astype(float)


def target(frame, name, where, numeric: bool = True) -> np.ndarray:
    """The (n,) target column ``name`` (labels of any type when not ``numeric``)."""
    if name not in frame.columns:
        raise ValueError(f"{where} has no target column {name!r}; {name!r} is not among the "
                         f"columns {list(frame.columns)[:20]}")
    check_columns(frame, [name], where, numeric=numeric)
    return frame[name].to_numpy(copy=True)


def frame_xy(frame: pd.DataFrame, name: str, names, where: str, numeric_target: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of a table: the target column ``name`` and the feature columns ``names``
    (default: all the others)."""
    y = target(frame, name, where, numeric=numeric_target)
    return features(frame, where, names=names, exclude=(name,)).to_numpy(copy=True), y


__all__ = ["read_table", "check_columns", "features", "target", "frame_xy", "SUFFIXES"]

"""Adversarial cases of the public boundary (issue 24): the outcome classifier, the
recorder and the hypothesis strategies shared by ``tests/test_properties.py`` and
``benchmarks/adversarial.py``.

Every public call must end in one of

- a finite result (no NaN or inf in any returned array), or
- a typed error: a ValueError / TypeError raised by the library's (or scikit-learn's)
  boundary checks whose message names the offending argument, an
  ``augmentedgp.core.errors.AugmentedGPError``, or scikit-learn's ``NotFittedError``.

Anything else is a failure: a non-finite result, any other exception (IndexError,
KeyError, AttributeError, ZeroDivisionError, OverflowError, RecursionError, JAX's
internal errors), a ValueError / TypeError raised inside numpy / JAX / scipy or naming no
argument, or a call that runs past the per-case timeout (a hang).

Inputs are drawn as small *recipes* (NamedTuples of choices: shape, dtype, injected
values, magnitude, seed) that hypothesis shrinks; ``build_X`` / ``build_y`` turn a recipe
into arrays, so a failure's recipe is its reproduction.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import re
import signal
import sys
import time
import traceback
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

TIMEOUT_S = int(os.environ.get("AGP_PROPERTY_TIMEOUT", "60"))
RECORD = os.environ.get("AGP_PROPERTY_RECORD")  # JSONL file of every case (the benchmark)

# --- outcomes ----------------------------------------------------------------------------

FINITE, TYPED, FAILURE, HANG = "finite", "typed", "failure", "hang"
# where a plain ValueError / TypeError is an internal error, not a boundary check
_INTERNAL = ("jax", "jaxlib", "numpy", "scipy", "optax", "equinox", "lineax", "optimistix")
_JAX_MESSAGES = ("Reverse-mode differentiation", "Abstract tracer", "Tracer", "XlaRuntime",
                 "ConcretizationTypeError", "TracerBoolConversion", "Incompatible shapes for "
                 "broadcasting", "dot_general requires", "MLIR")


class Outcome(NamedTuple):
    """How one call ended: ``kind`` (finite, typed, failure, hang), ``detail`` (the exception
    type or the non-finite path) and the first line of the message."""

    kind: str
    detail: str = ""
    message: str = ""
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.kind in (FINITE, TYPED)


class CaseTimeout(BaseException):
    """The per-case alarm (a BaseException: the library's ``except Exception`` cannot
    swallow it)."""


def _alarm(signum, frame):
    raise CaseTimeout


def _raise_site(err: BaseException) -> str:
    """The module path of the innermost frame of the traceback (where it was raised)."""
    tb = traceback.extract_tb(err.__traceback__)
    return tb[-1].filename if tb else ""


def _site_module(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    if "augmentedgp" in parts:
        return "augmentedgp"
    return parts[-1]


def _location(err: BaseException) -> str:
    """file:line of the innermost augmentedgp frame (the probable culprit)."""
    tb = traceback.extract_tb(err.__traceback__)
    for frame in reversed(tb):
        if "/augmentedgp/" in frame.filename.replace("\\", "/"):
            return f"{frame.filename.split('/augmentedgp/')[-1]}:{frame.lineno}"
    return f"{_site_module(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""


def names_argument(message: str, names) -> bool:
    """Whether ``message`` names one of ``names`` as a word (or a --option)."""
    return any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", message) for n in names)


def _nonfinite_path(obj, path="result", depth=0):
    """The path of the first non-finite number in ``obj`` (None if all finite)."""
    if depth > 12 or obj is None or isinstance(obj, (str, bytes, bool, np.bool_)):
        return None
    if type(obj).__name__ == "History":  # step_size is NaN by design where there is none
        return None
    if isinstance(obj, (int, np.integer)):
        return None
    if isinstance(obj, (float, np.floating, complex, np.complexfloating)):
        return None if np.isfinite(obj) else path
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        try:
            arr = np.asarray(obj)
        except Exception:  # a typed PRNG key and such: not numbers
            return None
        if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
            return f"{path} (shape {arr.shape})"
        return None
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif dataclasses.is_dataclass(obj):
        items = ((f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj))
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("augmentedgp"):
        items = vars(obj).items()
    else:
        return None
    for k, v in items:
        bad = _nonfinite_path(v, f"{path}.{k}" if not isinstance(k, int) else f"{path}[{k}]",
                              depth + 1)
        if bad:
            return bad
    return None


def classify(call, names, timeout: int = TIMEOUT_S, typed=()) -> Outcome:
    """Run ``call()`` under a ``timeout``-second alarm and classify how it ended;
    ``names`` are the argument names a typed error may name; ``typed`` more exception types
    that count as typed errors whatever their message."""
    from sklearn.exceptions import NotFittedError

    from augmentedgp.core.errors import AugmentedGPError

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        result = call()
    except CaseTimeout:
        return Outcome(HANG, "timeout", f"no result after {timeout} s")
    except (AugmentedGPError, NotFittedError, *typed) as err:
        return Outcome(TYPED, type(err).__name__, _first_line(err))
    except (ValueError, TypeError) as err:
        msg = _first_line(err)
        module = type(err).__module__.split(".")[0]
        site = _site_module(_raise_site(err))
        if module in ("jax", "jaxlib") or any(m in str(err) for m in _JAX_MESSAGES):
            return Outcome(FAILURE, f"JAX {type(err).__name__}", msg, _location(err))
        if site in _INTERNAL:
            return Outcome(FAILURE, f"{type(err).__name__} inside {site}", msg, _location(err))
        if not names_argument(str(err), names):
            return Outcome(FAILURE, f"{type(err).__name__} naming no argument", msg,
                           _location(err))
        return Outcome(TYPED, type(err).__name__, msg)
    except RecursionError as err:
        return Outcome(FAILURE, "RecursionError", _first_line(err), _location(err))
    except Exception as err:  # noqa: BLE001 -- every other exception is the failure itself
        return Outcome(FAILURE, type(err).__name__, _first_line(err), _location(err))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    bad = _nonfinite_path(result)
    if bad:
        return Outcome(FAILURE, "non-finite result", bad)
    return Outcome(FINITE)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


class Recorder:
    """Collects the outcome of every case; with ``AGP_PROPERTY_RECORD`` set, appends each
    as a JSON line (``start`` before the call, so a killed process leaves its hang)."""

    def __init__(self):
        self.outcomes: dict[str, list[tuple[Outcome, str]]] = {}

    def start(self, entry: str, case: str):
        if RECORD:
            with open(RECORD, "a") as fh:
                fh.write(json.dumps({"event": "start", "entry": entry, "case": case}) + "\n")

    def add(self, entry: str, case: str, outcome: Outcome, seconds: float):
        self.outcomes.setdefault(entry, []).append((outcome, case))
        if RECORD:
            with open(RECORD, "a") as fh:
                fh.write(json.dumps({"event": "end", "entry": entry, "case": case,
                                     "seconds": round(seconds, 3), **outcome._asdict()}) + "\n")

    def run(self, entry: str, case: Any, call, names, typed=()) -> Outcome:
        text = repr(case)
        self.start(entry, text)
        t0 = time.perf_counter()
        if RECORD:  # a hang inside compiled code, where the alarm cannot interrupt it
            faulthandler.dump_traceback_later(3 * TIMEOUT_S, exit=True)
        try:
            outcome = classify(call, names, typed=typed)
        finally:
            if RECORD:
                faulthandler.cancel_dump_traceback_later()
        self.add(entry, text, outcome, time.perf_counter() - t0)
        return outcome


RECORDER = Recorder()

# --- inputs ------------------------------------------------------------------------------

SPECIAL = ("none", "nan", "inf", "-inf", "duplicate rows", "constant column")
DTYPES = ("float", "float", "float", "int", "bool", "object", "str", "complex", "list",
          "float32")


class ArrayRecipe(NamedTuple):
    """An (n, d) input matrix: shape, dtype, magnitude 10^scale, one injected defect."""

    n: int = 8
    d: int = 1
    ndim: int = 2
    dtype: str = "float"
    scale: int = 0
    special: str = "none"
    seed: int = 0


def build_X(r: ArrayRecipe):
    rng = np.random.default_rng(r.seed)
    X = rng.normal(size=(r.n, r.d)) * 10.0 ** r.scale
    if r.special in ("nan", "inf", "-inf") and X.size:
        X.flat[rng.integers(X.size)] = float(r.special)
    elif r.special == "duplicate rows" and r.n > 1:
        X[1:] = X[0]
    elif r.special == "constant column" and r.d:
        X[:, 0] = 1.0
    if r.ndim == 1:
        X = X[:, 0] if r.d else np.zeros(r.n)
    elif r.ndim == 3:
        X = X[:, :, None]
    elif r.ndim == 0:
        X = np.asarray(X.ravel()[0] if X.size else 0.0)
    return _cast(X, r.dtype)


def _cast(A, dtype):
    if dtype == "int":
        return np.nan_to_num(A, posinf=1e18, neginf=-1e18).astype(np.int64)
    if dtype == "bool":
        return A > 0
    if dtype == "object":
        out = np.empty(A.shape, dtype=object)
        out[...] = A
        return out
    if dtype == "str":
        return A.astype(str)
    if dtype == "complex":
        return A + 1j
    if dtype == "list":
        return A.tolist()
    if dtype == "float32":
        return A.astype(np.float32)
    return A


class TargetRecipe(NamedTuple):
    """Targets: ``kind`` (real, binary01, binarypm, counts, classes, one class, strings,
    mixed labels, negative counts, fractions), length offset from n, defect, dtype."""

    kind: str = "real"
    offset: int = 0
    special: str = "none"
    dtype: str = "float"
    ndim: int = 1
    seed: int = 0


TARGET_KINDS = ("real", "binary01", "binarypm", "counts", "classes3", "one class", "strings",
                "mixed labels", "negative", "fraction", "huge")


def build_y(r: TargetRecipe, n: int):
    rng = np.random.default_rng(r.seed + 1)
    m = max(n + r.offset, 0)
    base = {"real": lambda: rng.normal(size=m),
            "binary01": lambda: (np.arange(m) % 2).astype(float),
            "binarypm": lambda: np.where(np.arange(m) % 2, 1.0, -1.0),
            "counts": lambda: rng.poisson(3.0, size=m).astype(float),
            "classes3": lambda: (np.arange(m) % 3).astype(float),
            "one class": lambda: np.ones(m),
            "negative": lambda: -rng.poisson(3.0, size=m).astype(float) - 1,
            "fraction": lambda: rng.uniform(0.05, 0.95, size=m),
            "huge": lambda: rng.normal(size=m) * 1e300}
    if r.kind == "strings":
        y = np.array(["a", "b", "c"] * (m // 3 + 1))[:m]
    elif r.kind == "mixed labels":
        y = np.array(([1, "b", 2.5] * (m // 3 + 1))[:m], dtype=object)
    else:
        y = base[r.kind]()
        if r.special in ("nan", "inf", "-inf") and m:
            y[rng.integers(m)] = float(r.special)
        y = _cast(y, r.dtype)
    if r.ndim == 2:
        y = np.asarray(y)[:, None] if np.ndim(y) == 1 else y
    elif r.ndim == 0:
        y = np.asarray(y).ravel()[:1].reshape(()) if m else np.float64(1.0)
    return y


@st.composite
def arrays(draw, n=None, d=None, fixed=False):
    """An ArrayRecipe: valid content mostly; with ``fixed`` only (n, d) as given."""
    bad = draw(st.integers(0, 9)) >= (6 if not fixed else 10)  # 40% adversarial, unless fixed
    if fixed or not bad:
        return ArrayRecipe(n=n or 8, d=d or 1, seed=draw(st.integers(0, 2**16)))
    return ArrayRecipe(
        n=draw(st.sampled_from([n or 8, 1, 2, 3, 0, 40]) if draw(st.booleans())
               else st.just(n or 8)),
        d=draw(st.sampled_from([d or 1, 1, 2, 4, 0])),
        ndim=draw(st.sampled_from([2, 2, 2, 1, 3, 0])),
        dtype=draw(st.sampled_from(DTYPES)),
        scale=draw(st.sampled_from([0, 0, -300, -150, -20, 20, 150, 300, 307])),
        special=draw(st.sampled_from(SPECIAL)),
        seed=draw(st.integers(0, 2**16)))


@st.composite
def targets(draw, kind, adversarial=True):
    """A TargetRecipe of ``kind`` mostly, or an adversarial one."""
    if not adversarial or draw(st.integers(0, 9)) < 6:
        return TargetRecipe(kind=kind, seed=draw(st.integers(0, 2**16)))
    return TargetRecipe(
        kind=draw(st.sampled_from((kind,) * 3 + TARGET_KINDS)),
        offset=draw(st.sampled_from([0, 0, 0, -1, 1, -100])),
        special=draw(st.sampled_from(("none", "nan", "inf", "-inf"))),
        dtype=draw(st.sampled_from(("float", "float", "int", "bool", "object", "str",
                                    "complex", "list"))),
        ndim=draw(st.sampled_from([1, 1, 1, 2, 0])),
        seed=draw(st.integers(0, 2**16)))


BAD_INTS = (0, -1, -5, 2.5, None, True, False, "5", float("nan"), float("inf"), 10**30,
            np.int64(3), 3.0, [3], complex(3, 0))
BAD_FLOATS = (0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e-300, 1e300, None, True,
              "0.1", complex(1, 1), [0.1, 0.2], np.float32(0.1))


def int_setting(valid):
    """A valid integer setting from ``valid`` (mostly) or a bad one."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid),
                     st.sampled_from(BAD_INTS))


def float_setting(valid):
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid),
                     st.sampled_from(BAD_FLOATS))


def version_info() -> str:
    import jax

    return f"python {sys.version.split()[0]}, jax {jax.__version__}, numpy {np.__version__}"

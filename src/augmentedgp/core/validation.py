"""Checks at the public boundary: bad input fails early with a ValueError naming the argument."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jaxtyping import ArrayLike, Float, PRNGKeyArray, Shaped


def as_real(value: npt.ArrayLike, name: str, what: str) -> np.ndarray:
    """``value`` as a float array; a ValueError naming ``name`` if it is not numeric or is
    complex (numpy would drop the imaginary part with only a warning)."""
    try:
        arr = np.asarray(value)
        real = not np.iscomplexobj(arr)
        if real:
            arr = arr.astype(float, copy=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be {what}: {err}") from None
    if not real:
        raise ValueError(f"{name} must be real-valued, got complex numbers")
    return arr


def check_X(X: npt.ArrayLike, name: str = "X", d: int | None = None
            ) -> Float[np.ndarray, "n d"]:
    """A finite, non-empty float array of shape (n, d)."""
    arr = as_real(X, name, "a numeric array of shape (n, d)")
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D of shape (n, d), got shape {arr.shape}"
            + (" (use X.reshape(-1, 1) for one input column)" if arr.ndim == 1 else "")
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must have at least one row and one column, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    if d is not None and arr.shape[1] != d:
        raise ValueError(
            f"{name} must have {d} columns (as the training inputs), got {arr.shape[1]}"
        )
    return arr


def is_concrete(x) -> bool:
    """Whether ``x`` holds values now (not a tracer of jit / vmap / grad): value checks of
    functions that also run compiled happen only then, so compiled loops pay nothing."""
    return not isinstance(x, jax.core.Tracer)


def check_inputs(A: Float[npt.ArrayLike, "n d"], name: str = "X") -> Float[jax.Array, "n d"]:
    """``A`` as a real 2-D JAX array (n, d >= 1), or a TypeError / ValueError naming
    ``name``: the tracer-aware counterpart of :func:`check_X` used by kernels and mean
    functions. Shapes and dtypes are checked always, NaN / inf only on concrete values
    (not under ``jit`` / ``vmap`` / ``grad``); lists, integer and boolean arrays are
    converted to float."""
    if not isinstance(A, jax.Array):  # numpy arrays, lists, scalars; tracers are jax.Arrays
        try:
            A = np.asarray(A)
            if A.dtype.kind == "O":
                A = A.astype(float)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a real numeric array of shape (n, d): {err}"
                            ) from None
    dtype = A.dtype
    integral = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)
    if not (integral or jnp.issubdtype(dtype, jnp.floating)):
        raise TypeError(f"{name} must be real-valued, got an array of dtype {dtype}")
    if A.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D of shape (n, d), got shape {tuple(A.shape)}"
            + (f" (use {name}.reshape(-1, 1) for one input column)" if A.ndim == 1 else "")
        )
    if A.shape[1] == 0:
        raise ValueError(f"{name} must have at least one column, got shape {tuple(A.shape)}")
    A = jnp.asarray(A, dtype=float) if integral else jnp.asarray(A)
    # numpy, not jnp: under a trace jnp would stage even a concrete array's check
    if is_concrete(A) and not np.all(np.isfinite(np.asarray(A))):
        raise ValueError(f"{name} contains NaN or inf")
    return A


def check_finite(arr: npt.ArrayLike, name: str = "y") -> Float[np.ndarray, " ..."]:
    """A finite float array (raises ValueError naming ``name``)."""
    arr = as_real(arr, name, "numeric")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def check_vector(y: npt.ArrayLike, n: int, name: str = "y") -> Shaped[np.ndarray, " n"]:
    """A vector of length n, of any dtype (an (n, 1) column is accepted)."""
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D of shape (n,), got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but X has {n} rows")
    return arr


def check_y(y: npt.ArrayLike, n: int, name: str = "y") -> Float[np.ndarray, " n"]:
    """A finite float vector of length n (an (n, 1) column is accepted)."""
    return check_finite(check_vector(y, n, name), name)


def check_Xy(X: npt.ArrayLike, y: npt.ArrayLike
             ) -> tuple[Float[np.ndarray, "n d"], Float[np.ndarray, " n"]]:
    """Validated inputs (n, d) and targets (n,) (raises ValueError)."""
    X = check_X(X)
    return X, check_y(y, X.shape[0])


def check_counts(y: npt.ArrayLike, name: str = "y", integer: bool = True
                 ) -> Float[np.ndarray, " ..."]:
    """Non-negative integer counts (any non-negative values if not ``integer``), as floats
    (:func:`check_finite` first); a ValueError naming ``name`` otherwise."""
    arr = check_finite(y, name)
    if np.any(arr < 0):
        raise ValueError(f"{name} must hold non-negative counts, got minimum {arr.min()}")
    if integer and np.any(arr != np.round(arr)):
        bad = arr[arr != np.round(arr)]
        raise ValueError(f"{name} must hold integer counts, got non-integer values {bad[:6]}")
    return arr


def check_binary(y: npt.ArrayLike, name: str = "y") -> Float[np.ndarray, " n"]:
    """Binary labels in {0, 1} or {-1, +1} (or booleans) -> float array in {-1, +1}."""
    arr = np.asarray(y)
    if arr.dtype.kind in "bO":  # booleans; numbers in an object array
        try:
            arr = arr.astype(float, copy=False)
        except (TypeError, ValueError):
            pass
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold binary labels in {{0, 1}} or {{-1, +1}} (numbers), "
                         f"got an array of dtype {arr.dtype}")
    values = set(np.unique(arr).tolist())
    if values <= {0.0, 1.0}:
        return np.where(arr > 0, 1.0, -1.0)
    if values <= {-1.0, 1.0}:
        return arr.astype(float)
    raise ValueError(
        f"{name} must hold binary labels in {{0, 1}} or {{-1, +1}}, got values "
        f"{sorted(values)[:6]}"
    )


def unique_labels(arr: np.ndarray, name: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(arr, return_inverse=True)`` for labels; labels that cannot be ordered
    (strings mixed with numbers in an object array) are a ValueError naming the argument
    instead of numpy's TypeError."""
    try:
        return np.unique(arr, return_inverse=True)
    except TypeError:
        kinds = sorted({type(v).__name__ for v in np.ravel(arr).tolist()})
        raise ValueError(f"{name} mixes label types {kinds}: give labels of one type (all "
                         "strings or all numbers)") from None


#: Values an array allocated at a user's request may hold (float64: 16 GiB): counts beyond
#: this are refused with a ValueError before anything is allocated.
MAX_VALUES = 2**31
#: Iteration and sample counts: 32-bit loop counters.
MAX_COUNT = 2**31 - 1


def check_int(value: object, name: str, low: int = 1, allow_none: bool = False,
              high: int = MAX_COUNT) -> int | None:
    """``value`` as an int in [``low``, ``high``] (an integral float such as 3.0 is
    accepted; booleans, strings and fractions are not; the default ``high`` is the largest
    32-bit loop counter), or None if ``allow_none``; a ValueError naming the argument
    otherwise."""
    if value is None and allow_none:
        return None
    ok = (not isinstance(value, bool | np.bool_) and isinstance(value, numbers.Real)
          and float(value).is_integer() and value >= low)
    if not ok:
        bound = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValueError(f"{name} must be {bound}{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    if value > high:
        raise ValueError(f"{name} must be at most {high}, got {value!r}")
    return int(value)


def check_real(value: object, name: str, *, low: float | None = None,
               high: float | None = None, open_low: bool = False, open_high: bool = False,
               allow_none: bool = False) -> float | None:
    """``value`` as a finite real scalar (a number or a 0-d array; not a boolean or a
    string) within [low, high] (``open_low`` / ``open_high`` exclude the bound), or None if
    ``allow_none``; a ValueError naming the argument otherwise."""
    if value is None and allow_none:
        return None
    lo = "" if low is None else f"{'(' if open_low else '['}{low:g}"
    hi = "" if high is None else f"{high:g}{')' if open_high else ']'}"
    where = (f" in {lo}, {hi}" if lo and hi else
             f" {'>' if open_low else '>='} {low:g}" if lo else
             f" {'<' if open_high else '<='} {high:g}" if hi else "")
    try:
        arr = None if isinstance(value, bool | np.bool_ | str | bytes) else np.asarray(value)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.dtype.kind not in "iuf":
        what = ("a positive real number" if (low, high, open_low) == (0.0, None, True) else
                f"a real number{where}")
        raise ValueError(f"{name} must be {what}{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar, got an array of shape {arr.shape}")
    x = float(arr)
    if not np.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if ((low is not None and (x <= low if open_low else x < low))
            or (high is not None and (x >= high if open_high else x > high))):
        raise ValueError(f"{name} must be{where}, got {value!r}")
    return x


def check_positive(value: object, name: str) -> float:
    """``value`` as a finite real scalar > 0 (:func:`check_real` with an open lower bound
    at 0)."""
    return check_real(value, name, low=0.0, open_low=True)


def check_key(key: object, name: str = "key", allow_none: bool = False) -> PRNGKeyArray | None:
    """``key`` as one JAX PRNG key: a typed key (``jax.random.key(seed)``, shape ()) or a
    legacy raw key (``jax.random.PRNGKey(seed)``, uint32 of shape (2,)); or None if
    ``allow_none``. A TypeError naming the argument for anything else (None, an int
    seed, a float array), a ValueError for a batch of keys or a raw key of the wrong
    shape."""
    if key is None and allow_none:
        return None
    hint = "pass jax.random.key(seed)"
    dtype = getattr(key, "dtype", None)
    if dtype is None or not hasattr(key, "shape"):
        raise TypeError(f"{name} must be a JAX PRNG key ({hint}), got {type(key).__name__} "
                        f"{key!r}")
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{name} must be a single PRNG key, got a batch of shape "
                             f"{key.shape} (index or split it)")
        return key
    if dtype != np.uint32:
        raise TypeError(f"{name} must be a JAX PRNG key ({hint}), got an array of dtype "
                        f"{dtype}")
    if tuple(key.shape) != (2,):
        raise ValueError(f"{name} must be a single PRNG key: a raw key has shape (2,), got "
                         f"shape {tuple(key.shape)} ({hint})")
    return key


def require_finite(what: str, *values) -> ArrayLike | tuple[ArrayLike, ...]:
    """``values`` as they are if finite or traced (under jit nothing can be raised: callers
    such as ``models.sites.check_moments`` check there); otherwise a ValueError saying that
    ``what`` exceeds float64."""
    if not all(is_concrete(v) for v in values):
        return values if len(values) > 1 else values[0]
    if not all(np.all(np.isfinite(np.asarray(v))) for v in values):
        raise ValueError(f"{what} exceeds float64 (its true value overflows, not a numerical "
                         "failure); rescale the targets or shrink the latent mean / variance")
    return values if len(values) > 1 else values[0]

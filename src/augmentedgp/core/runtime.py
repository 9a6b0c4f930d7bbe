"""Process-wide runtime settings, applied once when augmentedgp is imported: the threads of
the BLAS behind JAX's CPU linear algebra, and JAX's persistent compilation cache.

**BLAS threads.** jaxlib's CPU Cholesky, triangular solves and other LAPACK kernels call
scipy's bundled OpenBLAS, whose worker threads must all be scheduled for every call: when
another process keeps a core busy, each multi-threaded call waits for time slices. Measured
on 2 cores with one kept busy by another process: a Cholesky of n = 200 took 168 ms with 2
BLAS threads against 0.34 ms with one, n = 5000 5.0 s against 1.3 s; an already-compiled
Laplace fit of 200 points 1-28 s instead of 0.1 s. On an idle machine, 2 threads gain
nothing at n = 200 and 1.9x at n = 5000 (0.95 s against 1.84 s). Importing augmentedgp
therefore limits the loaded BLAS pools to **one thread**, unless

- ``AUGMENTEDGP_BLAS_THREADS`` is set: ``N >= 1`` threads, or ``0`` to leave BLAS at its
  own default (every core: the fastest for large matrices on a machine nobody else uses);
- otherwise, ``OPENBLAS_NUM_THREADS``, ``GOTO_NUM_THREADS``, ``MKL_NUM_THREADS``,
  ``BLIS_NUM_THREADS`` or ``OMP_NUM_THREADS`` is set (by the user or a job scheduler): the
  BLAS pools are left as those variables made them.

``set_blas_threads`` changes the limit at run time; ``settings`` reports it. XLA's own CPU
thread pool (Eigen, for matrix products and fusions) is left alone: under the same load it
slowed a 1000 x 1000 product by at most 2.2x (measured), and it can only be configured
before JAX creates its CPU client (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``).

**Compilation cache.** Compiled XLA programs are saved in ``$XDG_CACHE_HOME/augmentedgp/jax``
(``~/.cache/augmentedgp/jax`` without ``XDG_CACHE_HOME``), so that a new process loads a
fit's programs instead of compiling them again; programs whose compilation took at least
``CACHE_MIN_COMPILE_SECONDS`` are saved. Nothing is changed when the user has configured a
cache directory (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) or disabled JAX's cache
(``JAX_ENABLE_COMPILATION_CACHE=false``), nor with ``AUGMENTEDGP_COMPILATION_CACHE=0``. When
the directory cannot be created or written, or belongs to another user, the cache stays off
(``settings().cache_reason`` says why). JAX treats its cache as trusted code: the directory
is created readable by its owner only.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import NamedTuple

import jax

BLAS_THREADS_VAR = "AUGMENTEDGP_BLAS_THREADS"
CACHE_VAR = "AUGMENTEDGP_COMPILATION_CACHE"
# the variables through which a user or a job scheduler chooses the BLAS thread count
USER_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS",
                  "BLIS_NUM_THREADS", "OMP_NUM_THREADS")
DEFAULT_BLAS_THREADS = 1
# every program: a fit also compiles dozens of small ones (0.02-0.1 s each) that JAX's own
# threshold (1 s) would skip; cached too, a warm first GPClassifier fit on 500 points took
# 1.0 s more than the second, against 1.75 s with a 0.1 s threshold (28 entries, 280 kB)
CACHE_MIN_COMPILE_SECONDS = 0.0
_OFF = ("0", "false", "no", "off")


class Settings(NamedTuple):
    """What augmentedgp's runtime policy did in this process."""

    blas_threads: int | None  # the limit augmentedgp applied; None: BLAS pools left alone
    blas_reason: str
    blas_pools: tuple[tuple[str, int], ...]  # (library file, threads) of each loaded BLAS
    cache_dir: str | None  # JAX's compilation cache directory (whoever set it); None: off
    cache_reason: str


_state = {"limiter": None, "blas_threads": None, "blas_reason": "", "cache_reason": ""}


def _controller():
    """threadpoolctl's view of the loaded native thread pools, after loading the OpenBLAS
    that jaxlib's CPU LAPACK kernels call (scipy's, through scipy.linalg.cython_lapack)."""
    import scipy.linalg.cython_lapack  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def set_blas_threads(n: int | None) -> None:
    """Limit the BLAS thread pools loaded in this process (JAX's CPU LAPACK kernels and
    numpy / scipy linear algebra) to ``n`` threads; ``None`` gives them back the thread
    counts they had before augmentedgp limited them. Applies to the whole process."""
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
        raise ValueError(f"n must be a positive integer or None, got {n!r}")
    if _state["limiter"] is not None:
        _state["limiter"].restore_original_limits()
        _state["limiter"] = None
    if n is None:
        _state.update(blas_threads=None, blas_reason="left alone (set_blas_threads(None))")
        return
    _state["limiter"] = _controller().limit(limits=int(n), user_api="blas")
    _state.update(blas_threads=int(n), blas_reason=f"set_blas_threads({int(n)})")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/augmentedgp/jax``, or ``~/.cache/augmentedgp/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "augmentedgp" / "jax"


def settings() -> Settings:
    """The BLAS limit and compilation cache in effect, and why (see the module docstring)."""
    pools = tuple((Path(p["filepath"]).name, int(p["num_threads"]))
                  for p in _controller().info() if p["user_api"] == "blas")
    return Settings(_state["blas_threads"], _state["blas_reason"], pools,
                    jax.config.jax_compilation_cache_dir, _state["cache_reason"])


def _apply_blas_policy() -> None:
    value = os.environ.get(BLAS_THREADS_VAR, "").strip()
    if value:
        try:
            n = int(value)
            if n < 0:
                raise ValueError
        except ValueError:
            warnings.warn(f"{BLAS_THREADS_VAR}={value!r} is not a non-negative integer; "
                          f"using {DEFAULT_BLAS_THREADS} BLAS thread", stacklevel=3)
            n = DEFAULT_BLAS_THREADS
        if n == 0:
            _state["blas_reason"] = f"left alone ({BLAS_THREADS_VAR}=0)"
            return
        set_blas_threads(n)
        _state["blas_reason"] = f"{BLAS_THREADS_VAR}={value}"
        return
    user = [v for v in USER_BLAS_VARS if os.environ.get(v, "").strip()]
    if user:
        _state["blas_reason"] = f"left alone ({user[0]}={os.environ[user[0]]} set)"
        return
    set_blas_threads(DEFAULT_BLAS_THREADS)
    _state["blas_reason"] = f"augmentedgp's default ({DEFAULT_BLAS_THREADS} thread)"


def _usable_cache_dir(path: Path) -> str:
    """'' when ``path`` exists (created owner-only if needed), is ours and writable; else
    why not."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as err:
        return f"off: cannot create {path} ({err.strerror or err})"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"off: {path} belongs to another user"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"off: {path} is not writable"
    return ""


def _apply_cache_policy() -> None:
    if os.environ.get(CACHE_VAR, "1").strip().lower() in _OFF:
        _state["cache_reason"] = f"not configured by augmentedgp ({CACHE_VAR}=0)"
        return
    if jax.config.jax_compilation_cache_dir:
        _state["cache_reason"] = "configured by the user"
        return
    if not jax.config.jax_enable_compilation_cache:
        _state["cache_reason"] = "off: disabled by the user (jax_enable_compilation_cache)"
        return
    path = default_cache_dir()
    why = _usable_cache_dir(path)
    if why:
        _state["cache_reason"] = why
        return
    jax.config.update("jax_compilation_cache_dir", str(path))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          CACHE_MIN_COMPILE_SECONDS)
    if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in os.environ:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size minimum
    _state["cache_reason"] = f"augmentedgp's default ({CACHE_VAR}=0 turns it off)"


_apply_blas_policy()
_apply_cache_policy()

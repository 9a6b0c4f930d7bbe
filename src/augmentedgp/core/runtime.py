"""Runtime policy for the library's own computations: the threads of the BLAS behind JAX's
CPU linear algebra, and JAX's persistent compilation cache.

**Importing augmentedgp changes nothing here** (only float64, :mod:`.precision`). Both
policies apply inside :data:`limits`, the context manager and decorator that wraps
``fit``, ``sample``, ``GP.posterior`` and the posteriors' ``predict_*`` / ``sample_f``.

**BLAS threads.** jaxlib's CPU Cholesky, triangular solves and other LAPACK kernels call
scipy's bundled OpenBLAS, whose worker threads must all be scheduled for every call: when
another process keeps a core busy, each multi-threaded call waits for time slices. Measured
on 2 cores with one kept busy by another process: a Cholesky of n = 200 took 168 ms with 2
BLAS threads against 0.34 ms with one, n = 5000 5.0 s against 1.3 s; an already-compiled
Laplace fit of 200 points 1-28 s instead of 0.1 s. On an idle machine, 2 threads gain
nothing at n = 200 and 1.9x at n = 5000 (0.95 s against 1.84 s). So while augmentedgp
computes, the loaded BLAS pools run **one thread**; the thread counts the user had are
restored when the outermost call returns (after its results are ready: JAX dispatches CPU
work asynchronously). The limit is, unless

- ``AUGMENTEDGP_BLAS_THREADS`` is set (read on import): ``N >= 1`` threads, or ``0`` to
  leave BLAS alone (every core: the fastest for large matrices on an idle machine);
- otherwise, ``OPENBLAS_NUM_THREADS``, ``GOTO_NUM_THREADS``, ``MKL_NUM_THREADS``,
  ``BLIS_NUM_THREADS`` or ``OMP_NUM_THREADS`` is set (by the user or a job scheduler): the
  BLAS pools are left as those variables made them.

``set_blas_threads(n)`` changes the limit (``None``: leave BLAS alone); ``settings`` reports
it. Cost of :data:`limits` per outermost call (scipy's and numpy's OpenBLAS, 2 busy cores):
10-60 us to set and restore both pools, against 0.5 ms for the smallest ``predict_f``;
about 2 us when they already run the limit or BLAS is left alone; nested calls only count
their depth. threadpoolctl's ``threadpool_limits``, which inspects the loaded libraries on
every call, took 2.3 ms, hence the cached controller. XLA's own CPU thread pool
(Eigen, for matrix products and fusions) is left alone: under the same load it slowed a
1000 x 1000 product by at most 2.2x (measured), and it can only be configured before JAX
creates its CPU client (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``).

**Compilation cache.** On the library's first computation in a process, compiled XLA
programs start being saved in ``$XDG_CACHE_HOME/augmentedgp/jax``
(``~/.cache/augmentedgp/jax`` without ``XDG_CACHE_HOME``), so that a new process loads a
fit's programs instead of compiling them again; programs whose compilation took at least
``CACHE_MIN_COMPILE_SECONDS`` are saved. JAX's configuration is process-wide: from then on
the user's own programs are cached there too. Nothing is changed when the user has
configured a cache directory (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``, before that
first computation) or disabled JAX's cache (``JAX_ENABLE_COMPILATION_CACHE=false``), nor
with ``AUGMENTEDGP_COMPILATION_CACHE=0``. When the directory cannot be created or written,
or belongs to another user, the cache stays off (``settings().cache_reason`` says why). JAX
treats its cache as trusted code: the directory is created readable by its owner only.
JAX (0.10) opens its cache on the first compilation that finds a directory configured, so
a directory set after other programs were compiled still takes effect (tested).
"""

from __future__ import annotations

import functools
import os
import threading
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
MARK = "_augmentedgp_limits"  # set (True) on the functions that ``limits`` wraps
_PENDING = "not applied yet (on the library's first fit, predict or sample)"


class Settings(NamedTuple):
    """What augmentedgp's runtime policy does in this process."""

    blas_threads: int | None  # the limit inside the library's calls; None: BLAS left alone
    blas_reason: str
    blas_pools: tuple[tuple[str, int], ...]  # (library file, threads) of each loaded BLAS now
    cache_dir: str | None  # JAX's compilation cache directory (whoever set it); None: off
    cache_reason: str


_lock = threading.RLock()
_local = threading.local()  # .depth: this thread's nesting of ``limits``
_state = {"blas_threads": None, "blas_reason": "", "cache_reason": _PENDING,
          "cache_applied": False, "controller": None, "inside": 0, "saved": None}


def _controller():
    """threadpoolctl's view of the loaded native thread pools, after loading the OpenBLAS
    that jaxlib's CPU LAPACK kernels call (scipy's, through scipy.linalg.cython_lapack);
    created once (about 10 ms: it inspects every loaded library)."""
    with _lock:
        if _state["controller"] is None:
            import scipy.linalg.cython_lapack  # noqa: F401
            from threadpoolctl import ThreadpoolController

            _state["controller"] = ThreadpoolController()
        return _state["controller"]


def _blas_pools():
    return [lib for lib in _controller().lib_controllers if lib.user_api == "blas"]


def set_blas_threads(n: int | None) -> None:
    """Run the BLAS thread pools (JAX's CPU LAPACK kernels, numpy / scipy linear algebra)
    with ``n`` threads while augmentedgp computes; ``None`` leaves them alone. Outside the
    library's calls the pools keep the thread counts the user gave them."""
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
        raise ValueError(f"n must be a positive integer or None, got {n!r}")
    with _lock:
        if n is None:
            _state.update(blas_threads=None, blas_reason="left alone (set_blas_threads(None))")
        else:
            _state.update(blas_threads=int(n), blas_reason=f"set_blas_threads({int(n)})")
        if _state["inside"]:  # called from inside a computation: apply it now
            _restore()
            _state["saved"] = _limit()


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/augmentedgp/jax``, or ``~/.cache/augmentedgp/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "augmentedgp" / "jax"


def settings() -> Settings:
    """The BLAS limit and compilation cache policy, and why (see the module docstring);
    ``blas_pools`` are the thread counts in effect at the moment of the call."""
    pools = tuple((Path(lib.filepath).name, int(lib.num_threads)) for lib in _blas_pools())
    return Settings(_state["blas_threads"], _state["blas_reason"], pools,
                    jax.config.jax_compilation_cache_dir, _state["cache_reason"])


def _resolve_blas_policy() -> None:
    """The limit from the environment (no side effect: applied inside ``limits``)."""
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
            _state.update(blas_threads=None, blas_reason=f"left alone ({BLAS_THREADS_VAR}=0)")
        else:
            _state.update(blas_threads=n, blas_reason=f"{BLAS_THREADS_VAR}={value}")
        return
    user = [v for v in USER_BLAS_VARS if os.environ.get(v, "").strip()]
    if user:
        _state.update(blas_threads=None,
                      blas_reason=f"left alone ({user[0]}={os.environ[user[0]]} set)")
        return
    _state.update(blas_threads=DEFAULT_BLAS_THREADS,
                  blas_reason=f"augmentedgp's default ({DEFAULT_BLAS_THREADS} thread)")


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


def _apply_cache_policy() -> str:
    """Configure JAX's cache (at most once per process, on the first computation); why."""
    if os.environ.get(CACHE_VAR, "1").strip().lower() in _OFF:
        return f"not configured by augmentedgp ({CACHE_VAR}=0)"
    if jax.config.jax_compilation_cache_dir:
        return "configured by the user"
    if not jax.config.jax_enable_compilation_cache:
        return "off: disabled by the user (jax_enable_compilation_cache)"
    path = default_cache_dir()
    why = _usable_cache_dir(path)
    if why:
        return why
    jax.config.update("jax_compilation_cache_dir", str(path))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          CACHE_MIN_COMPILE_SECONDS)
    if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in os.environ:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size minimum
    return f"augmentedgp's default ({CACHE_VAR}=0 turns it off)"


def _limit():
    """Set every BLAS pool that differs from the limit; [(pool, its threads)] to restore."""
    n = _state["blas_threads"]
    if n is None:
        return None
    saved = []
    for lib in _blas_pools():
        old = lib.num_threads
        if old != n:
            lib.set_num_threads(n)
            saved.append((lib, old))
    return saved or None


def _restore():
    for lib, old in _state["saved"] or ():
        lib.set_num_threads(old)
    _state["saved"] = None


def _enter() -> bool:
    """Enter the library's computation; True when this call is the thread's outermost."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    if depth:
        return False
    with _lock:
        try:
            if not _state["cache_applied"]:
                _state["cache_applied"] = True
                _state["cache_reason"] = _apply_cache_policy()
            if not _state["inside"]:
                _state["saved"] = _limit()
        except BaseException:
            _local.depth = 0
            raise
        _state["inside"] += 1
    return True


def _exit(outermost: bool, result=None) -> None:
    _local.depth -= 1
    if not outermost:
        return
    try:
        if _state["saved"] is not None and result is not None:
            # JAX runs CPU work asynchronously: finish it before the limit is lifted
            jax.block_until_ready([x for x in jax.tree_util.tree_leaves(result)
                                   if isinstance(x, jax.Array)
                                   and not isinstance(x, jax.core.Tracer)])
    finally:
        with _lock:
            _state["inside"] -= 1
            if not _state["inside"]:
                _restore()


class _Limits:
    """Apply augmentedgp's runtime policy around the library's own computations:
    ``@limits`` on a function (its returned JAX arrays are finished before the BLAS limit
    is lifted), or ``with limits:`` around a block (block on its results inside it).
    Reentrant and thread-safe: only the outermost call sets and restores the limit."""

    def __enter__(self):
        _local.outer = [*getattr(_local, "outer", ()), _enter()]
        return self

    def __exit__(self, *exc):
        _exit(_local.outer.pop())
        return False

    def __call__(self, fn=None):
        if fn is None:  # ``with limits():`` as well as ``with limits:``
            return self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            outermost = _enter()
            result = None
            try:
                result = fn(*args, **kwargs)
                return result
            finally:
                _exit(outermost, result)

        setattr(wrapper, MARK, True)
        return wrapper

    def __repr__(self):
        return "augmentedgp.core.runtime.limits"


limits = _Limits()

_resolve_blas_policy()

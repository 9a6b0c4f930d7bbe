"""augmentedgp.core.runtime: the BLAS thread policy and the compilation cache, checked in
fresh subprocesses where import-time behaviour matters (threadpoolctl's own report of the
loaded BLAS pools is the oracle for the thread counts)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest
from threadpoolctl import threadpool_info

from augmentedgp.core import runtime

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
multicore = pytest.mark.skipif(CORES < 2, reason="one core: OpenBLAS's default is 1 thread")

# run in a fresh interpreter: the BLAS pools before and after ``import augmentedgp``, the
# runtime settings, JAX's cache configuration, one small jitted program and JAX's cache events
PROBE = textwrap.dedent("""
    import json, os, warnings
    import scipy.linalg.cython_lapack
    from threadpoolctl import threadpool_info
    pools = lambda: sorted(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")
    before = pools()
    import jax
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import augmentedgp as agp
        s = agp.core.runtime.settings()
        jnp = jax.numpy
        chol = jax.jit(lambda x: jnp.linalg.cholesky(jnp.eye(50) + jnp.outer(x, x)).sum())
        value = float(chol(jnp.linspace(0.0, 1.0, 50)))
    print(json.dumps({"before": before, "after": pools(), "threads": s.blas_threads,
                      "blas_reason": s.blas_reason, "cache_dir": s.cache_dir,
                      "cache_reason": s.cache_reason, "value": value,
                      "min_compile": jax.config.jax_persistent_cache_min_compile_time_secs,
                      "min_size": jax.config.jax_persistent_cache_min_entry_size_bytes,
                      "hits": events.count("/jax/compilation_cache/cache_hits"),
                      "warnings": [str(w.message) for w in caught]}))
""")

CLEARED = ("AUGMENTEDGP_BLAS_THREADS", "AUGMENTEDGP_COMPILATION_CACHE", "OPENBLAS_NUM_THREADS",
           "GOTO_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "OMP_NUM_THREADS",
           "JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")


def probe(tmp_path, **env):
    """PROBE's report in a clean environment (no thread or cache variable; XDG_CACHE_HOME
    in ``tmp_path``) plus ``env``."""
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "JAX_PLATFORMS": "cpu", **env})
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@multicore
def test_default_one_blas_thread_and_cache_in_xdg_home(tmp_path):
    """Without settings: every BLAS pool (OpenBLAS's default: one thread per core before the
    import) is limited to 1; the cache is in $XDG_CACHE_HOME/augmentedgp/jax (created
    owner-only), entries are written, and a second process reads them back (with
    augmentedgp's 0.1 s threshold, below JAX's 1 s)."""
    env = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # the user's threshold wins
    first = probe(tmp_path, **env)
    assert min(first["before"]) > 1 and first["after"] == [1] * len(first["after"])
    assert first["threads"] == 1 and "default" in first["blas_reason"]
    cache = tmp_path / "xdg" / "augmentedgp" / "jax"
    assert first["cache_dir"] == str(cache) and (cache.stat().st_mode & 0o777) == 0o700
    assert first["min_compile"] == 0.0 and first["min_size"] == -1
    assert first["hits"] == 0 and any(cache.iterdir())
    second = probe(tmp_path)  # reads whatever the threshold; augmentedgp's applies here
    assert second["hits"] >= 1 and second["value"] == first["value"]
    assert second["min_compile"] == runtime.CACHE_MIN_COMPILE_SECONDS < 1.0
    assert first["warnings"] == second["warnings"] == []


@multicore
def test_user_blas_variable_respected_and_cache_switched_off(tmp_path):
    r = probe(tmp_path, OPENBLAS_NUM_THREADS="2", AUGMENTEDGP_COMPILATION_CACHE="0")
    assert r["after"] == r["before"] == [2] * len(r["before"])
    assert r["threads"] is None and "OPENBLAS_NUM_THREADS=2" in r["blas_reason"]
    assert r["cache_dir"] is None and "AUGMENTEDGP_COMPILATION_CACHE=0" in r["cache_reason"]
    assert not (tmp_path / "xdg").exists()


@multicore
def test_explicit_setting_wins_and_user_cache_dir_kept(tmp_path):
    """AUGMENTEDGP_BLAS_THREADS beats OPENBLAS_NUM_THREADS; ``0`` leaves the pools alone; a
    cache directory the user configured is used as is (JAX's own 1 s threshold kept)."""
    user = tmp_path / "mine"
    r = probe(tmp_path, AUGMENTEDGP_BLAS_THREADS="2", OPENBLAS_NUM_THREADS="1",
              JAX_COMPILATION_CACHE_DIR=str(user))
    assert r["before"] == [1] * len(r["before"]) and r["after"] == [2] * len(r["after"])
    assert r["threads"] == 2
    assert r["cache_dir"] == str(user) and r["cache_reason"] == "configured by the user"
    assert r["min_compile"] == 1.0 and not (tmp_path / "xdg").exists()
    r = probe(tmp_path, AUGMENTEDGP_BLAS_THREADS="0", AUGMENTEDGP_COMPILATION_CACHE="0")
    assert r["after"] == r["before"] and min(r["before"]) > 1 and r["threads"] is None


def test_unusable_cache_dir_and_bad_value_degrade_gracefully(tmp_path):
    """A cache home that cannot hold a directory (a file here: root may write anywhere)
    leaves the cache off without an error or warning; programs still compile and run. A
    malformed AUGMENTEDGP_BLAS_THREADS warns and falls back to one thread."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = probe(tmp_path, XDG_CACHE_HOME=str(blocker), AUGMENTEDGP_BLAS_THREADS="many")
    assert r["cache_dir"] is None and r["cache_reason"].startswith("off: cannot create")
    assert r["value"] > 0 and r["hits"] == 0
    assert len(r["warnings"]) == 1 and "AUGMENTEDGP_BLAS_THREADS" in r["warnings"][0]
    assert r["threads"] == 1 and r["after"] == [1] * len(r["after"])


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() == 0,
                    reason="root writes into read-only directories")
def test_read_only_cache_dir_is_not_used(tmp_path):
    home = tmp_path / "ro"
    (home / "augmentedgp" / "jax").mkdir(parents=True)
    (home / "augmentedgp" / "jax").chmod(0o500)
    r = probe(tmp_path, XDG_CACHE_HOME=str(home))
    assert r["cache_dir"] is None and "not writable" in r["cache_reason"]
    assert r["value"] > 0 and r["warnings"] == []


def test_set_blas_threads_in_process():
    """set_blas_threads limits every loaded BLAS pool and gives back the previous counts;
    invalid counts raise."""
    pools = lambda: [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    start, before = runtime.settings(), pools()
    try:
        runtime.set_blas_threads(2)
        assert pools() == [min(2, CORES)] * len(before)  # OpenBLAS caps at the cores
        assert runtime.settings().blas_threads == 2
        runtime.set_blas_threads(1)
        assert pools() == [1] * len(before)
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="positive integer"):
                runtime.set_blas_threads(bad)
    finally:
        runtime.set_blas_threads(start.blas_threads)
    assert pools() == before


def test_settings_reports_jax_configuration():
    s = runtime.settings()
    assert s.cache_dir == jax.config.jax_compilation_cache_dir
    assert s.blas_pools and all(n >= 1 for _, n in s.blas_pools)
    assert runtime.default_cache_dir().parts[-2:] == ("augmentedgp", "jax")

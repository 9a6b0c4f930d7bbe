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

# run in a fresh interpreter: the BLAS pools before and after ``import augmentedgp``, JAX's
# cache configuration after the import, the pools during and after the library's first
# computations (a posterior and its predictions), the runtime settings, one small jitted
# program of the user's and JAX's cache events
PROBE = textwrap.dedent("""
    import json, os, warnings
    import numpy as np
    import scipy.linalg.cython_lapack
    from threadpoolctl import threadpool_info
    pools = lambda: sorted(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")
    before = pools()
    import jax
    cache_config = lambda: [jax.config.jax_compilation_cache_dir,
                            jax.config.jax_persistent_cache_min_compile_time_secs,
                            jax.config.jax_persistent_cache_min_entry_size_bytes]
    jax_before = cache_config()
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import augmentedgp as agp
        imported, jax_imported = pools(), cache_config()
        pending = agp.core.runtime.settings()
        import augmentedgp.models.sites as sites
        during, moments = [], sites.check_moments
        sites.check_moments = lambda *a: (during.append(pools()), moments(*a))[1]
        X = np.linspace(0.0, 1.0, 20)[:, None]
        post = agp.GP(agp.kernels.RBF(), noise=0.1).posterior(X, np.sin(6 * X[:, 0]))
        post.predict_y(X)
        s = agp.core.runtime.settings()
        jnp = jax.numpy
        chol = jax.jit(lambda x: jnp.linalg.cholesky(jnp.eye(50) + jnp.outer(x, x)).sum())
        value = float(chol(jnp.linspace(0.0, 1.0, 50)))
    print(json.dumps({"before": before, "imported": imported, "during": during,
                      "after": pools(), "jax_before": jax_before, "jax_imported": jax_imported,
                      "pending": pending.cache_reason, "pending_threads": pending.blas_threads,
                      "threads": s.blas_threads, "blas_reason": s.blas_reason,
                      "pools_reported": sorted(n for _, n in s.blas_pools),
                      "cache_dir": s.cache_dir, "cache_reason": s.cache_reason, "value": value,
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


def test_import_changes_only_x64(tmp_path):
    """``import augmentedgp`` changes no JAX configuration value but jax_enable_x64, starts
    no JAX backend and loads no scipy (its import took ~1 s, most of it scipy.stats)."""
    code = textwrap.dedent("""
        import json, sys
        import jax
        before = dict(jax.config.values)
        import augmentedgp
        from jax._src import xla_bridge
        after = dict(jax.config.values)
        print(json.dumps({"changed": sorted(k for k in after if after[k] != before.get(k)),
                          "backends": len(xla_bridge._backends),
                          "scipy": sorted(m for m in sys.modules if m.split(".")[0] == "scipy")}))
    """)
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "JAX_PLATFORMS": "cpu"})
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"changed": ["jax_enable_x64"], "backends": 0, "scipy": []}
    assert not (tmp_path / "xdg").exists()


@multicore
def test_default_one_blas_thread_inside_calls_and_cache_in_xdg_home(tmp_path):
    """Without settings: the import changes neither the BLAS pools (OpenBLAS's default: one
    thread per core) nor JAX's cache configuration; inside the library's computations every
    pool runs 1 thread, and the user's counts are back after them. The library's first
    computation puts the cache in $XDG_CACHE_HOME/augmentedgp/jax (created owner-only),
    entries are written, and a second process reads them back (with augmentedgp's 0 s
    threshold, below JAX's 1 s)."""
    env = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # the user's threshold wins
    first = probe(tmp_path, **env)
    assert min(first["before"]) > 1 and first["imported"] == first["before"]
    assert first["jax_imported"] == first["jax_before"] == [None, 0.0, 0]
    assert first["pending"].startswith("not applied yet") and first["pending_threads"] == 1
    assert first["during"] and all(d == [1] * len(first["before"]) for d in first["during"])
    assert first["after"] == first["pools_reported"] == first["before"]
    assert first["threads"] == 1 and "default" in first["blas_reason"]
    cache = tmp_path / "xdg" / "augmentedgp" / "jax"
    assert first["cache_dir"] == str(cache) and (cache.stat().st_mode & 0o777) == 0o700
    assert first["min_compile"] == 0.0 and first["min_size"] == -1
    assert first["hits"] == 0 and any(cache.iterdir())
    second = probe(tmp_path)  # reads whatever the threshold; augmentedgp's applies here
    assert second["jax_imported"] == second["jax_before"] == [None, 1.0, 0]
    assert second["hits"] >= 1 and second["value"] == first["value"]
    assert second["min_compile"] == runtime.CACHE_MIN_COMPILE_SECONDS < 1.0
    assert first["warnings"] == second["warnings"] == []


@multicore
def test_user_blas_variable_respected_and_cache_switched_off(tmp_path):
    r = probe(tmp_path, OPENBLAS_NUM_THREADS="2", AUGMENTEDGP_COMPILATION_CACHE="0")
    assert r["after"] == r["imported"] == r["before"] == [2] * len(r["before"])
    assert r["during"] and all(d == r["before"] for d in r["during"])
    assert r["threads"] is None and "OPENBLAS_NUM_THREADS=2" in r["blas_reason"]
    assert r["cache_dir"] is None and "AUGMENTEDGP_COMPILATION_CACHE=0" in r["cache_reason"]
    assert r["jax_imported"] == r["jax_before"] and r["min_compile"] == 1.0
    assert not (tmp_path / "xdg").exists()


@multicore
def test_explicit_setting_wins_and_user_cache_dir_kept(tmp_path):
    """AUGMENTEDGP_BLAS_THREADS beats OPENBLAS_NUM_THREADS inside the library's calls; ``0``
    leaves the pools alone; a cache directory the user configured is used as is (JAX's own
    1 s threshold kept)."""
    user = tmp_path / "mine"
    r = probe(tmp_path, AUGMENTEDGP_BLAS_THREADS="2", OPENBLAS_NUM_THREADS="1",
              JAX_COMPILATION_CACHE_DIR=str(user))
    assert r["before"] == r["imported"] == r["after"] == [1] * len(r["before"])
    assert r["during"] and all(d == [2] * len(r["before"]) for d in r["during"])
    assert r["threads"] == 2
    assert r["cache_dir"] == str(user) and r["cache_reason"] == "configured by the user"
    assert r["jax_imported"] == r["jax_before"] == [str(user), 1.0, 0]
    assert r["min_compile"] == 1.0 and not (tmp_path / "xdg").exists()
    r = probe(tmp_path, AUGMENTEDGP_BLAS_THREADS="0", AUGMENTEDGP_COMPILATION_CACHE="0")
    assert r["after"] == r["before"] and min(r["before"]) > 1 and r["threads"] is None
    assert r["during"] and all(d == r["before"] for d in r["during"])


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
    assert r["threads"] == 1 and r["after"] == r["before"]
    assert r["during"] and all(d == [1] * len(r["before"]) for d in r["during"])


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() == 0,
                    reason="root writes into read-only directories")
def test_read_only_cache_dir_is_not_used(tmp_path):
    home = tmp_path / "ro"
    (home / "augmentedgp" / "jax").mkdir(parents=True)
    (home / "augmentedgp" / "jax").chmod(0o500)
    r = probe(tmp_path, XDG_CACHE_HOME=str(home))
    assert r["cache_dir"] is None and "not writable" in r["cache_reason"]
    assert r["value"] > 0 and r["warnings"] == []


# a fit, its predictions and samples in a fresh interpreter: the BLAS pools before the
# import, seen by fit's callback, and after each call
FIT_PROBE = textwrap.dedent("""
    import json
    import numpy as np
    import scipy.linalg.cython_lapack
    from threadpoolctl import threadpool_info
    pools = lambda: sorted(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")
    before = pools()
    import jax
    import augmentedgp as agp
    imported, in_fit = pools(), []
    X = np.linspace(0.0, 1.0, 20)[:, None]
    post = agp.fit(agp.GP(agp.kernels.RBF(), noise=0.1), X, np.sin(6 * X[:, 0]), max_iter=5,
                   callback=lambda *a: in_fit.append(pools()))
    fitted = pools()
    post.predict_f(X)
    post.sample_f(jax.random.key(0), X[:5], 2)
    print(json.dumps({"before": before, "imported": imported, "in_fit": in_fit,
                      "fitted": fitted, "after": pools()}))
""")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update({"XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg")), "JAX_PLATFORMS": "cpu"})
    out = subprocess.run([sys.executable, "-c", FIT_PROBE], env=full, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@multicore
def test_fit_predict_and_sample_leave_the_pools_as_they_were(fitted):
    assert min(fitted["before"]) > 1
    assert fitted["imported"] == fitted["fitted"] == fitted["after"] == fitted["before"]


@multicore
def test_fit_runs_with_the_limit(fitted):
    assert fitted["in_fit"] and all(p == [1] * len(fitted["before"]) for p in fitted["in_fit"])


def _pools():
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_limits_in_process():
    """Outside ``limits`` the pools keep their counts whatever ``set_blas_threads`` says;
    inside it they run the limit, nested blocks and calls change nothing, an exception
    restores them; ``None`` leaves them alone; invalid counts raise."""
    start, before = runtime.settings(), _pools()
    inside = []

    @runtime.limits
    def compute(fail=False):
        inside.append(_pools())
        with runtime.limits:
            inside.append(_pools())
        if fail:
            raise RuntimeError("fails")
        return jax.numpy.ones(3)

    try:
        runtime.set_blas_threads(2)
        assert _pools() == before and runtime.settings().blas_threads == 2
        with runtime.limits():
            assert _pools() == [min(2, CORES)] * len(before)  # OpenBLAS caps at the cores
            assert compute().sum() == 3.0
            assert _pools() == [min(2, CORES)] * len(before)
        assert _pools() == before
        runtime.set_blas_threads(1)
        assert compute().sum() == 3.0 and _pools() == before
        with pytest.raises(RuntimeError, match="fails"):
            compute(fail=True)
        assert _pools() == before
        assert inside[:2] == [[min(2, CORES)] * len(before)] * 2
        assert inside[2:] == [[1] * len(before)] * 4
        runtime.set_blas_threads(None)
        with runtime.limits:
            assert _pools() == before
            runtime.set_blas_threads(1)  # from inside a computation: applies at once
            assert _pools() == [1] * len(before)
        assert _pools() == before
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="positive integer"):
                runtime.set_blas_threads(bad)
    finally:
        runtime.set_blas_threads(start.blas_threads)
    assert _pools() == before and runtime.settings().blas_threads == start.blas_threads


def test_public_computations_carry_the_limits():
    """Every public fit / predict / sample entry point runs inside ``limits``."""
    import augmentedgp as agp
    from augmentedgp.inference.flow_gp import fit_flow

    wrapped = lambda f: getattr(f, runtime.MARK, False)
    entries = {"GP.posterior": agp.GP.posterior,
               "GP.log_marginal_likelihood": agp.GP.log_marginal_likelihood,
               "sample": agp.sample, "fit_gaussian": agp.fit_gaussian,
               "fit_flow": fit_flow, "VariationalGaussian.sample": agp.VariationalGaussian.sample,
               "VariationalGaussian.sample_tree": agp.VariationalGaussian.sample_tree}
    for cls in (agp.SitePosterior, agp.SparsePosterior, agp.SVGP, agp.VGP, agp.MCPosterior):
        for name in ("predict_f", "predict_y", "predict_proba", "predict_log_density",
                     "sample_f", "predict_class"):
            entries[f"{cls.__name__}.{name}"] = getattr(cls, name)
    assert [k for k, f in entries.items() if not wrapped(f)] == []


def test_fit_carries_the_limits():
    import augmentedgp as agp

    assert getattr(agp.fit, runtime.MARK, False)


def test_settings_reports_jax_configuration():
    s = runtime.settings()
    assert s.cache_dir == jax.config.jax_compilation_cache_dir
    assert s.blas_pools and all(n >= 1 for _, n in s.blas_pools)
    assert runtime.default_cache_dir().parts[-2:] == ("augmentedgp", "jax")

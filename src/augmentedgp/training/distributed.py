"""Scale-out: augmented variational inference as map-reduce over partitions of the data.

The AnalyticVI / AnalyticSVI updates touch the data only through sums over points
([Wenzel2019, eqs. 11-12]; [Galy-Fajou2020, Algorithm 3]): the data term of the bound
sum_i E[log p(y_i | f_i)] (at the optimal q(w_i)), its gradient in the hyperparameters,
and the natural-gradient statistics sum_i beta_i a_i and sum_i gamma_i a_i a_i^T with
a_i = Lmm^-1 k_Z(x_i). Each partition computes its sums where it lives
(:func:`partition_statistics`); the driver adds them in partition order and takes exactly
the update of :func:`augmentedgp.fit` (the one iteration of ``training.step``) -- Adam on the
hyperparameters, the natural step on q(u), the same minibatches from the same key and the
same stopping rule in the same training loop -- so the result equals the single-machine
fit up to rounding. Communication per partition and iteration is O(M^2 + #hyperparameters).

Two executors run the map:

- **Dask** (default): partitions live on the workers of a dask.distributed cluster (a
  ``LocalCluster`` of ``n_workers`` processes unless ``client`` names one). Arrays and
  dataframes are persisted in the workers' memory; directories of Parquet / CSV / npz
  files are streamed, each file read on a worker at every pass, so they may be larger
  than the memory of the whole cluster. A lost worker costs only a recomputation: every
  partition is recomputable from its source and the driver's sum does not depend on where
  a partition ran.
- **JAX devices** (``devices=``): in-memory data sharded over the rows across devices
  (``jax.sharding``), the statistics summed with ``psum`` inside one compiled step.

The driver can checkpoint (``checkpoint=dir``): every chunk it writes the training state
(hyperparameters, q(u), optimizer, schedule, iteration, minibatch stream) and the
history; a fit started again with the same directory resumes there and ends where the
uninterrupted fit would have.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from augmentedgp.core import tables
from augmentedgp.core.loop import minibatch, optax_optimizer, run_steps
from augmentedgp.core.validation import check_int, check_X
from augmentedgp.inference.vi import AnalyticVI, VariationalInference
from augmentedgp.models.sparse import SVGP, VGP, SparsePosterior
from augmentedgp.training.step import (
    Statistics,
    VIState,
    check_step_settings,
    init_state,
    model_at,
    prior_objective,
    statistics,
    update,
    user_form,
)
from augmentedgp.variational.families import SiteQ

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".npz": "npz"}


def partition_statistics(hyper, q, static, inference, X, y, w, key, need_grad: bool):
    """The :class:`~augmentedgp.training.step.Statistics` of one partition's points (X, y)
    with weights w (1 for data, 0 for padding): the unscaled data part of the objective,
    -sum_i w_i E_q[log p(y_i | f_i)], its gradient and the natural-gradient statistics."""
    return statistics(hyper, q, static, inference, X, y, w, key, need_grad)[0]


_statistics = eqx.filter_jit(partition_statistics)


def _reduce(state: VIState, stats: Statistics, scale, static):
    """The whole objective from the partitions' sums: scale times the data part plus the
    prior part KL - log prior (computed once, on the driver)."""
    prior_value, prior_grad = prior_objective(state.hyper, state.q, static)
    grad = jax.tree_util.tree_map(lambda d, g: scale * d + g, stats.grad, prior_grad)
    return stats._replace(value=scale * stats.value + prior_value, grad=grad)


def _driver_update(state, stats, batches, scale, do_hyper, setup):
    return update(state, _reduce(state, stats, scale, setup.static), batches, scale, do_hyper,
                  setup)


_minibatch_jit = eqx.filter_jit(minibatch)
_update_jit = eqx.filter_jit(_driver_update)


# --- the JAX-devices executor ------------------------------------------------------------


def _device_step(state: VIState, args):
    """One iteration as one program: the rows' statistics sharded over the mesh's devices
    (``shard_map``, summed with ``psum``), then the driver's update."""
    setup, X, y, mesh = args
    rows, batches, scale = minibatch(state.batches, state.t, setup.inference.batch_size)
    if rows is not None:
        X, y = X[rows], y[rows]
    D = mesh.devices.size
    pad = -X.shape[0] % D  # equal shards: padding rows (copies of row 0) with weight 0
    w = jnp.concatenate([jnp.ones(X.shape[0], X.dtype), jnp.zeros(pad, X.dtype)])
    X = jnp.concatenate([X, jnp.broadcast_to(X[:1], (pad, *X.shape[1:]))])
    y = jnp.concatenate([y, jnp.broadcast_to(y[:1], (pad, *y.shape[1:]))])
    mc_key = jax.random.fold_in(batches.key, state.t)
    spec = jax.sharding.PartitionSpec("data")

    def sharded(need_grad):
        def local(hyper, q, X, y, w):
            key_d = jax.random.fold_in(mc_key, lax.axis_index("data"))
            s = partition_statistics(hyper, q, setup.static, setup.inference, X, y, w, key_d,
                                     need_grad)
            return jax.tree_util.tree_map(lambda a: lax.psum(a, "data"), s)

        rep = jax.sharding.PartitionSpec()
        return jax.shard_map(local, mesh=mesh, in_specs=(rep, rep, spec, spec, spec),
                             out_specs=rep, check_vma=False)(state.hyper, state.q, X, y, w)

    do_hyper = state.t % setup.hyper_every == 0
    stats = (sharded(True) if setup.hyper_every == 1
             else lax.cond(do_hyper, lambda: sharded(True), lambda: sharded(False)))
    return _driver_update(state, stats, batches, scale, do_hyper, setup)


# --- the Dask executor -------------------------------------------------------------------


def _to_numpy(tree):
    """The tree with its JAX arrays as numpy arrays (what crosses process boundaries)."""
    return jax.tree_util.tree_map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x,
                                  tree)


def _bucket(k: int, bits: int) -> int:
    """Padded row count: k rounded up to a number with ``bits`` significant bits (>= 8), so
    that a worker compiles a few programs per octave of sizes, not one per size; padding
    wastes at most 2^(1 - bits) of the work (bits=1: powers of two)."""
    if k <= 8:
        return 8
    shift = max(k.bit_length() - bits, 0)
    return -(-k >> shift) << shift


_STATIC: dict = {}  # on a worker: token -> the unpickled (static model part, inference)


def _static_payload(static, inference):
    """(token, pickled bytes) of the fit's constant part. Workers unpickle a token once and
    keep the objects, so the compiled statistics are reused across iterations and fits
    (a fresh unpickled copy would be a new jit cache key, and compile again)."""
    import cloudpickle

    blob = cloudpickle.dumps(_to_numpy((static, inference)))
    return hashlib.sha256(blob).hexdigest(), blob


def _worker_statistics(part, static_payload, arrays, rows, key_data, need_grad):
    """Run on a worker: the Statistics of a partition (or of its ``rows``), as numpy."""
    import cloudpickle

    token, blob = static_payload
    if token not in _STATIC:
        if len(_STATIC) >= 16:
            _STATIC.pop(next(iter(_STATIC)))
        _STATIC[token] = cloudpickle.loads(blob)
    static, inference = _STATIC[token]
    hyp, q = arrays
    X, y = part
    # whole partitions are padded finely (they are large), minibatch shares to powers of two
    rows, bits = (np.arange(X.shape[0]), 4) if rows is None else (rows, 1)
    size = _bucket(len(rows), bits)
    w = np.zeros(size)
    w[: len(rows)] = 1.0  # padding rows (copies of row 0) have weight 0
    if size > len(rows) or bits == 1:
        rows = np.concatenate([rows, np.zeros(size - len(rows), rows.dtype)])
        X, y = X[rows], y[rows]
    key = jax.random.wrap_key_data(key_data)
    return _to_numpy(_statistics(hyp, q, static, inference, X, y, w, key, need_grad))


def _prepare(raw, likelihood, d, name):
    """Run on a worker: a partition's (X, y) validated and converted (float64 inputs,
    the likelihood's target encoding), with the partition named in any error."""
    X, y = raw
    try:
        X = check_X(np.asarray(X), "X", d=d)
        if X.shape[0] == 0:
            raise ValueError("it has no rows")
        y = np.asarray(likelihood.targets(np.asarray(y), X.shape[0]))
    except ValueError as err:
        raise ValueError(f"partition {name}: {err}") from None
    return np.ascontiguousarray(X), y


def _rows(part):
    return part[0].shape[0]


def _pair(X, y):
    return X, y


def _read_file(path, target, features):
    """Run on a worker: one file of a directory source as (X, y)."""
    fmt = _FORMATS[Path(path).suffix.lower()]
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as f:
            if "X" not in f or "y" not in f:
                raise ValueError(f"{path}: an npz partition needs arrays 'X' and 'y', has "
                                 f"{sorted(f.files)}")
            return f["X"], f["y"]
    if target is None:
        raise ValueError(f"{path}: give target= (the name of the target column)")
    return tables.frame_xy(tables.read_table(path), target, features, path)


def _files(path):
    """The partition files of a directory (or a glob), sorted, of one supported format."""
    path = str(path)
    base = Path(path)
    files = sorted(base.iterdir()) if base.is_dir() else sorted(map(Path, glob.glob(path)))
    if not base.is_dir() and not files:
        raise ValueError(f"{path} is neither a directory nor a glob matching files")
    files = [f for f in files if f.is_file() and not f.name.startswith((".", "_"))]
    kinds = {_FORMATS.get(f.suffix.lower()) for f in files}
    if not files or None in kinds or len(kinds) > 1:
        raise ValueError(f"{path} must hold files of one format ({', '.join(sorted(_FORMATS))}),"
                         f" found {sorted({f.suffix or f.name for f in files}) or 'none'}")
    return [str(f) for f in files]


class _Data(NamedTuple):
    parts: list  # Delayed (or persisted Delayed) values of the prepared (X, y)
    counts: list  # rows per partition


def _partitions(data, likelihood, d, target, features, n_partitions, persist, client,
                progress):
    """The data as prepared partitions on the cluster, with their row counts."""
    import dask
    import dask.array as da
    import dask.dataframe as dd
    from dask.delayed import Delayed

    if isinstance(data, str | os.PathLike):
        names = _files(data)
        raws = [dask.delayed(_read_file)(f, target, features) for f in names]
        persist = False if persist is None else persist
    elif isinstance(data, dd.DataFrame):
        if target is None:
            raise ValueError("a dataframe needs target= (the name of the target column)")
        raws = [dask.delayed(tables.frame_xy)(p, target, features, f"partition {i}")
                for i, p in enumerate(data.to_delayed())]
        names = [f"{i}" for i in range(len(raws))]
    elif isinstance(data, list | tuple) and data and all(isinstance(p, Delayed) for p in data):
        raws, names = list(data), [f"{i}" for i in range(len(data))]
    elif isinstance(data, tuple) and len(data) == 2:
        X, y = data
        if not isinstance(X, da.Array):
            Xn = check_X(np.asarray(X) if not hasattr(X, "to_numpy") else X.to_numpy())
            n = Xn.shape[0]
            k = n_partitions or max(1, min(n, 2 * _n_workers(client)))
            X = da.from_array(Xn, chunks=(-(-n // k), -1))
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got {X.ndim} dimensions")
        X = X.rechunk({1: -1})
        y = da.asarray(np.asarray(y) if not isinstance(y, da.Array) else y)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"y has {y.shape[0]} rows, X has {X.shape[0]}")
        y = y.rechunk({0: X.chunks[0], **{i: -1 for i in range(1, y.ndim)}})
        xs, ys = X.to_delayed().ravel(), y.to_delayed().ravel()
        raws = [dask.delayed(_pair)(a, b) for a, b in zip(xs, ys, strict=True)]
        names = [f"rows {o}-{o + c - 1}" for o, c in zip(np.cumsum((0, *X.chunks[0])),
                                                          X.chunks[0], strict=False)]
    else:
        raise ValueError("data must be (X, y) arrays (numpy or dask), a dask DataFrame with "
                         "target=, a directory or glob of Parquet / CSV / npz files, or a list "
                         f"of dask.delayed values of (X, y); got {type(data).__name__}")
    persist = True if persist is None else persist
    likelihood = _to_numpy(likelihood)
    parts = [dask.delayed(_prepare)(r, likelihood, d, nm) for r, nm in zip(raws, names,
                                                                           strict=True)]
    if persist:
        parts = client.persist(parts)
    futures = client.compute([dask.delayed(_rows)(p) for p in parts])
    counts = _gather(client, futures, progress, "reading partitions")
    return _Data(parts, [int(c) for c in counts])


def _n_workers(client):
    return max(1, len(client.scheduler_info(n_workers=-1)["workers"]))


def _gather(client, futures, progress, what):
    """Results of the futures in order, with a progress bar over them."""
    from distributed import as_completed

    progress.start(what, len(futures))
    for _ in as_completed(futures):
        progress.advance()
    return client.gather(futures)


class _PartitionBar:
    """A rich progress bar over the partitions of the current pass (verbose), or nothing."""

    def __init__(self, verbose):
        self.bar, self.task = None, None
        if verbose:
            from rich.progress import Progress

            self.bar = Progress(*Progress.get_default_columns(), "[cyan]{task.fields[info]}")

    def start(self, what, total, info=""):
        if self.bar is None:
            return
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task(what, total=total, info=info)
        self.bar.reset(self.task, total=total, description=what, info=info)

    def advance(self):
        if self.bar is not None:
            self.bar.advance(self.task)

    def stop(self):
        if self.bar is not None:
            self.bar.stop()


class _DaskMap:
    """The map and reduce of one iteration on a Dask cluster."""

    def __init__(self, client, data, static, inference, progress):
        import dask

        self.client, self.data, self.progress = client, data, progress
        self.static = client.persist(dask.delayed(_static_payload(static, inference),
                                                  traverse=False))
        self.offsets = np.cumsum([0, *data.counts])

    def __call__(self, hyp, q, rows, key, need_grad, iteration):
        import dask

        arrays = dask.delayed(_to_numpy((hyp, q)), traverse=False)
        tasks = []
        for p, part in enumerate(self.data.parts):
            if rows is None:
                local = None
            else:
                lo, hi = self.offsets[p], self.offsets[p + 1]
                local = rows[(rows >= lo) & (rows < hi)] - lo
                if local.size == 0:
                    continue
            tasks.append(dask.delayed(_worker_statistics, pure=False)(
                part, self.static, arrays, local,
                np.asarray(jax.random.key_data(jax.random.fold_in(key, p))), need_grad))
        results = _gather(self.client, self.client.compute(tasks), self.progress,
                          f"iteration {iteration + 1}")
        # in partition order whatever the workers: the sum does not depend on the schedule
        return jax.tree_util.tree_map(lambda *xs: sum(xs[1:], xs[0]), *results)


def _dask_step(state: VIState, args):
    setup, mapper = args
    rows, batches, scale = _minibatch_jit(state.batches, state.t, setup.inference.batch_size)
    t = int(state.t)
    do_hyper = t % setup.hyper_every == 0
    rows = None if rows is None else np.asarray(rows)
    stats = mapper(state.hyper, state.q, rows, jax.random.fold_in(batches.key, t), do_hyper, t)
    stats = jax.tree_util.tree_map(jnp.asarray, stats)
    return _update_jit(state, stats, batches, jnp.asarray(scale), jnp.asarray(do_hyper), setup)


def _loop(step, carry, args, length):
    """The training loop's chunk as a driver loop (each step leaves the process)."""
    out = []
    for _ in range(length):
        carry, o = step(carry, args)
        out.append(o)
    return carry, tuple(np.array([float(o[i]) for o in out]) for i in range(2))


# --- checkpoints -------------------------------------------------------------------------


def _leaves(carry):
    """The carry's leaves as numpy (PRNG keys as their key data)."""
    out = []
    for leaf in jax.tree_util.tree_leaves(carry):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append(np.asarray(leaf))
    return out


def _fingerprint(carry, n, inference, chunk_size):
    spec = [str(jax.tree_util.tree_structure(carry)), n, repr(inference), chunk_size,
            [(a.shape, str(a.dtype)) for a in _leaves(carry)]]
    return hashlib.sha256(json.dumps(spec, default=str).encode()).hexdigest()


def _save_checkpoint(path: Path, carry, history, fingerprint):
    path.mkdir(parents=True, exist_ok=True)
    arrays = {f"leaf{i}": a for i, a in enumerate(_leaves(carry))}
    arrays.update(values=np.asarray(history[0]), sizes=np.asarray(history[1]),
                  times=np.asarray(history[2]))
    tmp = path / ".checkpoint.npz.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    meta = path / ".checkpoint.json.tmp"
    meta.write_text(json.dumps({"fingerprint": fingerprint, "iteration": len(history[0])}))
    os.replace(tmp, path / "checkpoint.npz")  # the arrays first: the json names a whole file
    os.replace(meta, path / "checkpoint.json")


def _load_checkpoint(path: Path, carry, fingerprint):
    """(carry, history) saved in path, or None if there is no checkpoint."""
    if not (path / "checkpoint.json").is_file():
        return None
    meta = json.loads((path / "checkpoint.json").read_text())
    if meta.get("fingerprint") != fingerprint:
        raise ValueError(f"the checkpoint in {path} was written by a different fit (model, "
                         "data size, inference or chunk_size differ); remove it or use "
                         "another checkpoint directory")
    with np.load(path / "checkpoint.npz", allow_pickle=False) as f:
        saved = [f[f"leaf{i}"] for i in range(len(jax.tree_util.tree_leaves(carry)))]
        history = (f["values"].tolist(), f["sizes"].tolist(), f["times"].tolist())
    leaves, treedef = jax.tree_util.tree_flatten(carry)
    restored = [jax.random.wrap_key_data(jnp.asarray(a), impl=jax.random.key_impl(old))
                if jnp.issubdtype(old.dtype, jax.dtypes.prng_key) else jnp.asarray(a)
                for a, old in zip(saved, leaves, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, restored), history


# --- the public entry point --------------------------------------------------------------


def fit(model, data, inference=None, *, target=None, features=None, client=None,
        n_workers: int = 2, n_partitions: int | None = None, persist: bool | None = None,
        devices=None, optimizer=None, max_iter: int = 1000, learning_rate: float = 0.01,
        tol: float = 1e-6, key=None, callback=None, verbose: bool = False,
        chunk_size: int = 50, window: int = 20, hyper_every: int = 1, checkpoint=None):
    """Fit an SVGP on partitioned data; returns its :class:`SparsePosterior` (which holds no
    training data: ``X`` and ``y`` are None).

    ``inference``: ``AnalyticVI()`` (default; full batch) or ``AnalyticSVI(batch_size)``
    (the same minibatches as :func:`augmentedgp.fit` draws from ``key``, each partition
    contributing its rows of the batch), or the quadrature counterparts with natural steps.
    ``optimizer``, ``max_iter``, ``learning_rate``, ``tol``, ``key``, ``callback``,
    ``chunk_size``, ``window`` and ``hyper_every`` are those of :func:`augmentedgp.fit`.
    The fit equals the single-machine one up to rounding, except where the objective has
    Monte Carlo terms (the softmaxes): each partition draws for its own rows, so those draws
    differ from the single machine's.

    ``data``: ``(X, y)`` as numpy arrays (split into ``n_partitions``, default two per
    worker) or dask arrays (their row chunks); a dask DataFrame with ``target`` (and
    ``features``, default the other columns); a directory or glob of Parquet, CSV (with
    ``target``) or npz files (arrays ``X`` and ``y``), one partition per file, streamed
    unless ``persist=True``; or a list of ``dask.delayed`` values of (X, y).

    ``client``: a ``dask.distributed.Client`` or a scheduler address; None starts a
    ``LocalCluster`` of ``n_workers`` single-threaded processes for this fit.
    ``devices``: a list of JAX devices (or their number) to shard in-memory ``(X, y)`` over
    instead of Dask. ``checkpoint``: a directory for the driver's checkpoint (written every
    ``chunk_size`` iterations); a fit given a directory holding one resumes from it.
    ``verbose``: progress bars over iterations and partitions.
    """
    inference = AnalyticVI() if inference is None else inference
    max_iter, hyper_every = _check(model, inference, hyper_every, max_iter)
    opt = optax_optimizer(optimizer or "adam", learning_rate)
    key = jax.random.key(0) if key is None else key
    d = model.input_dim()
    with contextlib.ExitStack() as stack:
        if devices is not None:
            if not isinstance(data, tuple) or len(data) != 2:
                raise ValueError("devices= shards in-memory data: give data as (X, y) arrays")
            X, y = model.validate_data(*data)
            n = X.shape[0]
            mesh = _mesh(devices)
            step, runner = _device_step, None
        else:
            client = _client(client, n_workers, stack)
            bar = _PartitionBar(verbose)
            stack.callback(bar.stop)
            parts = _partitions(data, model.likelihood, d, target, features, n_partitions,
                                persist, client, bar)
            n = sum(parts.counts)
            step, runner = _dask_step, _loop
        if inference.batch_size is not None and inference.batch_size > n:
            raise ValueError(f"batch_size {inference.batch_size} exceeds the {n} data points")
        state, setup = init_state(model, inference, opt, hyper_every, key, n)
        if devices is None:
            args = (setup, _DaskMap(client, parts, setup.static, inference, bar))
        on_chunk, resume = None, None
        if checkpoint is not None:
            path, fp = Path(checkpoint), _fingerprint(state, n, inference, chunk_size)
            loaded = _load_checkpoint(path, state, fp)
            if loaded is not None:
                state, resume = loaded
            on_chunk = lambda s, h: _save_checkpoint(path, s, h, fp)
        if devices is not None:  # replicated on the mesh, as the step returns it: one compile
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            state, X, y = jax.device_put((state, X, y), replicated)
            args = (setup, X, y, mesh)
        to_model = lambda s: user_form(model_at(s.hyper, s.q, setup.static), model.q)
        state, hist = run_steps(step, state, args, to_model, max_iter=max_iter, tol=tol,
                                chunk_size=chunk_size, window=window, callback=callback,
                                verbose=verbose and devices is not None, runner=runner,
                                on_chunk=on_chunk, resume=resume)
    return SparsePosterior(to_model(state), None, None, hist)


def _check(model, inference, hyper_every, max_iter):
    if not isinstance(model, SVGP) or isinstance(model, VGP):
        raise ValueError("distributed.fit fits SVGP models (inducing points keep the "
                         f"communication O(M^2)); got {type(model).__name__}")
    if not isinstance(inference, VariationalInference) or not inference.natural:
        raise ValueError("distributed.fit needs AnalyticVI, AnalyticSVI, QuadratureVI or "
                         f"QuadratureSVI with natural steps, got {inference!r}")
    inference.check(model)
    if isinstance(inference, AnalyticVI) and inference.objective == "tight":
        raise ValueError("objective=\"tight\" runs two fits in turn; here run them yourself: "
                         "fit with objective=\"augmented\", then fit the result's model with "
                         "QuadratureVI / QuadratureSVI (inference.vi.tight_stage)")
    if isinstance(model.q, SiteQ):
        raise ValueError("q='site' takes a Fisher step that is not a sum over points; use "
                         "another q parameterisation")
    return check_step_settings(inference, max_iter, hyper_every)


def _mesh(devices):
    available = jax.devices()
    if isinstance(devices, int):
        if not 1 <= devices <= len(available):
            raise ValueError(f"devices={devices}, but JAX sees {len(available)} device(s) "
                             "(on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
        devices = available[:devices]
    devices = list(devices)
    if not devices:
        raise ValueError("devices is empty")
    return jax.sharding.Mesh(np.array(devices), ("data",))


def _client(client, n_workers, stack):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ImportError("distributed.fit on a Dask cluster needs dask and distributed: "
                          'pip install "augmentedgp[distributed]" (or pass devices= to shard '
                          "over JAX devices)") from None

    if isinstance(client, Client):
        return client
    if isinstance(client, str):
        return stack.enter_context(Client(client))
    if client is not None:
        raise ValueError(f"client must be a dask.distributed Client, a scheduler address or "
                         f"None, got {client!r}")
    n_workers = check_int(n_workers, "n_workers")
    cluster = stack.enter_context(LocalCluster(n_workers=n_workers, threads_per_worker=1,
                                               processes=True, dashboard_address=":0"))
    return stack.enter_context(Client(cluster))


__all__ = ["fit", "partition_statistics"]

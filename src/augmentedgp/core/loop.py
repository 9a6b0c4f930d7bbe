"""The one training loop: minimise an objective over a model's trainable parameters.

Gradient optimisers (optax) run jitted steps inside ``lax.scan`` chunks; between chunks
the loop records history, checks convergence and non-finite values, reports progress
and calls callbacks. ``"lbfgs"`` drives scipy's L-BFGS-B with jitted JAX gradients.
A step that makes the objective or the parameters non-finite never loses work: the loop
stops and returns the last finite state, with the reason in ``History.message`` and a
``RuntimeWarning`` naming the iteration.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable
from typing import Literal, NamedTuple, Protocol, get_args

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from augmentedgp.core.errors import user_stacklevel
from augmentedgp.core.params import is_parameter, partition_trainable
from augmentedgp.core.validation import check_int


class GradientTransformation(Protocol):
    """What the loop needs of an optimizer: optax's ``GradientTransformation`` (a pair of
    pure functions), named here so that annotations need not import optax."""

    init: Callable
    update: Callable


Status = Literal["converged", "early_stopped", "max_iter", "budget", "callback", "non_finite",
                 "stalled"]
"""How a fit ended: ``"converged"`` (the stopping rule's change fell below ``tol``),
``"early_stopped"`` (a monitored held-out metric stopped improving; the best state is kept),
``"max_iter"`` (the iterations the user allowed ran out), ``"budget"`` (a default budget of
the library's ran out: the fit is usable, a longer one may still improve), ``"callback"``
(the callback returned True), ``"non_finite"`` (the last finite state was kept) or
``"stalled"`` (L-BFGS could not make progress, e.g. its line search failed)."""

STATUSES: tuple[str, ...] = get_args(Status)


@dataclasses.dataclass(eq=False)
class History:
    """Per iteration: objective, cumulative wall time (s) and natural-gradient step size
    (NaN where none); per chunk: the held-out metric if one was monitored; how it ended
    (``status``, and in words ``message``)."""

    objective: np.ndarray
    wall_time: np.ndarray
    status: Status = "max_iter"
    message: str = ""
    restarts: list = dataclasses.field(default_factory=list)
    step_size: np.ndarray | None = None
    validation: np.ndarray | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def converged(self) -> bool:
        """Whether the fit met its stopping rule (``status`` "converged" or
        "early_stopped")."""
        return self.status in ("converged", "early_stopped")

    @property
    def n_iter(self) -> int:
        """The number of iterations recorded."""
        return int(self.objective.shape[0])

    def then(self, later: History, label: str) -> History:
        """This history followed by ``later``'s, a later stage of the same fit (its wall
        times counted on, ``label`` naming it in the message); ended as ``later`` ended."""
        cat = lambda a, b: None if a is None or b is None else np.concatenate([a, b])
        start = self.wall_time[-1] if self.wall_time.size else 0.0
        return History(np.concatenate([self.objective, later.objective]),
                       np.concatenate([self.wall_time, start + later.wall_time]),
                       later.status, f"{self.message}; then {label}: {later.message}",
                       self.restarts + later.restarts,
                       cat(self.step_size, later.step_size),
                       cat(self.validation, later.validation))


def _relative_change(values, window):
    if len(values) < 2 * window:
        return np.inf
    recent, before = np.mean(values[-window:]), np.mean(values[-2 * window : -window])
    return abs(recent - before) / (abs(before) + 1.0)


def minimize(
    loss: Callable,
    model,
    *args,
    optimizer: str | GradientTransformation = "lbfgs",
    max_iter: int = 1000,
    learning_rate: float = 0.05,
    tol: float = 1e-9,
    chunk_size: int = 50,
    window: int = 20,
    callback: Callable | None = None,
    verbose: bool = False,
):
    """Minimise ``loss(model, *args)`` over the model's trainable parameters.

    ``loss`` should be a module-level function and ``args`` its data (arrays, inference
    objects): compiled steps are then cached across calls and restarts. Returns
    ``(model, History)``. ``optimizer`` is ``"lbfgs"``, ``"adam"`` or any optax
    GradientTransformation. ``callback(iteration, objective, model)`` runs between chunks
    (every L-BFGS iteration) and may return True to stop.
    """
    max_iter = check_int(max_iter, "max_iter", low=0)
    params, static = partition_trainable(model)
    if not jax.tree_util.tree_leaves(params) or max_iter == 0:
        value = float(_value(params, static, loss, args))
        return model, History(np.array([value]), np.zeros(1), "converged", "nothing to optimise")
    if isinstance(optimizer, str) and optimizer.lower() in ("lbfgs", "l-bfgs", "l-bfgs-b"):
        return _minimize_lbfgs(loss, args, params, static, max_iter, tol, callback, verbose)
    opt = optax_optimizer(optimizer, learning_rate)
    to_model = lambda c: eqx.combine(c.params, static)
    carry, hist = run_steps(_optax_step, OptaxState(params, opt.init(params)),
                            (static, loss, args, opt), to_model, max_iter=max_iter, tol=tol,
                            chunk_size=chunk_size, window=window, callback=callback,
                            verbose=verbose)
    return to_model(carry), hist


def optax_optimizer(optimizer, learning_rate):
    """"adam" (at ``learning_rate``) or an optax GradientTransformation."""
    if isinstance(optimizer, str):
        if optimizer.lower() != "adam":
            raise ValueError("optimizer must be 'lbfgs', 'adam' or an optax transformation, "
                             f"got {optimizer!r}")
        return _adam(learning_rate)
    import optax

    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError("optimizer must be 'adam' or an optax GradientTransformation, got "
                        f"{type(optimizer).__name__} {optimizer!r}")
    return optimizer


@functools.lru_cache(maxsize=32)
def _adam(learning_rate):
    import optax

    return optax.adam(learning_rate)  # one object per rate, so compiled chunks are reused


@eqx.filter_jit
def _value(params, static, loss, args):
    return loss(eqx.combine(params, static), *args)


@eqx.filter_jit
def _value_and_grad(params, static, loss, args):
    return jax.value_and_grad(lambda p: loss(eqx.combine(p, static), *args))(params)


class OptaxState(NamedTuple):
    """The carry of a plain optax minimisation."""

    params: object  # the trainable parameters
    opt_state: object  # the optimizer's state


def _optax_step(carry: OptaxState, args):
    import optax

    static, loss, loss_args, opt = args
    value, grad = jax.value_and_grad(lambda q: loss(eqx.combine(q, static), *loss_args))(
        carry.params)
    updates, opt_state = opt.update(grad, carry.opt_state, carry.params)
    return OptaxState(optax.apply_updates(carry.params, updates), opt_state), (value, jnp.nan)


class Minibatches(NamedTuple):
    """A stream of minibatches from shuffled epochs: ``key`` draws the permutation ``perm``
    of each new epoch (the way GPflow and GPyTorch users iterate over a data set)."""

    key: jax.Array
    perm: jax.Array

    @classmethod
    def start(cls, key, n: int) -> Minibatches:
        return cls(key, jnp.arange(n))


def minibatch(stream: Minibatches, t, batch_size: int | None, replace: bool = False):
    """(rows of step t, or None for the full batch; the advanced stream; the scale
    n / |B| of the minibatch estimate). Without ``replace``, step t takes the
    (t mod n // |B|)-th slice of the epoch's permutation, a new permutation drawn when an
    epoch starts. With ``replace``, |B| rows drawn uniformly with replacement using
    ``stream.key`` as it is (the caller passes a fresh key each step; the particle flows
    draw this way, O(|B|) per step)."""
    n = stream.perm.shape[0]
    if batch_size is None or batch_size >= n:
        return None, stream, 1.0
    if replace:
        return jax.random.randint(stream.key, (batch_size,), 0, n), stream, n / batch_size
    b = t % (n // batch_size)
    key, sub = jax.random.split(stream.key)
    perm = lax.cond(b == 0, lambda: jax.random.permutation(sub, n), lambda: stream.perm)
    rows = lax.dynamic_slice(perm, (b * batch_size,), (batch_size,))
    return rows, Minibatches(key, perm), n / batch_size


def bucket_size(n: int) -> int:
    """The padded length of n rows: at least 64, otherwise n rounded up to one of 8 sizes
    per octave (at most 12.5 % padding), so that full-batch fits on data sets of similar
    size share one compiled training program."""
    if n <= 64:
        return 64
    step = 1 << max(n.bit_length() - 4, 0)
    return -(-n // step) * step


def pad_rows(X, y):
    """(X, y, weights) padded to :func:`bucket_size` rows by repeating the first row, with
    weight 0 on the padding and 1 on the data (always an array, so that padded and
    unpadded data sets share one program). Done in numpy: nothing is compiled per size."""
    X, y = np.asarray(X), np.asarray(y)
    n = X.shape[0]
    index = np.concatenate([np.arange(n), np.zeros(bucket_size(n) - n, dtype=int)])
    weights = (np.arange(index.shape[0]) < n).astype(X.dtype)
    return jnp.asarray(X[index]), jnp.asarray(y[index]), jnp.asarray(weights)


def finite_as(tree, ref) -> jax.Array:
    """True unless an inexact entry of ``tree`` is non-finite where the same entry of
    ``ref`` (a pytree of the same structure) is finite: a parameter became NaN or inf. An
    optimizer's state may hold infinities of its own (a best value so far), which stay."""
    ok = jnp.array(True)
    for a, b in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(ref),
                    strict=True):
        if eqx.is_inexact_array(a):
            ok = ok & jnp.all(jnp.isfinite(a) | ~jnp.isfinite(b))
    return ok


_finite_as = eqx.filter_jit(finite_as)


@eqx.filter_jit
def _run_chunk(step, carry, args, length):
    def body(c, _):  # the objective of a state whose entries became non-finite reads NaN
        new, (value, rho) = step(c, args)
        return new, (jnp.where(finite_as(c, carry), value, jnp.nan), rho)

    return lax.scan(body, carry, None, length=length)


def describe(model, limit: int = 6) -> str:
    """The model's type and its first ``limit`` trainable hyperparameters with their
    values, e.g. ``"GP (kernel.lengthscale = 1e-300, kernel.variance = 1e-300)"``, for
    error messages."""
    flat = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_parameter)[0]
    items = []
    for path, p in flat:
        if not (is_parameter(p) and p.trainable):
            continue
        value = np.asarray(p.value)
        text = (f"{float(value):.6g}" if value.size == 1 else
                f"array of shape {value.shape} in [{np.min(value):.3g}, {np.max(value):.3g}]")
        items.append(f"{jax.tree_util.keystr(path).lstrip('.')} = {text}")
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    listing = ", ".join(items[:limit]) + more
    return f"{type(model).__name__} ({listing or 'no trainable hyperparameters'})"


def _not_finite_at_start(model) -> ValueError:
    return ValueError(
        f"model: the objective (or its gradient) is not finite at the initial hyperparameters "
        f"of {describe(model)}; check the data (standardise X and y) and the initial "
        "hyperparameters (a lengthscale, variance or noise far from the data's scale)")


def run_steps(step: Callable, carry, args, to_model: Callable, *, max_iter: int, tol: float,
              chunk_size: int = 50, window: int = 20, callback: Callable | None = None,
              verbose: bool = False, monitor: Callable | None = None, patience: int = 5,
              runner: Callable | None = None, on_chunk: Callable | None = None,
              resume: tuple | None = None):
    """The training loop. ``step(carry, args) -> (carry, (objective, step_size))`` is a
    module-level function, run jitted in ``lax.scan`` chunks of ``chunk_size``; between
    chunks: history, non-finite rollback (the last finite state is kept), progress,
    ``callback(iteration, objective, model)`` (True stops) and convergence, which is the
    relative change of the mean objective over two ``window``s below ``tol`` or, with
    ``monitor(model) -> float`` (lower is better, e.g. a held-out NLPD), no improvement of
    the monitored value for ``patience`` chunks (the best monitored state is returned).
    Returns ``(carry, History)``.

    ``runner(step, carry, args, length)`` replaces the compiled chunk (a driver loop whose
    steps leave the process, :mod:`augmentedgp.training.distributed`); ``on_chunk(carry, (values,
    step_sizes, times))`` runs after every finite chunk (checkpoints), and ``resume`` =
    those three lists continues a run that stopped there: it then ends as the uninterrupted
    run would (same chunk boundaries, same convergence test).
    """
    max_iter = check_int(max_iter, "max_iter", low=0)
    chunk_size, window, patience = (check_int(v, name) for v, name in (
        (chunk_size, "chunk_size"), (window, "window"), (patience, "patience")))
    run_chunk = _run_chunk if runner is None else runner
    values, sizes, times = ([], [], []) if resume is None else map(list, resume)
    monitored = []
    message, status = "max_iter reached", "max_iter"
    best = (np.inf, carry, 0)
    prev = None  # (carry at the start of the last chunk, its length): the rollback point
    start = time.perf_counter() - (times[-1] if times else 0.0)
    report = progress(verbose, max_iter)
    while len(values) < max_iter:
        length = min(chunk_size, max_iter - len(values))
        new_carry, (chunk, rho) = run_chunk(step, carry, args, length)
        chunk = np.asarray(chunk)
        bad = ~np.isfinite(chunk)
        if not bad.any() and not bool(_finite_as(new_carry, carry)):
            bad = np.append(bad, True)  # the chunk's last update made a parameter non-finite
        if bad.any():  # keep the last finite state, never return NaN parameters
            # chunk[j] is the objective *before* update j (NaN where that state has a
            # non-finite entry), so the state after k - 1 updates is the last finite one
            k = int(np.argmax(bad))
            if k == 0 and not values:
                raise _not_finite_at_start(to_model(carry))
            message, status = ("stopped: the objective or the parameters became non-finite "
                               f"at iteration {len(values) + k}"), "non_finite"
            warnings.warn(message + "; returning the last finite state (lower the learning rate "
                          "or standardise the data)", RuntimeWarning,
                          stacklevel=user_stacklevel())
            if k > 1:
                carry, _ = run_chunk(step, carry, args, k - 1)
            elif k == 0:  # this chunk's start came from the previous chunk's last update
                if prev is None:
                    raise ValueError("resume: the objective is not finite at the resumed "
                                     "state")
                prev_carry, prev_length = prev
                carry = (prev_carry if prev_length == 1
                         else run_chunk(step, prev_carry, args, prev_length - 1)[0])
            values.extend(chunk[:k].tolist())
            sizes.extend(np.asarray(rho)[:k].tolist())
            times.extend([time.perf_counter() - start] * k)
            break
        prev, carry = (carry, length), new_carry
        values.extend(chunk.tolist())
        sizes.extend(np.asarray(rho).tolist())
        times.extend([time.perf_counter() - start] * length)
        if on_chunk is not None:
            on_chunk(carry, (values, sizes, times))
        report(len(values), values[-1])
        if callback is not None and callback(len(values), values[-1], to_model(carry)):
            message, status = "stopped by callback", "callback"
            break
        if monitor is not None:
            monitored.append(float(monitor(to_model(carry))))
            if monitored[-1] < best[0]:
                best = (monitored[-1], carry, len(monitored))
            elif len(monitored) - best[2] >= patience:
                carry, status = best[1], "early_stopped"
                message = (f"converged (held-out metric did not improve for {patience} chunks; "
                           f"best state after chunk {best[2]} kept)")
                break
        elif _relative_change(values, window) < tol:
            message, status = "converged (relative change of the objective below tol)", "converged"
            break
    report(None, None)
    hist = History(np.array(values), np.array(times), status, message, step_size=np.array(sizes),
                   validation=np.array(monitored) if monitor is not None else None)
    return carry, hist


def progress(verbose, total, description="training"):
    """A rich progress bar (verbose=True) updated between chunks or iterations; a no-op
    otherwise. ``update(None, None)`` closes it."""
    if not verbose:
        return lambda i, value=None: None
    from rich.progress import Progress

    bar = Progress(*Progress.get_default_columns(), "[cyan]{task.fields[objective]}")
    task = bar.add_task(description, total=total, objective="")
    bar.start()

    def update(i, value=None):
        if i is None:  # done (possibly early, at convergence)
            bar.update(task, total=bar.tasks[0].completed or total)
            bar.stop()
        else:
            bar.update(task, completed=i,
                       objective="" if value is None else f"objective {value: .6e}")

    return update


def _minimize_lbfgs(loss, args, params, static, max_iter, tol, callback, verbose):
    flat0, unravel = ravel_pytree(params)
    best = {"x": np.asarray(flat0), "f": np.inf}

    def fun(x):
        f, g = _value_and_grad(unravel(jnp.asarray(x)), static, loss, args)
        f, g = float(f), np.asarray(ravel_pytree(g)[0], dtype=float)
        if not np.isfinite(f) or not np.all(np.isfinite(g)):
            return np.inf, np.zeros_like(g)  # line search backs off
        if f < best["f"]:
            best.update(x=np.array(x), f=f)
        return f, g

    values, times, start = [], [], time.perf_counter()
    stop = {"flag": False}
    report = progress(verbose, max_iter, "L-BFGS")

    def on_iter(intermediate_result):
        values.append(float(intermediate_result.fun))
        times.append(time.perf_counter() - start)
        report(len(values), values[-1])
        x_now = jnp.asarray(intermediate_result.x)
        if callback is not None and callback(len(values), values[-1],
                                             eqx.combine(unravel(x_now), static)):
            stop["flag"] = True
            raise StopIteration

    import scipy.optimize  # on first use: ~0.2 s that `import augmentedgp` need not pay

    f0, _ = fun(best["x"])
    if not np.isfinite(f0):
        raise _not_finite_at_start(eqx.combine(params, static))
    try:
        res = scipy.optimize.minimize(fun, best["x"], jac=True, method="L-BFGS-B",
                                      callback=on_iter,
                                      options={"maxiter": max_iter, "ftol": tol, "gtol": 1e-8})
    finally:
        report(None, None)
    x = res.x if np.isfinite(res.fun) and res.fun <= best["f"] else best["x"]
    if not values:
        values, times = [float(best["f"])], [time.perf_counter() - start]
    # scipy's status: 0 converged, 1 iteration or evaluation limit, 2 no progress (e.g. the
    # line search failed); its message goes into the history in the library's words
    if stop["flag"]:
        status, message = "callback", "stopped by callback"
    elif res.status == 0:
        status, message = "converged", "converged (L-BFGS: relative reduction below tol)"
    elif res.status == 1:
        status, message = "max_iter", "max_iter reached"
    else:
        status, message = "stalled", f"L-BFGS stopped without progress ({res.message})"
    hist = History(np.array(values), np.array(times), status, message)
    return eqx.combine(unravel(jnp.asarray(x)), static), hist

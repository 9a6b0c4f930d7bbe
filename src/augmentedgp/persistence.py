"""Save and load fitted models without pickled code.

A model directory holds two files:

- ``manifest.json``: the format and library version, the saved object's class, its
  likelihood, its settings and label mapping (for humans and tools), the SHA-256 of the
  array file, ``tree``: the object's structure -- class names (resolved only inside
  ``augmentedgp`` when loading), field names, Python scalars and strings, with each array
  replaced by its key in the array file, its dtype and its shape -- and ``manifest_sha256``:
  the SHA-256 of the manifest itself, taken over its canonical JSON (keys sorted, no
  whitespace, ASCII) without the ``manifest_sha256`` field. The two digests together cover
  everything that loading reads: an edited number, class name or array is detected;
- ``arrays.npz``: every array, read back with ``allow_pickle=False``.

Loading trusts nothing in the directory, and every problem raises :class:`ModelFileError`
naming the file: both files must lie inside the model directory (the manifest's file name
must be a plain name -- no path separator, no ``..``, not absolute -- and a link must not
lead outside the directory); the manifest must be strict JSON in UTF-8, nested at most
``MAX_DEPTH`` levels; every node of ``tree`` must have the structure :func:`save` writes;
the root must be of the manifest's ``model_class``; the array file must hold exactly the
arrays the tree names, with the dtypes and shapes it records; each field of a library class
must hold what the class's annotation declares (a ``Parameter`` field a ``Parameter``, a
``Kernel`` field a kernel, an array field an array; the error names the field's path); and
every float array -- outside a training ``History``, whose traces hold NaN where nothing was
measured -- and every parameter's constrained value must be finite and below sqrt(max float)
in magnitude (the library squares what it stores: ``1e308`` would predict inf). These checks
hold even against a manifest whose digests were recomputed. Directories of model format 1
(augmentedgp 0.1.0, before the manifest digest) still load: their arrays are checked
against the array checksum, their manifest by its structure only. The digests detect
corruption and edits, not a forgery by someone who recomputes them; that the file holds no
code is what makes loading safe.

Any object built from augmentedgp classes can be saved: fitted posteriors of every model
(``GP``, ``SGPR``, ``VGP``, ``SVGP``, ``MCGP``), unfitted models, and the scikit-learn
estimators of :mod:`augmentedgp.sklearn`. An unfitted ``SGPR`` saved before the collapsed
models became one class each (its ``method`` field: "vfe", "dtc", "fitc" or "taylor") loads
as ``SGPR``, ``DTC``, ``FITC`` or ``TaylorSGPR``. Objects holding code (functions, classes from
outside the library) are refused when saving, with the path of the offending field.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import importlib
import inspect
import io
import json
import math
import os
import sys
import types
import typing
import zipfile
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from augmentedgp.core.errors import AugmentedGPError
from augmentedgp.core.loop import History
from augmentedgp.core.params import Parameter
from augmentedgp.core.version import __version__

FORMAT = "augmentedgp-model"
FORMAT_VERSION = 2
# Format 1 (0.1.0): no manifest digest, no dtype and shape in the array nodes.
_READABLE_FORMATS = (1, 2)
MANIFEST, ARRAYS = "manifest.json", "arrays.npz"
_DIGEST = "manifest_sha256"
MAX_DEPTH = 200  # nesting levels of the manifest's JSON; the library's models need < 20
_DTYPE_KINDS = "biufcUS"  # booleans, numbers and (label) strings: nothing that needs pickle
_PACKAGE = __package__  # "augmentedgp"


class ModelFileError(AugmentedGPError, ValueError):
    """A model directory is missing, corrupted, or written by an incompatible version."""


def _compatible(saved: str, current: str) -> bool:
    """Same major version, and for 0.x the same minor version (semantic versioning)."""
    s, c = (str(saved).split(".") + ["", ""])[:2], (current.split(".") + ["", ""])[:2]
    return s[0].isdigit() and s[0] == c[0] and (s[0] != "0" or s[1] == c[1])


# --- encoding ---------------------------------------------------------------------------


class _Encoder:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, value, kind: str):
        key = f"a{len(self.arrays)}"
        value = self.arrays[key] = np.asarray(value)
        return {"__array__": key, "kind": kind, "dtype": value.dtype.str,
                "shape": list(value.shape)}

    def __call__(self, obj, path: str):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            return float(obj) if math.isfinite(obj) else {"__float__": repr(float(obj))}
        if isinstance(obj, np.bool_):
            return bool(obj)
        if isinstance(obj, jax.Array):
            if jnp.issubdtype(obj.dtype, jax.dtypes.prng_key):
                out = self.array(jax.random.key_data(obj), "key")
                out["impl"] = str(jax.random.key_impl(obj))
                return out
            return self.array(obj, "jax")
        if isinstance(obj, np.ndarray):
            if obj.dtype == object:  # labels or feature names: kept in the JSON
                items = obj.ravel().tolist()
                if not all(isinstance(v, (str, int, float, bool)) for v in items):
                    raise ValueError(f"cannot save {path}: an object array holding other than "
                                     "strings and numbers (it would need pickle)")
                return {"__objects__": items, "shape": list(obj.shape)}
            return self.array(obj, "numpy")
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple
            return {"__namedtuple__": self._class_name(obj, path),
                    "fields": {f: self(getattr(obj, f), f"{path}.{f}") for f in obj._fields}}
        if isinstance(obj, np.random.RandomState):  # scikit-learn's random_state
            name, keys, pos, has_gauss, cached = obj.get_state()
            return {"__randomstate__": [name, self.array(keys, "numpy"), pos, has_gauss, cached]}
        if isinstance(obj, (tuple, list)):
            items = [self(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            return {"__tuple__": items} if isinstance(obj, tuple) else items
        if isinstance(obj, dict):
            if not all(isinstance(k, str) for k in obj):
                raise ValueError(f"cannot save {path}: dictionary keys must be strings")
            return {"__dict__": {k: self(v, f"{path}[{k!r}]") for k, v in obj.items()}}
        name = self._class_name(obj, path)
        if dataclasses.is_dataclass(obj):  # equinox modules and the library's dataclasses
            return {"__object__": name,
                    "fields": {f.name: self(getattr(obj, f.name), f"{path}.{f.name}")
                               for f in dataclasses.fields(obj) if f.name in vars(obj)}}
        if hasattr(obj, "__dict__"):  # plain classes: the scikit-learn estimators, Standardizer
            return {"__instance__": name,
                    "state": {k: self(v, f"{path}.{k}") for k, v in vars(obj).items()}}
        raise ValueError(f"cannot save {path}: {type(obj).__name__} is not a library object")

    @staticmethod
    def _class_name(obj, path):
        cls = type(obj)
        if not cls.__module__.startswith(_PACKAGE + ".") or "<locals>" in cls.__qualname__:
            what = ("a function" if inspect.isroutine(obj) or isinstance(obj, functools.partial)
                    else f"{cls.__module__}.{cls.__qualname__}")
            raise ValueError(
                f"cannot save {path}: it holds {what}, which is not an augmentedgp class; "
                "model files hold no code, so only the library's own classes can be saved")
        return f"{cls.__module__}:{cls.__qualname__}"


# --- decoding ---------------------------------------------------------------------------


# Modules of the flat layout of version 0.1.0, and where their classes live now: files saved
# by that version name their classes by these module paths.
_MOVED = {
    "augmentedgp.errors": ("augmentedgp.core.errors",),
    "augmentedgp.linalg": ("augmentedgp.core.linalg",),
    "augmentedgp.params": ("augmentedgp.core.params",),
    "augmentedgp.training": ("augmentedgp.core.loop",),
    "augmentedgp.kernels": ("augmentedgp.kernels.covariance",),
    "augmentedgp.means": ("augmentedgp.kernels.means",),
    "augmentedgp.augmentation": ("augmentedgp.augmentation.protocol",),
    "augmentedgp.likelihoods": ("augmentedgp.likelihoods.base", "augmentedgp.likelihoods.robust",
                                "augmentedgp.likelihoods.binary", "augmentedgp.likelihoods.counts",
                                "augmentedgp.likelihoods.positive"),
    "augmentedgp.multilatent": ("augmentedgp.likelihoods.base",
                                "augmentedgp.likelihoods.multiclass",
                                "augmentedgp.likelihoods.heteroscedastic"),
    "augmentedgp.variational": ("augmentedgp.variational.families",),
    "augmentedgp.schedules": ("augmentedgp.variational.schedules",),
    "augmentedgp.posterior": ("augmentedgp.models.sites",),
    "augmentedgp.models": ("augmentedgp.models.gp",),
    "augmentedgp.sparse": ("augmentedgp.models.sparse",),
    "augmentedgp.gibbs": ("augmentedgp.models.mcgp", "augmentedgp.inference.gibbs"),
    "augmentedgp.inference": ("augmentedgp.models.approximations", "augmentedgp.inference.vi"),
    "augmentedgp.flow": ("augmentedgp.inference.flow", "augmentedgp.inference.flow_gp"),
    "augmentedgp.bayesian": ("augmentedgp.contrib.bayesian",),
}


# Classes that were one class with a static field choosing the model, now one class per
# model: (the field, {its value: the class now}). Files saved before the split name the old
# class with that field; they load as the class of the value.
_SPLIT = {
    "augmentedgp.models.sparse:SGPR": ("method", {
        "vfe": "augmentedgp.models.sparse:SGPR", "dtc": "augmentedgp.models.sparse:DTC",
        "fitc": "augmentedgp.models.sparse:FITC",
        "taylor": "augmentedgp.models.sparse:TaylorSGPR"}),
}


def _lookup(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _is_name(dotted: str) -> bool:
    """Identifiers joined by dots, none of them a dunder (``__main__``, ``__class__``)."""
    return all(p.isidentifier() and not (p.startswith("__") and p.endswith("__"))
               for p in dotted.split("."))


def _resolve(name):
    if not isinstance(name, str) or name.count(":") != 1:
        raise ModelFileError(f"corrupted model tree: {name!r} is not a class name "
                             "('module:qualname')")
    module, _, qualname = name.partition(":")
    if not (module == _PACKAGE or module.startswith(_PACKAGE + ".")):
        raise ModelFileError(f"the model file refers to {name}, outside augmentedgp; refusing "
                             "to load it")
    if not (_is_name(module) and _is_name(qualname)):
        raise ModelFileError(f"the model file refers to {name!r}, which is not an augmentedgp "
                             "class name; refusing to load it")
    obj = None
    for candidate in _MOVED.get(module, (module,)):
        try:
            obj, module = _lookup(candidate, qualname), candidate
            break
        except (ImportError, AttributeError):
            continue
    if obj is None:
        raise ModelFileError(f"the model file refers to {name.replace(':', '.')}, which this "
                             f"version of augmentedgp ({__version__}) does not have")
    if not isinstance(obj, type):
        raise ModelFileError(f"the model file refers to {name}, which is not a class")
    if (obj.__module__, obj.__qualname__) != (module, qualname):
        raise ModelFileError(f"the model file refers to {name}, which is not an augmentedgp "
                             "class; refusing to load it")
    return obj


# The kinds of node that _Encoder writes: marker -> (required keys, optional keys).
_NODES = {
    "__array__": ({"__array__", "kind"}, {"impl", "dtype", "shape"}),
    "__randomstate__": ({"__randomstate__"}, set()),
    "__objects__": ({"__objects__", "shape"}, set()),
    "__float__": ({"__float__"}, set()),
    "__tuple__": ({"__tuple__"}, set()),
    "__dict__": ({"__dict__"}, set()),
    "__namedtuple__": ({"__namedtuple__", "fields"}, set()),
    "__object__": ({"__object__", "fields"}, set()),
    "__instance__": ({"__instance__", "state"}, set()),
}
_CLASS_NODES = ("__namedtuple__", "__object__", "__instance__")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _is_shape(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)


_ARRAYS = (jax.Array, np.ndarray)
# Annotations checked exactly: a field declared bool, int or str holds one (int: not a bool).
_EXACT = {bool: (bool,), int: (int,), str: (str,)}


def _classes(hint) -> tuple[type, ...] | None:
    """The classes a resolved annotation allows a value to be an instance of (``X | None``,
    ``list[Kernel]`` -> list), or None where isinstance cannot decide (``object``, ``Any``,
    ``float``: arrays stand for floats, literals, type variables)."""
    if hint is None or hint is type(None):
        return (type(None),)
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        parts = [_classes(a) for a in typing.get_args(hint)]
        return None if any(p is None for p in parts) else tuple(c for p in parts for c in p)
    if origin is not None:  # a generic: its container class
        return (origin,) if isinstance(origin, type) else None
    if not isinstance(hint, type) or hint in (object, float, complex):
        return None
    if hint in _EXACT:
        return _EXACT[hint]
    return _ARRAYS if hint is jax.Array else (hint,)  # a JAX field may hold a NumPy array


def _label(cls: type) -> str:
    return {type(None): "None", jax.Array: "jax.Array", np.ndarray: "numpy.ndarray"}.get(
        cls, cls.__qualname__)


def _checked(classes: tuple[type, ...]) -> bool:
    """Whether a field of these classes is checked: library classes, equinox modules, arrays
    and the exact scalars (not plain containers, whose items the class checks itself)."""
    return any(c.__module__.split(".")[0] == _PACKAGE or issubclass(c, (eqx.Module, *_ARRAYS))
               or c in (bool, int, str) for c in classes)


def _hint(klass: type, name: str, annotation):
    """One annotation of ``klass`` resolved in its module (a string under postponed
    evaluation); None if it cannot be resolved."""
    holder = types.SimpleNamespace(__annotations__={name: annotation})
    module = vars(sys.modules[klass.__module__])
    try:  # module names first, as typing.get_type_hints(klass) resolves them
        return typing.get_type_hints(holder, module, {**vars(klass), **module})[name]
    except (NameError, TypeError, AttributeError, SyntaxError, KeyError):
        return None


class _Fields(typing.NamedTuple):
    """What a class declares of its fields: ``classes``, for each checked field
    (:func:`_checked`), the classes a loaded value must be an instance of; ``trees``, the
    fields declared ``object`` or ``Any`` (any pytree: a partition's leaves may be None)."""

    classes: dict[str, tuple[type, ...]]
    trees: frozenset[str]


@functools.cache
def _fields_of(cls: type) -> _Fields:
    """The declared fields of ``cls`` (dataclass, NamedTuple or plain class). Each annotation
    is resolved on its own, so one that cannot be resolved checks nothing."""
    classes, trees = {}, set()
    for klass in reversed(cls.__mro__):
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            hint = _hint(klass, name, annotation)
            found = _classes(hint)
            classes.pop(name, None)  # a subclass's annotation replaces its base's
            trees.discard(name)
            if found is not None and _checked(found):
                classes[name] = found
            elif hint is object or hint is typing.Any:
                trees.add(name)
    return _Fields(classes, frozenset(trees))


@functools.cache
def _settings_of(cls: type) -> frozenset[str]:
    """The constructor's parameters of a plain class (scikit-learn's settings, which may be
    ``inf``); its other attributes are fitted state."""
    try:
        return frozenset(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return frozenset()


class _Decoder:
    """Rebuilds the object of a manifest's tree, checking each node's structure; ``where``
    is the node's path in the tree, for the messages. ``typed``: array nodes carry their
    dtype and shape (format 2 on).

    Beyond the structure, each field of a library class is checked against the class's
    annotation (:func:`_fields_of`: a ``Parameter`` field holds a ``Parameter``, a
    ``Kernel`` field a kernel), every float array outside a training :class:`History` (whose
    traces hold NaN where a quantity was not measured) is finite, and so is every
    parameter's constrained value (``exp(1e308)`` is not) and every number of a plain
    object's fitted state (not its constructor's settings)."""

    def __init__(self, arrays: dict[str, np.ndarray], typed: bool):
        self.arrays, self.typed = arrays, typed
        self.used: set[str] = set()
        self.traces = 0  # > 0 while decoding a History: non-finite values are allowed there
        self.trees = 0  # > 0 inside a field declared `object`: a partition's leaves may be None

    def decode_fields(self, cls: type, fields: dict, where: str) -> dict:
        """The decoded values of a class's fields, checked against its annotations."""
        trees, trace = _fields_of(cls).trees, issubclass(cls, History)
        values = {}
        self.traces += trace
        try:
            for k, v in fields.items():
                self.trees += k in trees
                try:
                    values[k] = self(v, f"{where}.{k}")
                finally:
                    self.trees -= k in trees
        finally:
            self.traces -= trace
        self.typecheck(cls, values, where)
        return values

    def typecheck(self, cls: type, values: dict, where: str):
        """Each value is an instance of what ``cls`` declares for its field; inside a field
        declared ``object`` (equinox's partitions, as a Gibbs chain's hyperparameter draws)
        an array may be None: a leaf left out."""
        declared = _fields_of(cls).classes
        for k, v in values.items():
            if k not in declared or (v is None and self.trees and declared[k] == _ARRAYS):
                continue
            if not isinstance(v, declared[k]):
                names = " or ".join(sorted({_label(c) for c in declared[k]}))
                self.fail(f"{where}.{k}", f"{cls.__qualname__}.{k} must be {names}, the "
                                           f"file holds {_label(type(v))}")

    def finite(self, value, where: str, what: str):
        """A float array outside a History is finite, and so is its square: the library
        squares what it stores (distances, ``L L^T``, ``y^T alpha``), so a number above
        sqrt(max) -- ``1e308`` written into an array -- would predict inf or NaN."""
        if self.traces == 0 and value.dtype.kind in "fc":
            bound = math.sqrt(np.finfo(value.dtype).max)
            with np.errstate(invalid="ignore", over="ignore"):
                ok = bool(np.all(np.abs(value) < bound))  # False for NaN and inf
            if not ok:
                self.fail(where, f"{what} holds NaN, inf or a number above {bound:.3g} in "
                                 "magnitude (its square overflows); a model's arrays are "
                                 "finite")

    @staticmethod
    def fail(where: str, what: str):
        raise ModelFileError(f"corrupted model tree at {where}: {what}")

    def check(self, cond, where: str, what: str):
        if not cond:
            self.fail(where, what)

    def __call__(self, node, where: str):
        if node is None or isinstance(node, (bool, int, str)):
            return node
        if isinstance(node, float):  # non-finite floats are written as {"__float__": ...}
            self.check(math.isfinite(node), where, f"the number {node} is out of range")
            return node
        if isinstance(node, list):
            return [self(v, f"{where}[{i}]") for i, v in enumerate(node)]
        self.check(isinstance(node, dict), where, f"unexpected {type(node).__name__}")
        kind = next((k for k in _NODES if k in node), None)
        if kind is None:
            self.fail(where, f"unknown node with keys {sorted(node)[:10]}")
        required, optional = _NODES[kind]
        self.check(required <= node.keys() <= required | optional, where,
                   f"a {kind!r} node with the keys {sorted(node)[:10]} (expected "
                   f"{sorted(required)}, optionally {sorted(optional)})")
        return getattr(self, "node_" + kind.strip("_"))(node, where)

    def node_array(self, node, where):
        key, kind = node["__array__"], node["kind"]
        self.check(isinstance(key, str), where, "the array key is not a string")
        self.check(kind in ("numpy", "jax", "key"), where, f"unknown array kind {kind!r}")
        if key not in self.arrays:
            raise ModelFileError(f"corrupted model directory: array {key!r} (at {where}) is "
                                 f"missing from {ARRAYS}")
        self.used.add(key)
        value = self.arrays[key]
        self.check(isinstance(value, np.ndarray) and value.dtype.kind in _DTYPE_KINDS, where,
                   f"array {key!r} of {ARRAYS} is not an array of booleans, numbers or strings")
        if self.typed or "dtype" in node or "shape" in node:
            dtype, shape = node.get("dtype"), node.get("shape")
            self.check(isinstance(dtype, str) and _is_shape(shape), where,
                       "the array's dtype or shape is missing or malformed")
            self.check(value.dtype.str == dtype and list(value.shape) == shape, where,
                       f"array {key!r} of {ARRAYS} has dtype {value.dtype.str} and shape "
                       f"{list(value.shape)}; the tree expects dtype {dtype} and shape {shape}")
        if kind == "key":
            impl = node.get("impl")
            self.check(isinstance(impl, str) and value.dtype == np.uint32, where,
                       "a PRNG key without an implementation name or with non-uint32 data")
            try:
                return jax.random.wrap_key_data(jnp.asarray(value), impl=impl)
            except (ValueError, TypeError, KeyError) as err:
                self.fail(where, f"not a valid {impl!r} PRNG key ({err})")
        self.check("impl" not in node, where, "an 'impl' on an array that is not a PRNG key")
        self.finite(value, where, f"array {key!r} of {ARRAYS}")
        if kind == "jax":
            self.check(value.dtype.kind in "biufc", where,
                       f"array {key!r} of {ARRAYS} holds strings, which a JAX array cannot")
            return jnp.asarray(value)
        return value

    def node_randomstate(self, node, where):
        state = node["__randomstate__"]
        self.check(isinstance(state, list) and len(state) == 5 and isinstance(state[0], str)
                   and all(isinstance(v, int) and not isinstance(v, bool) for v in state[2:4])
                   and isinstance(state[4], (int, float)) and not isinstance(state[4], bool),
                   where, "a random state that is not [name, keys, pos, has_gauss, cached]")
        keys = self(state[1], f"{where}[1]")
        self.check(isinstance(keys, np.ndarray), where, "the random state's keys are not an array")
        rs = np.random.RandomState()
        try:
            rs.set_state((state[0], keys, *state[2:]))
        except (ValueError, TypeError) as err:
            self.fail(where, f"not a valid random state ({err})")
        return rs

    def node_objects(self, node, where):
        items, shape = node["__objects__"], node["shape"]
        self.check(isinstance(items, list) and all(
            isinstance(v, (str, int, float, bool)) for v in items), where,
            "an object array holding other than strings and numbers")
        self.check(_is_shape(shape) and math.prod(shape) == len(items), where,
                   f"an object array of {len(items) if isinstance(items, list) else '?'} items "
                   f"and shape {shape!r}")
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(shape)

    def node_float(self, node, where):
        value = node["__float__"]
        self.check(value in _NON_FINITE, where, f"{value!r} is not 'nan', 'inf' or '-inf'")
        return _NON_FINITE[value]

    def node_tuple(self, node, where):
        items = node["__tuple__"]
        self.check(isinstance(items, list), where, "a tuple whose items are not a list")
        return tuple(self(items, where))

    def node_dict(self, node, where):
        items = node["__dict__"]
        self.check(isinstance(items, dict), where, "a dictionary that is not a JSON object")
        out = {}
        for k, v in items.items():
            out[k] = self(v, f"{where}[{k!r}]")
        return out

    def fields(self, node, key, where) -> dict:
        fields = node[key]
        self.check(isinstance(fields, dict), where, f"{key!r} is not a JSON object")
        return fields

    def node_namedtuple(self, node, where):
        cls = _resolve(node["__namedtuple__"])
        if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise ModelFileError(f"{cls.__qualname__} is not a NamedTuple")
        fields = self.fields(node, "fields", where)
        unknown = set(fields) - set(cls._fields)
        missing = set(cls._fields) - set(cls._field_defaults) - set(fields)
        if unknown or missing:
            self.fail(where, f"the saved {cls.__qualname__} has the unknown fields "
                             f"{sorted(unknown)} and lacks the fields {sorted(missing)}")
        return cls(**self.decode_fields(cls, fields, where))

    def node_object(self, node, where):
        cls = _resolve(node["__object__"])
        if not dataclasses.is_dataclass(cls):
            raise ModelFileError(f"{cls.__qualname__} is no longer a dataclass")
        fields = self.fields(node, "fields", where)
        cls, fields = self.split(cls, fields, where)
        if issubclass(cls, History) and "converged" in fields:
            # a training history saved before it had a status: converged or ran out
            converged = fields["converged"] is True
            fields = {k: v for k, v in fields.items() if k != "converged"}
            fields["status"] = "converged" if converged else "max_iter"
        expected = {f.name for f in dataclasses.fields(cls)}
        if set(fields) - expected:
            raise ModelFileError(f"the saved {cls.__qualname__} has fields "
                                 f"{sorted(set(fields) - expected)} this version does not know")
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        if required - set(fields):
            raise ModelFileError(f"the saved {cls.__qualname__} lacks the fields "
                                 f"{sorted(required - set(fields))} this version needs")
        values = self.decode_fields(cls, fields, where)
        obj = object.__new__(cls)  # as equinox's unflatten: no __init__, fields set as saved
        for k, v in values.items():
            object.__setattr__(obj, k, v)
        if isinstance(obj, Parameter) and isinstance(obj.raw, _ARRAYS) and self.traces == 0:
            try:  # the transform is elementwise (exp, softplus): cheap, no compilation
                value = np.asarray(obj.transform.forward(obj.raw))
            except (TypeError, ValueError) as err:
                self.fail(where, f"the parameter's value cannot be computed ({err})")
            self.finite(value, where, f"the value {type(obj.transform).__name__}(raw) of the "
                                      "parameter")
        return obj

    def split(self, cls: type, fields: dict, where: str) -> tuple[type, dict]:
        """The class and fields of a saved object of a class since split into one class per
        model (``_SPLIT``): the field that chose the model is dropped and names the class."""
        name = f"{cls.__module__}:{cls.__qualname__}"
        if name not in _SPLIT or _SPLIT[name][0] not in fields:
            return cls, fields
        field, classes = _SPLIT[name]
        value = fields[field]
        self.check(isinstance(value, str) and value in classes, f"{where}.{field}",
                   f"{cls.__qualname__}.{field} is {value!r}, not one of {sorted(classes)}")
        return _resolve(classes[value]), {k: v for k, v in fields.items() if k != field}

    def node_instance(self, node, where):
        cls = _resolve(node["__instance__"])
        state = self.fields(node, "state", where)
        if dataclasses.is_dataclass(cls) or issubclass(cls, (tuple, BaseException)):
            self.fail(where, f"{cls.__qualname__} is not a plain class")
        for k in state:  # attributes only: a saved value never shadows a method
            if not _is_name(k) or "." in k or callable(inspect.getattr_static(cls, k, None)):
                self.fail(where, f"{k!r} is not an attribute a {cls.__qualname__} can hold")
        try:
            obj = object.__new__(cls)
        except TypeError as err:
            self.fail(where, f"{cls.__qualname__} cannot be rebuilt ({err})")
        values = self.decode_fields(cls, state, where)
        settings = _settings_of(cls)
        for k, v in values.items():  # fitted state (an estimator's target scale): finite
            if k not in settings and isinstance(v, float) and self.traces == 0:
                self.finite(np.asarray(v), f"{where}.{k}", f"the number {v!r}")
        obj.__dict__.update(values)
        return obj


def _root_class(node) -> str | None:
    """The class a tree's root node names, in the manifest's ``model_class`` spelling."""
    if isinstance(node, dict):
        for kind in _CLASS_NODES:
            if isinstance(node.get(kind), str):
                return node[kind].replace(":", ".")
    return None


def _type_name(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


# --- reading the directory --------------------------------------------------------------


def _member(path: Path, name, what: str) -> Path:
    """The file ``name`` of the model directory ``path``, resolved; refused unless it is a
    plain file name whose target (links followed) lies inside the directory."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(
            c in name for c in ("/", "\\", "\x00", os.sep, os.altsep or "/")) \
            or os.path.isabs(name):
        raise ModelFileError(f"corrupted model directory: the manifest of {path} names the "
                             f"{what} {name!r}; only a plain file name inside the directory "
                             "is allowed")
    file = path / name
    try:
        real, root = file.resolve(), path.resolve()
    except (OSError, RuntimeError) as err:  # a loop of links
        raise ModelFileError(f"corrupted model directory: cannot resolve {file} ({err})") \
            from None
    if not real.is_relative_to(root) or real == root:
        raise ModelFileError(f"{file} leads outside the model directory {path} (to {real}); "
                             "refusing to read it")
    if not real.is_file():
        raise ModelFileError(f"corrupted model directory: {file} is missing" if not
                             real.exists() else f"{file} is not a file")
    return real


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as err:
        raise ModelFileError(f"cannot read {file} ({err})") from None


def _json_object(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        dup = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
        raise ValueError(f"the key {dup!r} appears twice in one object")
    return out


def _json_constant(name):
    raise ValueError(f"{name} is not strict JSON")


def _problem(tree, level: int = 1) -> str | None:
    """What makes a JSON value at nesting ``level`` unloadable: nesting deeper than
    ``MAX_DEPTH`` or a number out of range (``1e999`` parses to inf). Iterative: no recursion
    on deep input."""
    stack = [(tree, level)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                return f"it is nested deeper than {MAX_DEPTH} levels"
            stack.extend((v, depth + 1) for v in
                         (value.values() if isinstance(value, dict) else value))
        elif isinstance(value, float) and not math.isfinite(value):
            return f"it holds a number out of range ({value})"
    return None


def _digest(manifest: dict) -> str:
    """SHA-256 of the manifest's canonical JSON, without the digest field itself."""
    body = {k: v for k, v in manifest.items() if k != _DIGEST}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _read_arrays(file: Path, data: bytes) -> dict[str, np.ndarray]:
    if not data.startswith((b"PK\x03\x04", b"PK\x05\x06")):  # np.load would try pickle
        raise ModelFileError(f"corrupted model directory: cannot read {file.name}: it is not "
                             f"an npz archive ({file})")
    try:
        npz = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise ModelFileError(f"corrupted model directory: cannot read {file.name}: it is "
                                 f"not an npz archive ({file})")
        with npz:
            return {k: npz[k] for k in npz.files}
    except ModelFileError:
        raise
    except (ValueError, OSError, EOFError, KeyError, RuntimeError, NotImplementedError,
            zipfile.BadZipFile, zipfile.LargeZipFile) as err:  # pickled data is a ValueError
        raise ModelFileError(f"corrupted model directory: cannot read {file.name} ({file}: "
                             f"{type(err).__name__}: {err})") from None


# --- public API -------------------------------------------------------------------------


def _describe(obj) -> dict:
    """The manifest's human-readable summary of a model, posterior or estimator."""
    model = getattr(obj, "posterior_", obj)
    model = getattr(model, "model", model)
    lik = getattr(model, "likelihood", None)
    settings = obj.get_params(deep=False) if hasattr(obj, "get_params") else {
        f.name: getattr(model, f.name) for f in dataclasses.fields(model)
        if f.metadata.get("static") and isinstance(getattr(model, f.name), (bool, int, float, str))
    } if dataclasses.is_dataclass(model) else {}
    labels = getattr(obj, "classes_", getattr(lik, "classes", None))
    if isinstance(lik, str):  # an unfitted estimator's likelihood parameter
        lik = None
    return {
        "model_class": f"{type(obj).__module__}.{type(obj).__qualname__}",
        "model": type(model).__qualname__,
        "likelihood": type(lik).__qualname__ if lik is not None else None,
        "settings": {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v))
                     for k, v in settings.items()
                     if v is None or isinstance(v, (bool, int, float, str))},
        "labels": None if labels is None else np.asarray(labels).tolist(),
    }


def save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """Save a fitted posterior, model or scikit-learn estimator to the directory ``path``
    (created if needed; the two model files in it are replaced). Returns the path."""
    enc = _Encoder()
    tree = enc(obj, type(obj).__qualname__)
    problem = _problem(tree, 2)  # what load would refuse is not written (tree: level 2)
    if problem:
        raise ValueError(f"cannot save {type(obj).__qualname__}: {problem}")
    buf = io.BytesIO()
    np.savez(buf, **enc.arrays)
    data = buf.getvalue()
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "library_version": __version__,
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **_describe(obj),
        "arrays": {"file": ARRAYS, "sha256": hashlib.sha256(data).hexdigest(),
                   "count": len(enc.arrays)},
        "tree": tree,
    }
    manifest[_DIGEST] = _digest(manifest)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest, indent=1, allow_nan=False)  # strict JSON: no NaN/Infinity
    for name, content in ((ARRAYS, data), (MANIFEST, text.encode())):
        tmp = path / f".{name}.tmp"  # write, then rename: a crash never leaves half a file
        tmp.write_bytes(content)
        os.replace(tmp, path / name)
    return path


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated manifest of a model directory (raises :class:`ModelFileError`): strict
    UTF-8 JSON inside the directory, of a readable format and library version, matching its
    digest, with the fields :func:`load` needs."""
    path = Path(path)
    if not path.is_dir():
        raise ModelFileError(f"{path} is not a directory; expected a model directory written by "
                             "augmentedgp.save")
    if not (path / MANIFEST).exists() and not (path / MANIFEST).is_symlink():
        raise ModelFileError(f"{path} is not an augmentedgp model directory: {MANIFEST} is "
                             "missing")
    file = path / MANIFEST
    raw = _read(_member(path, MANIFEST, "manifest"))
    if not raw.strip():
        raise ModelFileError(f"corrupted model directory: {file} is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ModelFileError(f"corrupted model directory: {file} is not valid JSON: it is not "
                             f"UTF-8 text ({err})") from None
    try:
        manifest = json.loads(text, object_pairs_hook=_json_object,
                              parse_constant=_json_constant)
    except RecursionError:
        raise ModelFileError(f"corrupted model directory: {file} is nested deeper than "
                             f"{MAX_DEPTH} levels") from None
    except ValueError as err:  # JSONDecodeError, the hooks, an integer of too many digits
        raise ModelFileError(f"corrupted model directory: {file} is not valid JSON "
                             f"({err})") from None
    problem = _problem(manifest)
    if problem:
        raise ModelFileError(f"corrupted model directory: {file}: {problem}")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelFileError(f"{file} is not an augmentedgp model manifest")
    fmt, saved = manifest.get("format_version"), str(manifest.get("library_version"))
    if fmt not in _READABLE_FORMATS or isinstance(fmt, bool) \
            or not _compatible(saved, __version__):
        raise ModelFileError(
            f"{path} was saved by augmentedgp {saved} (model format {fmt}); this is augmentedgp "
            f"{__version__} (model format {FORMAT_VERSION}), which cannot read it. Load it with "
            f"augmentedgp {'.'.join(saved.split('.')[:2])}.x or refit the model.")
    if fmt >= 2 or _DIGEST in manifest:  # format 1 had no digest: checked by structure only
        if _DIGEST not in manifest:
            raise ModelFileError(f"corrupted model directory: {file} has no {_DIGEST!r}")
        if manifest[_DIGEST] != _digest(manifest):
            raise ModelFileError(f"corrupted model directory: {file} does not match its "
                                 f"checksum ({_DIGEST}): it was edited or damaged")
    for key in ("tree", "arrays", "model_class"):
        if key not in manifest:
            raise ModelFileError(f"corrupted model directory: the manifest has no {key!r} "
                                 f"({file})")
    arrays = manifest["arrays"]
    if not (isinstance(arrays, dict) and isinstance(arrays.get("file"), str)
            and isinstance(arrays.get("sha256"), str) and isinstance(arrays.get("count"), int)):
        raise ModelFileError(f"corrupted model directory: the manifest's 'arrays' is not an "
                             f"object with a file name, a sha256 and a count ({file})")
    if not isinstance(manifest["model_class"], str):
        raise ModelFileError(f"corrupted model directory: the manifest's 'model_class' is not "
                             f"a string ({file})")
    return manifest


def load(path: str | os.PathLike[str]) -> Any:
    """Load what :func:`save` wrote. Raises :class:`ModelFileError`, naming the file, for a
    missing, corrupted, edited or incompatible directory (see the module's description)."""
    path = Path(path)
    manifest = read_manifest(path)
    where, expected = path / MANIFEST, manifest["model_class"]
    file = _member(path, manifest["arrays"]["file"], "array file")
    data = _read(file)
    if hashlib.sha256(data).hexdigest() != manifest["arrays"]["sha256"]:
        raise ModelFileError(f"corrupted model directory: {file.name} does not match the "
                             f"checksum in the manifest ({file})")
    arrays = _read_arrays(file, data)
    if len(arrays) != manifest["arrays"]["count"]:
        raise ModelFileError(f"corrupted model directory: {file.name} holds {len(arrays)} "
                             f"arrays, the manifest says {manifest['arrays']['count']} ({file})")
    tree, declared = manifest["tree"], _root_class(manifest["tree"])
    if (declared or expected).startswith(_PACKAGE + ".") and declared != expected:
        raise ModelFileError(f"corrupted model tree in {where}: its root is "
                             f"{declared or type(tree).__name__}, not the saved {expected}")
    decoder = _Decoder(arrays, typed=manifest["format_version"] >= 2)
    try:
        obj = decoder(tree, "tree")
    except ModelFileError as err:
        raise ModelFileError(f"{where}: {err}") from None
    except (TypeError, KeyError, ValueError, AttributeError, IndexError, OverflowError,
            RecursionError) as err:  # a safety net: the checks above should raise first
        raise ModelFileError(f"corrupted model tree in {where}: {err!r}") from None
    if declared is None and _type_name(obj) != expected and not (
            isinstance(obj, jax.Array) and expected.startswith("jax")):
        raise ModelFileError(f"corrupted model tree in {where}: its root is "
                             f"{_type_name(obj)}, not the saved {expected}")
    if set(arrays) - decoder.used:
        raise ModelFileError(f"corrupted model directory: {file.name} holds the arrays "
                             f"{sorted(set(arrays) - decoder.used)[:10]}, which the tree does "
                             f"not use ({file})")
    return obj


__all__ = ["save", "load", "read_manifest", "ModelFileError", "FORMAT_VERSION", "MAX_DEPTH"]

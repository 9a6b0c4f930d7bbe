"""Save and load fitted models without pickled code.

A model directory holds two files:

- ``manifest.json``: the format and library version, the saved object's class, its
  likelihood, its settings and label mapping (for humans and tools), the SHA-256 of the
  array file, and ``tree``: the object's structure -- class names (resolved only inside
  ``augmentedgp`` when loading), field names, Python scalars and strings, with each array
  replaced by its key in the array file;
- ``arrays.npz``: every array, read back with ``allow_pickle=False``.

Any object built from augmentedgp classes can be saved: fitted posteriors of every model
(``GP``, ``SGPR``, ``VGP``, ``SVGP``, ``MCGP``), unfitted models, and the scikit-learn
estimators of :mod:`augmentedgp.sklearn`. Objects holding code (functions, classes from
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
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from augmentedgp.core.errors import AugmentedGPError
from augmentedgp.core.version import __version__

FORMAT = "augmentedgp-model"
FORMAT_VERSION = 1
MANIFEST, ARRAYS = "manifest.json", "arrays.npz"
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
        self.arrays[key] = np.asarray(value)
        return {"__array__": key, "kind": kind}

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


def _lookup(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _resolve(name: str):
    module, _, qualname = name.partition(":")
    if not (module == _PACKAGE or module.startswith(_PACKAGE + ".")):
        raise ModelFileError(f"the model file refers to {name}, outside augmentedgp; refusing "
                             "to load it")
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


class _Decoder:
    def __init__(self, arrays):
        self.arrays = arrays

    def __call__(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self(v) for v in node]
        if not isinstance(node, dict):
            raise ModelFileError(f"corrupted model tree: unexpected {type(node).__name__}")
        if "__array__" in node:
            key = node["__array__"]
            if key not in self.arrays:
                raise ModelFileError(f"corrupted model directory: array {key!r} is missing from "
                                     f"{ARRAYS}")
            value = self.arrays[key]
            if node.get("kind") == "key":
                return jax.random.wrap_key_data(jnp.asarray(value), impl=node.get("impl"))
            return jnp.asarray(value) if node.get("kind") == "jax" else value
        if "__randomstate__" in node:
            state = node["__randomstate__"]
            rs = np.random.RandomState()
            rs.set_state((state[0], self(state[1]), *state[2:]))
            return rs
        if "__objects__" in node:
            out = np.empty(len(node["__objects__"]), dtype=object)
            out[:] = node["__objects__"]
            return out.reshape(node["shape"])
        if "__float__" in node:
            return float(node["__float__"])
        if "__tuple__" in node:
            return tuple(self(v) for v in node["__tuple__"])
        if "__dict__" in node:
            return {k: self(v) for k, v in node["__dict__"].items()}
        if "__namedtuple__" in node:
            cls = _resolve(node["__namedtuple__"])
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise ModelFileError(f"{cls.__qualname__} is not a NamedTuple")
            return cls(**{k: self(v) for k, v in node["fields"].items()})
        if "__object__" in node:
            cls = _resolve(node["__object__"])
            if not dataclasses.is_dataclass(cls):
                raise ModelFileError(f"{cls.__qualname__} is no longer a dataclass")
            expected = {f.name for f in dataclasses.fields(cls)}
            fields = node["fields"]
            if set(fields) - expected:
                raise ModelFileError(f"the saved {cls.__qualname__} has fields "
                                     f"{sorted(set(fields) - expected)} this version does not know")
            required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING}
            if required - set(fields):
                raise ModelFileError(f"the saved {cls.__qualname__} lacks the fields "
                                     f"{sorted(required - set(fields))} this version needs")
            obj = object.__new__(cls)  # as equinox's unflatten: no __init__, fields set as saved
            for k, v in fields.items():
                object.__setattr__(obj, k, self(v))
            return obj
        if "__instance__" in node:
            obj = object.__new__(_resolve(node["__instance__"]))
            obj.__dict__.update({k: self(v) for k, v in node["state"].items()})
            return obj
        raise ModelFileError(f"corrupted model tree: unknown node with keys {sorted(node)}")


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
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest, indent=1, allow_nan=False)  # strict JSON: no NaN/Infinity
    for name, content in ((ARRAYS, data), (MANIFEST, text.encode())):
        tmp = path / f".{name}.tmp"  # write, then rename: a crash never leaves half a file
        tmp.write_bytes(content)
        os.replace(tmp, path / name)
    return path


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated manifest of a model directory (raises :class:`ModelFileError`)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelFileError(f"{path} is not a directory; expected a model directory written by "
                             "augmentedgp.save")
    file = path / MANIFEST
    if not file.is_file():
        raise ModelFileError(f"{path} is not an augmentedgp model directory: {MANIFEST} is "
                             "missing")
    try:
        manifest = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFileError(f"corrupted model directory: {file} is not valid JSON "
                             f"({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelFileError(f"{file} is not an augmentedgp model manifest")
    fmt, saved = manifest.get("format_version"), str(manifest.get("library_version"))
    if fmt != FORMAT_VERSION or not _compatible(saved, __version__):
        raise ModelFileError(
            f"{path} was saved by augmentedgp {saved} (model format {fmt}); this is augmentedgp "
            f"{__version__} (model format {FORMAT_VERSION}), which cannot read it. Load it with "
            f"augmentedgp {'.'.join(saved.split('.')[:2])}.x or refit the model.")
    for key in ("tree", "arrays"):
        if key not in manifest:
            raise ModelFileError(f"corrupted model directory: the manifest has no {key!r}")
    if not isinstance(manifest["arrays"], dict):
        raise ModelFileError("corrupted model directory: the manifest's 'arrays' is not an "
                             "object")
    return manifest


def load(path: str | os.PathLike[str]) -> Any:
    """Load what :func:`save` wrote. Raises :class:`ModelFileError` for a missing,
    corrupted or incompatible directory."""
    path = Path(path)
    manifest = read_manifest(path)
    file = path / manifest["arrays"].get("file", ARRAYS)
    if not file.is_file():
        raise ModelFileError(f"corrupted model directory: {file.name} is missing")
    data = file.read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest["arrays"].get("sha256"):
        raise ModelFileError(f"corrupted model directory: {file.name} does not match the "
                             "checksum in the manifest")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (ValueError, OSError) as err:
        raise ModelFileError(f"corrupted model directory: cannot read {file.name} "
                             f"({err})") from None
    try:
        return _Decoder(arrays)(manifest["tree"])
    except ModelFileError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError) as err:
        raise ModelFileError(f"corrupted model tree in {path / MANIFEST}: {err!r}") from None


__all__ = ["save", "load", "read_manifest", "ModelFileError", "FORMAT_VERSION"]

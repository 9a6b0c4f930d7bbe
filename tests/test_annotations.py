"""Typed contracts: at least 90% of the package's public functions declare a return type.

A public function is a module-level function, or a method (a property's getter, a
classmethod, a staticmethod) of a public class, whose name does not start with ``_`` and
which is defined in ``augmentedgp`` (its ``__module__``); each function object counts once,
however many modules re-export it. Methods inherited from a private base of a public class
count (they are part of that class's interface). Modules whose optional dependencies are
missing are skipped.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import augmentedgp

THRESHOLD = 0.90
PACKAGE = augmentedgp.__name__


def _ours(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == PACKAGE


def _modules():
    yield augmentedgp
    for info in pkgutil.walk_packages(augmentedgp.__path__, PACKAGE + "."):
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # an optional dependency (matplotlib, scikit-learn, ...) missing
            continue


def _function(obj):
    """The plain function behind ``obj`` (a function, property, classmethod, staticmethod,
    or a wrapper such as ``jax.jit`` / ``functools.wraps``), or None."""
    if isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    obj = inspect.unwrap(obj) if callable(obj) else obj
    return obj if inspect.isfunction(obj) and _ours(obj) else None


def public_functions() -> dict[str, object]:
    """``{module:qualname: function}`` for every public function of the package."""
    found: dict[int, tuple[str, object]] = {}

    def add(fn):
        if fn is None or fn.__name__.startswith("_") or "<locals>" in fn.__qualname__:
            return
        if any(part.startswith("_") for part in fn.__qualname__.split(".")[:-1]):
            return  # a method of a private class, reached only through it
        found.setdefault(id(fn), (f"{fn.__module__}:{fn.__qualname__}", fn))

    for module in _modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or not _ours(obj):
                continue
            if inspect.isclass(obj):
                for klass in obj.__mro__:
                    if not _ours(klass):
                        continue
                    for attr, member in vars(klass).items():
                        if attr.startswith("_"):
                            continue
                        fn = _function(member)
                        if fn is not None and fn.__name__ == attr:
                            found.setdefault(id(fn), (f"{fn.__module__}:{fn.__qualname__}", fn))
            else:
                add(_function(obj))
    return dict(found.values())


def has_return_annotation(fn) -> bool:
    return "return" in getattr(fn, "__annotations__", {})


def coverage() -> tuple[int, int, list[str]]:
    """(annotated, total, names of the unannotated ones)."""
    functions = public_functions()
    missing = sorted(name for name, fn in functions.items() if not has_return_annotation(fn))
    return len(functions) - len(missing), len(functions), missing


def test_the_walk_finds_the_public_api():
    functions = public_functions()
    names = set(functions)
    assert "augmentedgp.kernels.covariance:Kernel.diag" in names
    assert "augmentedgp.training.fit:fit" in names
    assert not any(n.split(":")[1].split(".")[-1].startswith("_") for n in names)
    assert len({id(f) for f in functions.values()}) == len(functions)  # each counted once


def test_public_functions_declare_return_types():
    annotated, total, missing = coverage()
    share = annotated / total
    print(f"return annotations: {annotated}/{total} = {share:.1%}")
    assert share >= THRESHOLD, (
        f"{annotated}/{total} = {share:.1%} public functions have a return annotation "
        f"(need {THRESHOLD:.0%}); {len(missing)} missing:\n  " + "\n  ".join(missing)
    )

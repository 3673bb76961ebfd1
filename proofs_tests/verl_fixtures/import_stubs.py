"""Stand-ins for packages that veRL imports at module top but an in-process worker never uses (Ray, Hugging Face
``datasets``, ...), for the policy-update benchmark on a machine where they are not installed.

:func:`stub_missing` serves each named top-level package that is *not importable* (and all its submodules) from a
stub whose attributes are inert classes — callable, subclassable, usable as decorators — so ``import ray``,
``from ray.util import x`` or ``@ray.remote`` at import time succeed; anything that really uses the package then
gets inert objects or, for ``ray.get``/``ray.init``, an error. Installed packages are never shadowed. Only for a
process that will not use these packages.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Iterable

__all__ = ["stub_missing", "hide_and_stub", "is_stub", "DEFAULT_STUBS", "HIDE_ENV"]

#: What veRL 0.9.1 imports on the actor/ref worker path without using it in process.
DEFAULT_STUBS = ("ray", "datasets", "PIL", "pandas", "uvicorn", "fastapi")
_MARK = "__dualkv_import_stub__"
#: Pretend these packages are not installed (comma-separated; how the tests exercise the stubs on a machine that
#: has them). Inherited by child processes.
HIDE_ENV = "DUALKV_BENCH_HIDE_PACKAGES"


class _InertMeta(type):
    """Class attribute reads (``ray.actor.ActorHandle``) give further inert classes."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert_class(name)


class _Inert(metaclass=_InertMeta):
    """Instances swallow calls (returning the decorated object when used as a decorator) and attribute reads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert_class(name)

    def __bool__(self) -> bool:
        return False


def _inert_class(name: str) -> type:
    return type(name, (_Inert,), {})


def _decorator_passthrough(*args: Any, **kwargs: Any) -> Any:
    """``@x`` and ``@x(...)``: hand the decorated class/function back unchanged (``ray.remote``)."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda obj: obj


def _unavailable(package: str):
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{package} is not installed here (dualkv import stub); this code path needs it")
    return fail


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _inert_class(name)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []          # a package, so "pkg.x.y" imports resolve
        setattr(module, _MARK, True)
        if "." not in spec.name:
            module.__version__ = "0.0.0+dualkv-stub"
        if spec.name == "ray":
            module.remote = _decorator_passthrough
            module.is_initialized = lambda: False
            module.get = module.init = module.put = _unavailable("ray")
        return module

    def exec_module(self, module) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, packages: Iterable[str]) -> None:
        self.packages = set(packages)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".", 1)[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def is_stub(module: types.ModuleType) -> bool:
    return bool(getattr(module, _MARK, False))


def stub_missing(packages: Iterable[str] = DEFAULT_STUBS) -> list[str]:
    """Stub each top-level package that cannot be imported; return the names now served by a stub."""
    missing = []
    for name in packages:
        if name in sys.modules and sys.modules[name] is not None:
            if is_stub(sys.modules[name]):
                missing.append(name)
            continue
        if sys.modules.get(name, False) is None:   # blocked on purpose (sys.modules[name] = None)
            del sys.modules[name]
            missing.append(name)
        elif importlib.util.find_spec(name) is None:
            missing.append(name)
    if missing:
        sys.meta_path.insert(0, _Finder(missing))
    return missing


def hide_and_stub(packages: Iterable[str] = DEFAULT_STUBS) -> list[str]:
    """Hide the packages named in ``$DUALKV_BENCH_HIDE_PACKAGES``, then :func:`stub_missing`; call before veRL is
    imported. Returns the stubbed names."""
    import os

    for name in filter(None, os.environ.get(HIDE_ENV, "").split(",")):
        sys.modules[name] = None
    return stub_missing(packages)

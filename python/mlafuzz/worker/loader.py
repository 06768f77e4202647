"""Loading the kernel a python: backend names (file.py:func or module:func), and its mutants."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
import types
import zlib
from typing import Any, Callable, Dict, Optional, Tuple

import mlafuzz


class LoadError(Exception):
    """The backend cannot be served; the message says what to fix."""


def load_kernel(spec: str) -> Tuple[Callable[..., None], "mlafuzz.KernelInfo", Optional[Callable]]:
    """Resolves ``path/to/file.py:func`` or ``package.module:func``.

    Returns:
        (function, its KernelInfo, the module's ``supports`` or None).
    Raises:
        LoadError: no such file or module, no such function, or not decorated.
    """
    target, sep, func_name = spec.rpartition(":")
    if not sep or not target or not func_name:
        raise LoadError(
            f"python:{spec}: name the function after a colon: python:path/to/file.py:decode "
            "or python:package.module:decode"
        )
    try:
        if target.endswith(".py") or os.sep in target:
            path = os.path.abspath(target)
            if not os.path.isfile(path):
                raise LoadError(f"python:{spec}: no such file {path}")
            try:
                module = import_file(path)
            except LoadError as e:
                raise LoadError(f"python:{spec}: {e}") from e
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(target)
    except LoadError:
        raise
    except ModuleNotFoundError as e:
        raise LoadError(
            f"python:{spec}: cannot import {target}: {e} (interpreter {sys.executable}; install "
            "the module, set PYTHONPATH, or name a file: python:path/to/file.py:func)"
        ) from e
    except BaseException as e:  # noqa: BLE001 - the module's import failed: tell why
        raise LoadError(
            f"python:{spec}: importing {target} failed:\n{traceback.format_exc()}"
        ) from e
    func_name, tilde, mutant = func_name.partition("~")
    if tilde:
        func_name = _mutant_function(spec, target, module, func_name, mutant)
    func = getattr(module, func_name, None)
    if func is None:
        names = sorted(
            n for n, v in vars(module).items() if hasattr(v, "__mlafuzz_kernel__")
        )
        raise LoadError(
            f"python:{spec}: {target} has no function {func_name!r}"
            + (f"; its kernels: {', '.join(names)}" if names else "")
        )
    info = getattr(func, "__mlafuzz_kernel__", None)
    if not isinstance(info, mlafuzz.KernelInfo):
        raise LoadError(
            f"python:{spec}: {func_name} is not an mlafuzz kernel; decorate it with "
            '@mlafuzz.kernel(name="...", precision="fp32_simt", device="cpu")'
        )
    supports = getattr(module, "supports", None)
    if supports is not None and not callable(supports):
        supports = None
    return func, info, supports


def import_file(path: str) -> types.ModuleType:
    """Imports the Python file ``path``, its folder first on sys.path (so that a kernel's own
    helpers import).

    A file inside a package (its folder, and each folder above that has one, holds an
    ``__init__.py``) is imported as a module of that package, so that its relative imports
    work. The package is registered under a private name (``_mlafuzz_pkg_<folder>_<hash of its
    path>``), never its folder's name (``kernels/triton`` must not shadow the ``triton``
    library), and its ``__init__.py`` files are not run: the file loads as it did alone,
    except that its relative imports work. Another file (and a package's ``__init__.py``) is
    imported alone, as ``_mlafuzz_kernel_<file name>``.

    Raises:
        LoadError: the file cannot be loaded as a module; whatever importing it raises.
    """
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    stem = os.path.splitext(os.path.basename(path))[0]
    top = folder  # the folder above the outermost package
    while os.path.isfile(os.path.join(top, "__init__.py")) and os.path.dirname(top) != top:
        top = os.path.dirname(top)
    if top == folder or stem == "__init__":
        return _exec_module("_mlafuzz_kernel_" + stem, path)
    inside = os.path.relpath(folder, top).split(os.sep)  # the package's folder, subpackages
    root = os.path.join(top, inside[0])
    name = "_mlafuzz_pkg_%s_%08x" % (
        "".join(c if c.isalnum() else "_" for c in inside[0]), zlib.crc32(root.encode()))
    for sub in [None, *inside[1:]]:  # the package, then each subpackage down to the file's
        if sub is not None:
            name, root = f"{name}.{sub}", os.path.join(root, sub)
        if name not in sys.modules:
            package = types.ModuleType(name, f"the package folder {root}, loaded by mlafuzz")
            package.__path__ = [root]
            package.__package__ = name
            sys.modules[name] = package
    return importlib.import_module(f"{name}.{stem}")


def _exec_module(name: str, path: str) -> types.ModuleType:
    """Executes ``path`` as module ``name``."""
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise LoadError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    mod_spec.loader.exec_module(module)
    return module


def declared_mutants(module: Any) -> Dict[str, str]:
    """The module's planted bugs: its ``MUTANTS`` dict (name -> description), or {}."""
    mutants = getattr(module, "MUTANTS", None)
    if not isinstance(mutants, dict):
        return {}
    return {str(k): str(v) for k, v in mutants.items()}


def mutant_function_name(mutant: str) -> str:
    """The function that implements a planted bug: ``mutant_<name, '-' written '_'>``."""
    return "mutant_" + mutant.replace("-", "_")


def _mutant_function(spec: str, target: str, module: Any, func: str, mutant: str) -> str:
    """``func~mutant`` -> the name of the function to load; LoadError for an unknown mutant.

    The convention (docs/mutation.md): the module declares ``MUTANTS = {name:
    description}`` and one function ``mutant_<name>`` per planted bug, decorated as a kernel.
    """
    declared = declared_mutants(module)
    if not mutant:
        raise LoadError(f"python:{spec}: name the planted bug after '~' ({func}~<mutant>)")
    if mutant not in declared:
        known = ", ".join(declared) if declared else "none (the module has no MUTANTS dict)"
        raise LoadError(f"python:{spec}: {target} declares no mutant {mutant!r}; declared: {known}")
    name = mutant_function_name(mutant)
    if getattr(module, name, None) is None:
        raise LoadError(
            f"python:{spec}: {target} declares mutant {mutant!r} in MUTANTS but defines no "
            f"function {name}"
        )
    return name

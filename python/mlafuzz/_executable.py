"""Where the ``mlafuzz`` executable is, and the environment the package runs it with.

Lookup order (:func:`find_mlafuzz`): ``MLAFUZZ_BIN``; an ``mlafuzz`` executable on PATH (this
package's own launcher script excepted); the executable shipped inside this package by
``pip install --no-build-isolation .`` at the repository root (``mlafuzz/_native/bin/mlafuzz``);
the build folder of the source tree this package sits in (``build/mlafuzz``), if it sits in one.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Dict, List, Optional

from mlafuzz import _settings

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: The executable ``pip install .`` at the repository root puts inside the package.
PACKAGED = os.path.join(PACKAGE_DIR, "_native", "bin", "mlafuzz")
_SOURCE_ROOT = os.path.dirname(os.path.dirname(PACKAGE_DIR))
#: The executable of the source tree's default build folder (scripts/build.sh), when this
#: package is the one of a source tree (<root>/python/mlafuzz); else "".
SOURCE_BUILD = (os.path.join(_SOURCE_ROOT, "build", "mlafuzz")
                if os.path.isfile(os.path.join(_SOURCE_ROOT, "CMakeLists.txt")) else "")

_LAUNCHER_MARK = b"mlafuzz.__main__"  # in the console script pip writes for this package


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def is_launcher(path: str) -> bool:
    """True for this package's console script (a Python script that imports mlafuzz.__main__)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and _LAUNCHER_MARK in head


def _on_path() -> Optional[str]:
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", "mlafuzz")
        if _executable(candidate) and not is_launcher(candidate):
            return os.path.abspath(candidate)
    return None


def find_mlafuzz() -> str:
    """Path of the mlafuzz executable.

    Raises:
        FileNotFoundError: none found; the message lists every place looked at and how to get
            one.
    """
    env = _settings.text("MLAFUZZ_BIN")
    if env:
        if _executable(env):
            return os.path.abspath(env)
        raise FileNotFoundError(f"MLAFUZZ_BIN={env} is not an executable file")
    found = _on_path()
    if found:
        return found
    for candidate in (PACKAGED, SOURCE_BUILD):
        if candidate and _executable(candidate):
            return candidate
    source = f"  {SOURCE_BUILD}: absent (the source tree is not built)\n" if SOURCE_BUILD else ""
    raise FileNotFoundError(
        "cannot find the mlafuzz executable; looked at:\n"
        "  MLAFUZZ_BIN: not set\n"
        "  PATH: no mlafuzz executable (this package's launcher script does not count)\n"
        f"  {PACKAGED}: absent (this package was installed without the executable, as "
        "`pip install ./python` does)\n"
        f"{source}"
        "Install the package with the executable from the repository root: "
        "pip install --no-build-isolation . (docs/python.md, \"Install\"), build it "
        "(scripts/build.sh), or set MLAFUZZ_BIN=/path/to/mlafuzz"
    )


def launcher_command() -> str:
    """A command that runs this package's executable as pasted into a shell.

    The console script beside this interpreter when it is this package's, else
    ``<this interpreter> -m mlafuzz`` (with the PYTHONPATH in effect, which found the package).
    """
    script = os.path.join(os.path.dirname(sys.executable), "mlafuzz")
    if is_launcher(script):
        return shlex.quote(script)
    head = ""
    if os.environ.get("PYTHONPATH"):
        head = "PYTHONPATH=" + shlex.quote(os.environ["PYTHONPATH"]) + " "
    return f"{head}{shlex.quote(sys.executable)} -m mlafuzz"


def run_env(executable: str, command: Optional[str] = None) -> Dict[str, str]:
    """The environment to run ``executable`` with: its python: workers run this interpreter and
    import this very package; printed reproduce lines start with ``command`` (default: the
    launcher's when ``executable`` is this package's own, else the executable's path, which
    mlafuzz prints by itself). Settings already in the environment win."""
    env = dict(os.environ)
    env.setdefault("MLAFUZZ_PYTHON", sys.executable)
    env.setdefault("MLAFUZZ_PYTHON_PACKAGE_DIR", os.path.dirname(PACKAGE_DIR))
    if command is None and os.path.realpath(executable) == os.path.realpath(PACKAGED):
        command = launcher_command()
    if command:
        env.setdefault("MLAFUZZ_COMMAND", command)
    return env


def main(argv: Optional[List[str]] = None) -> int:
    """``mlafuzz ...`` (console script) and ``python -m mlafuzz ...``: runs the executable."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        exe = find_mlafuzz()
    except FileNotFoundError as e:
        print(f"mlafuzz: {e}", file=sys.stderr)
        return 2
    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0 and os.path.basename(argv0) != "__main__.py" and is_launcher(argv0):
        command = shlex.quote(argv0)  # the console script that is running
    else:
        command = launcher_command()
    os.execve(exe, [exe, *args], run_env(exe, command))
    return 0  # not reached: execve replaces the process

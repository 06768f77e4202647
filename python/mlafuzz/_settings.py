"""The MLAFUZZ_* environment variables, read through one table (settings.json beside this file).

The same table is compiled into the mlafuzz executable (core/settings.h), which prints it
with ``mlafuzz --help-env``; docs/settings.md is that output. Reading a name the table does not
list is an error, and so is a value that is not of the variable's type.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

_TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "settings.json")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def table() -> List[Dict[str, Any]]:
    """Every variable of the table, in its order (dicts: name, type, default, scope, ...)."""
    with open(_TABLE_FILE, encoding="utf-8") as f:
        settings: List[Dict[str, Any]] = json.load(f)["settings"]
    return settings


_BY_NAME: Dict[str, Dict[str, Any]] = {s["name"]: s for s in table()}


def find(name: str) -> Dict[str, Any]:
    """The table's entry for ``name``.

    Raises:
        KeyError: the table does not list it.
    """
    if name not in _BY_NAME:
        raise KeyError(f"{name} is not in the settings table ({_TABLE_FILE})")
    return _BY_NAME[name]


def text(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The variable's value when it is set and not empty, else None."""
    find(name)
    value = (os.environ if env is None else env).get(name, "")
    return value if value else None


def _typed(name: str, fallback: Any, env: Optional[Mapping[str, str]],
           parse: Callable[[str], Any], want: str) -> Any:
    value = text(name, env)
    if value is None:
        return fallback
    try:
        return parse(value.strip())
    except ValueError:
        raise ValueError(f"{name}={value!r}: give {want} ({find(name)['description']})") from None


def _bool(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(value)


def flag(name: str, fallback: bool, env: Optional[Mapping[str, str]] = None) -> bool:
    """A bool variable: 1 or 0 (true/false, yes/no, on/off too); ``fallback`` when unset.

    Raises:
        ValueError: any other value (the message names the variable).
    """
    result: bool = _typed(name, fallback, env, _bool, "1 or 0")
    return result


def integer(name: str, fallback: int, env: Optional[Mapping[str, str]] = None) -> int:
    """An int variable; ``fallback`` when unset.

    Raises:
        ValueError: not an integer (the message names the variable).
    """
    result: int = _typed(name, fallback, env, int, "an integer")
    return result

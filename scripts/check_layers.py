#!/usr/bin/env python3
"""Checks that no source file includes a file of a higher layer (docs/ARCHITECTURE.md).

Usage: scripts/check_layers.py [REPO_ROOT]
Exit 0 when every project include points down (or within its own folder), 1 otherwise: each
offending include is printed as `file:line: <layer> includes <higher layer> (path)`. Two rules:
the layers (LAYERS: a file includes lower layers only) and the top-level folders (TOP_LEVEL:
bottom to top, a folder includes only folders below it), so a folder is a layer or a run of
adjacent layers and the top-level folders never include each other in a cycle.
Run by ctest as `layers` and so by CI on every change.
"""
from __future__ import annotations

import os
import re
import sys

# (rank, folder prefixes). A file may include files of a lower rank, or of its own group.
# Groups of the same rank are siblings and must not include each other.
LAYERS: list[tuple[int, str, tuple[str, ...]]] = [
    (0, "mla", ("mla/",)),
    (0, "plugin-abi", ("include/mlafuzz/",)),
    (1, "core", ("core/",)),
    (2, "kernels/host", ("kernels/host/",)),
    (2, "kernels/cuda", ("kernels/cuda/",)),
    (2, "oracle", ("oracle/",)),
    (3, "properties", ("properties/",)),
    (3, "harness/backends", ("harness/backends/",)),
    (4, "harness/campaign", ("harness/campaign/",)),
    (5, "harness/mutation", ("harness/mutation/",)),
    (6, "harness/cli", ("harness/cli/",)),
]
# Top-level folders bottom to top: (rank, folder). A folder includes only lower-ranked folders.
TOP_LEVEL: list[tuple[int, str]] = [
    (0, "include"),
    (0, "mla"),
    (1, "core"),
    (2, "kernels"),
    (2, "oracle"),
    (3, "properties"),
    (4, "harness"),
]
# Top-level folders outside the stack: they may use any layer and hold no layer of their own.
OUTSIDE = {"tests", "bench", "examples", "python", "scripts", "cmake", "corpus", "docs"}
SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".c", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path: str) -> tuple[int, str] | None:
    for rank, name, prefixes in LAYERS:
        if any(path.startswith(p) for p in prefixes):
            return rank, name
    return None


def top_of(path: str) -> tuple[int, str] | None:
    top = path.split("/", 1)[0]
    for rank, name in TOP_LEVEL:
        if name == top:
            return rank, name
    return None


def resolve(root: str, including: str, target: str) -> str | None:
    """Repository-relative path of an include, or None for system and generated headers."""
    for base in (os.path.dirname(including), "", "include"):
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def check(root: str) -> list[str]:
    errors = []
    tops = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))
                  and d not in OUTSIDE and not d.startswith((".", "build")))
    for top in tops:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                own = layer_of(path)
                if own is None:
                    errors.append(f"{path}: in no layer (add its folder to scripts/check_layers.py)")
                    continue
                with open(os.path.join(root, path), encoding="utf-8") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        target = resolve(root, path, m.group(1))
                        if target is None:
                            continue
                        own_top, other_top = top_of(path), top_of(target)
                        if (own_top and other_top and own_top != other_top
                                and other_top[0] >= own_top[0]):
                            errors.append(f"{path}:{lineno}: top-level folder {own_top[1]} (rank "
                                          f"{own_top[0]}) includes {other_top[1]} (rank "
                                          f"{other_top[0]}): {m.group(1)}")
                        other = layer_of(target)
                        if other is None or other[1] == own[1] or other[0] < own[0]:
                            continue
                        errors.append(f"{path}:{lineno}: {own[1]} (layer {own[0]}) includes "
                                      f"{other[1]} (layer {other[0]}): {m.group(1)}")
    return errors


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    errors = check(os.path.abspath(root))
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} include(s) point up or sideways; see docs/ARCHITECTURE.md")
        return 1
    print("layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())

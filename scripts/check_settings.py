#!/usr/bin/env python3
"""Checks the MLAFUZZ_* settings table (python/mlafuzz/settings.json) against the code.

  check_settings.py ROOT [MLAFUZZ]

Fails (exit 1, one line per problem) when
  - a source file reads an MLAFUZZ_* variable the table does not list,
  - code of mlafuzz or its Python package reads one without the accessors
    (core/settings.h, mlafuzz/_settings.py): std::getenv("MLAFUZZ_...") or
    os.environ.get("MLAFUZZ_..."),
  - the table lists a variable nothing reads or sets (a stale entry),
  - with MLAFUZZ (the built executable): docs/settings.md differs from `MLAFUZZ --help-env`.
"""

import json
import os
import re
import subprocess
import sys

# Folders whose code must read through the accessors, and those only checked for unlisted names.
ACCESSOR_ONLY = ("harness", "properties", "oracle", "kernels", "python", "include", "corpus")
NAMES_ONLY = ("tests", "scripts", "bench", ".ci", "examples")
# Files that still read the environment themselves, with the reason.
EXEMPT = {
    # Reads MLAFUZZ_CORPUS_ROOT with os.environ.get itself.
    "python/mlafuzz/testing.py",
    # The accessors themselves.
    "core/settings.cc", "python/mlafuzz/_settings.py",
}
# CMake files hold build options (cache variables), not environment variables.
SUFFIXES = (".cc", ".h", ".cu", ".cuh", ".py", ".sh")
DIRECT = re.compile(r'(?:getenv|environ\.get|environ\[|env\.get)\(?\s*"(MLAFUZZ_[A-Z0-9_]+)"')
READ = re.compile(r'(?:getenv(?:_fn)?\(|environ(?:\.get\(|\[)|env\.get\(|settings::(?:text|flag|'
                  r'integer|seconds)\(|_settings\.(?:text|flag|integer)\(|env_u64\(|\$\{)'
                  r'\s*"?(MLAFUZZ_[A-Z0-9_]+)')
# Build options and macros share the prefix: never environment variables.
NOT_ENV = re.compile(r"-DMLAFUZZ_|MLAFUZZ_(?:HAVE|ENABLE|BUILD|SANITIZE|PLUGIN|INSTALL|EXPORTED|"
                     r"KERNELS_SOURCE|PYTHON_SOURCE|SOURCE_DIR|BINARY|TEST_WORKER|NATIVE|MUTANTS)")


def sources(root, folders):
    for folder in folders:
        for dirpath, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = [d for d in dirs
                       if d not in ("__pycache__", "build", "build-san", "check_settings_fixture")]
            for f in files:
                path = os.path.join(dirpath, f)
                if f.endswith(SUFFIXES) or folder == ".ci":
                    yield os.path.relpath(path, root), path


def main(argv):
    root = argv[1]
    table_path = os.path.join(root, "python", "mlafuzz", "settings.json")
    with open(table_path, encoding="utf-8") as f:
        names = {s["name"] for s in json.load(f)["settings"]}
    problems, seen = [], set()
    for folders, strict in ((ACCESSOR_ONLY, True), (NAMES_ONLY, False)):
        for rel, path in sources(root, folders):
            try:
                text = open(path, encoding="utf-8").read()
            except UnicodeDecodeError:
                continue
            seen.update(re.findall(r"MLAFUZZ_[A-Z0-9_]+", text))
            for n, line in enumerate(text.splitlines(), 1):
                for name in READ.findall(line):
                    if name not in names and not NOT_ENV.search(line):
                        problems.append(f"{rel}:{n}: {name} is read but not in {table_path}")
                if strict and rel not in EXEMPT:
                    for name in DIRECT.findall(line):
                        problems.append(f"{rel}:{n}: {name} read without the settings accessor "
                                        "(core/settings.h, mlafuzz/_settings.py)")
    for name in sorted(names - seen):
        problems.append(f"{table_path}: {name} is listed but nothing reads it")
    if len(argv) > 2:
        out = subprocess.run([argv[2], "--help-env"], capture_output=True, text=True, check=True)
        page = os.path.join(root, "docs", "settings.md")
        with open(page, encoding="utf-8") as f:
            if f.read() != out.stdout:
                problems.append(f"{page} differs from `{argv[2]} --help-env`: regenerate it with "
                                f"{argv[2]} --help-env > {page}")
    for p in problems:
        print(p)
    if problems:
        print(f"check_settings: {len(problems)} problem(s); run again: {' '.join(argv)}")
        return 1
    print(f"check_settings: {len(names)} variables, every read listed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Writes docs/plugin-abi.md, the C ABI reference, from include/mlafuzz/plugin.h: the header's
enumerations, structs and entry points, verbatim, so that a plugin can be written from the docs
alone and the page cannot drift from the header. --check: exit 1 when the page differs."""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "include", "mlafuzz", "plugin.h")
PAGE = os.path.join(ROOT, "docs", "plugin-abi.md")
START = "/* ---- Enumerations"
END = "#ifdef __cplusplus\n} /* extern \"C\" */"

INTRO = """# The plugin ABI, field by field

Generated from `include/mlafuzz/plugin.h` by `scripts/gen_plugin_abi.py` (the ctest
`plugin_abi_page` fails when they differ). How to build, load and test a plugin:
[plugins.md](plugins.md); the layouts and the math: [SPEC.md](SPEC.md).

A plugin is a shared library exporting `mlafuzz_plugin_abi_version`, `mlafuzz_plugin_info` and
`mlafuzz_plugin_run` (and optionally `mlafuzz_plugin_supports` and `mlafuzz_plugin_envelope`).
mlafuzz fills a `MlafuzzDecodeCall` and calls `run`; the kernel writes `out` (bf16 bits) and
`lse`. Include the header with `#include "mlafuzz/plugin.h"`; everything below is from it.

```c
"""


def render() -> str:
    with open(HEADER, encoding="utf-8") as f:
        text = f.read()
    begin = text.index(START)
    end = text.index(END)
    return INTRO + text[begin:end].rstrip("\n") + "\n```\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is not current")
    args = ap.parse_args()
    page = render()
    if args.check:
        try:
            with open(PAGE, encoding="utf-8") as f:
                current = f.read()
        except OSError:
            current = ""
        if current != page:
            print(f"{PAGE} differs from {HEADER}: run scripts/gen_plugin_abi.py", file=sys.stderr)
            return 1
        return 0
    tmp = PAGE + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, PAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())

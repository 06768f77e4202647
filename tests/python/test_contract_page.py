"""docs/python.md (with python-reference.md) is enough to write a correct kernel: its complete
kernel is examples/python/contract_kernel.py, word for word, and that kernel passes every
property."""

from __future__ import annotations

import dataclasses
import os
import re
import sys

import mlafuzz
import mlafuzz.testing
from conftest import ROOT, full_or_quick

sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
import contract_kernel  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "python.md")
# The contract is the page and its reference page, read together.
REFERENCE = os.path.join(ROOT, "docs", "python-reference.md")
KERNEL = os.path.join(ROOT, "examples", "python", "contract_kernel.py")


def _page() -> str:
    text = ""
    for path in (PAGE, REFERENCE):
        with open(path, encoding="utf-8") as f:
            text += f.read()
    return text


def test_the_pages_complete_kernel_is_the_example() -> None:
    section = _page().split("## A complete kernel", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "one code block in the page's 'A complete kernel'"
    with open(KERNEL, encoding="utf-8") as f:
        source = f.read()
    # The file is the block plus its module docstring and the __future__ import.
    body = source.split("from __future__ import annotations\n\n", 1)[1]
    assert blocks[0] == body, "docs/python.md's complete kernel and contract_kernel.py differ"


def test_the_page_names_every_field_and_enumeration() -> None:
    page = _page()
    missing = [f.name for f in dataclasses.fields(mlafuzz.DecodeCall)
               if f"`{f.name}`" not in page and f.name not in page]
    assert not missing, f"call fields the page does not describe: {missing}"
    from mlafuzz import (_EMPTY_LSES, _EXTRA_PIPELINES, _FEATURES, _INVALID_RULES,
                         _INVARIANTS, _LAYOUTS, _PRECISIONS)
    words = [*_LAYOUTS, *_INVALID_RULES, *_EMPTY_LSES, *_FEATURES, *_INVARIANTS, *_PRECISIONS,
             *_EXTRA_PIPELINES]
    assert not [w for w in words if f'"{w}"' not in page], "enumeration strings missing"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "docs/python.md" in f.read(), "the README links the page"


def test_the_contract_kernel_passes_every_property() -> None:
    # 40 cases under MLAFUZZ_TEST_QUICK: each property still applies to some of them.
    result = mlafuzz.testing.fuzz(contract_kernel.decode, cases=full_or_quick(120, 40), seed=7,
                                  jobs=2)
    rows = {r["property"]: r for r in result.report["results"]}
    for prop in ("run", "tolerance", "poison", "relocate", "batch-alone", "head-alone",
                 "query-alone", "determinism", "permute", "insert-invalid", "move-to-extra"):
        r = rows[prop]
        assert r["failures"] == 0 and r["cases"] > r["not_applicable"], (prop, r)
    assert max(r["tightness"]["max"] for r in rows.values()) < 1

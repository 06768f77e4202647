#!/usr/bin/env python3
"""Checks that README.md, docs/*.md and the results pages name only what exists and run as written.

Usage: scripts/check_docs.py [--root DIR] [--build DIR] [--update] [FILE.md ...]
(default pages: README.md, CHANGELOG.md, bench/RESULTS.md and docs/*.md)

- Paths: every repository path a page names (a Markdown link, or an inline `code` span whose
  first component is a folder or file of the repository) must exist; `*` is a glob, a trailing
  `:name` (python:FILE.py:FUNC) and `#anchor` are stripped. A link to a page's `#anchor` must
  match one of its headings (GitHub's slugs).
- Commands: a fenced block right after the line `<!-- check: run -->` (or
  `<!-- check: run exit=N -->`) holds commands, one per `$ ` line; each runs with bash from the
  repository root and must exit 0 (or N); a word starting `build/` names the --build dir.
  Mark only quick commands that need no GPU and write nothing outside /tmp.
- Help texts: a fenced block right after `<!-- help: SUBCOMMAND -->` must equal
  `mlafuzz SUBCOMMAND --help` (the executable's path printed as `mlafuzz`); --update rewrites
  those blocks from the executable instead of checking them.

Exit 0 when everything holds, 1 otherwise (each problem printed as `FILE:LINE: what`), 2 on bad
usage. Run by ctest as `docs` (label docs).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys

# Pages other engineers are writing: named by docs/README.md before they land.
PENDING: set = set()
# Folders mlafuzz creates at run time inside tracked folders.
GENERATED = ("corpus/findings",)
PATH_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.*\-]+)*/?$")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
CODE_RE = re.compile(r"`([^`\n]+)`")
FENCE_RE = re.compile(r"^(\s*)(```+|~~~+)")
MARK_RE = re.compile(r"^<!-- (check: run(?: exit=(\d+))?|help: ?([a-z\- ]*)) -->\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: str) -> set[str]:
    out: set[str] = set()
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE_RE.match(line):
                in_fence = not in_fence
            elif not in_fence and line.startswith("#"):
                out.add(slug(line.lstrip("#")))
    return out


class Page:
    """A Markdown page split into prose lines and fenced blocks, with the marker before each."""

    def __init__(self, root: str, rel: str):
        self.rel = rel
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.prose: list[tuple[int, str]] = []  # (line number, text) outside fences
        self.blocks: list[dict] = []  # start, end (indices of the fence lines), marker
        fence_start = None
        marker = None
        for i, line in enumerate(self.lines):
            if FENCE_RE.match(line):
                if fence_start is None:
                    fence_start = i
                else:
                    self.blocks.append({"start": fence_start, "end": i, "marker": marker})
                    fence_start, marker = None, None
                continue
            if fence_start is not None:
                continue
            m = MARK_RE.match(line)
            if m:
                marker = m
            elif line.strip():
                marker = None
            self.prose.append((i + 1, line))


def repo_entries(root: str) -> set[str]:
    """Top-level names of the repository's tracked files (build folders are not among them)."""
    try:
        files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, text=True,
                               check=True).stdout.split()
        return {f.split("/", 1)[0] for f in files}
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: a source tarball
        return {e for e in os.listdir(root) if not e.startswith(("build", "reports"))}


def check_path(root: str, page: Page, target: str, tops: set[str]) -> str | None:
    """None when target exists (or is no repository path), else the problem."""
    path, _, anchor = target.partition("#")
    base = os.path.dirname(page.rel)
    full = os.path.normpath(os.path.join(root, base, path or os.path.basename(page.rel)))
    rel = os.path.relpath(full, root)
    if rel in PENDING:
        if not os.path.exists(full):
            print(f"note: {page.rel} links {rel}, which is not written yet")
        return None
    if not glob.glob(full):
        return f"{target}: no such file or folder ({rel})"
    if anchor and full.endswith(".md") and os.path.isfile(full) and anchor not in headings(full):
        return f"{target}: {rel} has no heading with the anchor #{anchor}"
    return None


def code_span_path(span: str, tops: set[str]) -> str | None:
    """The repository path an inline code span names, or None."""
    text = span.strip().rstrip(".,;")
    text = re.sub(r":[A-Za-z_][\w\-~]*$", "", text)  # FILE.py:FUNC
    if any(c in text for c in "<>{}$ ") or "..." in text or not PATH_RE.match(text):
        return None
    first = text.split("/", 1)[0]
    if first not in tops or text.startswith(GENERATED):
        return None
    if "/" not in text and not os.path.splitext(text)[1]:
        return None  # a bare word that happens to name a folder ("python", "tests")
    return text


def check_paths(root: str, page: Page, tops: set[str]) -> list[str]:
    problems = []
    for number, line in page.prose:
        for target in LINK_RE.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            p = check_path(root, page, target, tops)
            if p:
                problems.append(f"{page.rel}:{number}: {p}")
        for span in CODE_RE.findall(line):
            path = code_span_path(span, tops)
            if path and not glob.glob(os.path.join(root, path)) and path not in PENDING:
                problems.append(f"{page.rel}:{number}: `{span}`: no such file or folder")
    return problems


def help_text(mlafuzz: str, sub: str) -> str:
    args = [mlafuzz, *sub.split(), "--help"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60).stdout
    return out.replace(f"Usage: {mlafuzz}", "Usage: mlafuzz").rstrip("\n")


def run_blocks(root: str, build: str, page: Page, update: bool) -> list[str]:
    problems = []
    mlafuzz = os.path.join(build, "mlafuzz")
    replaced: list[tuple[int, int, str]] = []
    for b in page.blocks:
        m = b["marker"]
        if m is None:
            continue
        body = page.lines[b["start"] + 1:b["end"]]
        where = f"{page.rel}:{b['start'] + 1}"
        if m.group(1).startswith("help"):
            sub = (m.group(3) or "").strip()
            want = help_text(mlafuzz, sub)
            if update:
                replaced.append((b["start"] + 1, b["end"], want))
            elif "\n".join(body) != want:
                problems.append(f"{where}: the help of `mlafuzz {sub}` changed; rerun "
                                f"python3 scripts/check_docs.py --build BUILD --update")
            continue
        expect = int(m.group(2) or 0)
        for line in body:
            if not line.startswith("$ "):
                continue
            cmd = re.sub(r"(?<![\w/.\-])build/", build + "/", line[2:])
            try:
                r = subprocess.run(["bash", "-c", cmd], cwd=root, capture_output=True, text=True,
                                   timeout=120)
                rc, tail = r.returncode, (r.stdout + r.stderr)[-1500:]
            except subprocess.TimeoutExpired:
                rc, tail = "timeout (120 s)", ""
            if rc != expect:
                problems.append(f"{where}: `{line[2:]}` exited {rc}, the page expects {expect}\n"
                                f"{tail}")
    if replaced:
        lines = page.lines
        for start, end, text in reversed(replaced):
            lines[start:end] = text.split("\n")
        with open(os.path.join(root, page.rel), "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--root", default=here, help="repository root (default: this script's)")
    ap.add_argument("--build", help="build folder holding mlafuzz (default: ROOT/build)")
    ap.add_argument("--update", action="store_true", help="rewrite the help blocks")
    ap.add_argument("pages", nargs="*", help="pages to check (default: README.md, CHANGELOG.md, "
                    "bench/RESULTS.md, docs/*.md)")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    build = os.path.abspath(a.build or os.path.join(root, "build"))
    if not os.access(os.path.join(build, "mlafuzz"), os.X_OK):
        print(f"check_docs: no executable {build}/mlafuzz (pass --build DIR)", file=sys.stderr)
        return 2
    pages = a.pages or [p for p in ("README.md", "CHANGELOG.md", "bench/RESULTS.md")
                        if os.path.isfile(os.path.join(root, p))] + sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    tops = repo_entries(root)
    problems: list[str] = []
    for rel in pages:
        page = Page(root, rel)
        problems += check_paths(root, page, tops)
        problems += run_blocks(root, build, page, a.update)
    for p in problems:
        print(p)
    ran = ", ".join(pages)
    print(f"check_docs: {len(pages)} pages ({ran}): "
          + (f"{len(problems)} problem(s)" if problems else "every path exists, every command ran"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How many findings (groups) one planted bug gives: one `mlafuzz fuzz` campaign per bug and seed.

Every planted bug the project has on the CPU: the host-model mutant catalogue (cpu-mma~<name>),
the numpy example's MUTANTS, the stride-bug plugins and the test plugins with planted bugs
(tests/plugins: faulty_*, variant_*, reader_bug_*), and pairs of numpy mutants planted together
(bench/triage/pair_kernels.py). Each campaign runs on one thread with a fixed seed; the table
gives, per bug, the raw failures (failing outcomes), the findings the report lists and their
signatures.

    bench/triage/measure_groups.py --mlafuzz build/mlafuzz --plugins build/tests/plugins \\
        --time 60s --seeds 1 --out groups.json
    bench/triage/measure_groups.py --table groups.json [--before before.json]

Runs one campaign at a time (`--jobs 1`): the machine is shared. `--cases N` gives each campaign
a case budget instead of a time budget: the campaign ends after N cases with every triage run to
its end, the same on a loaded machine as on an idle one. Pass --only to pick bugs by a
substring of their names.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOST_MUTANTS = [
    "unmasked-pad-columns", "wrong-scale-group", "page-stride-ignored", "page-size-pow2",
    "invalid-index-unmasked", "topk-length-ignored", "no-rescale", "row-sum-bf16", "lse-log2",
    "sink-in-lse", "sink-ignored", "empty-row-nan", "drop-partial-tile", "store-padded-columns",
    "split-empty-nan", "sink-per-split", "split-merge-log2",
]
NUMPY_MUTANTS = ["topk-length-off-by-one", "sink-ignored", "invalid-index-unmasked",
                 "no-max-subtraction", "wrong-scale-group"]
# Pairs of numpy mutants planted together (pair_kernels.py names them a+b).
PAIRS = [("topk-length-off-by-one", "sink-ignored"),
         ("sink-ignored", "invalid-index-unmasked"),
         ("invalid-index-unmasked", "wrong-scale-group"),
         ("topk-length-off-by-one", "wrong-scale-group"),
         ("invalid-index-unmasked", "no-max-subtraction"),
         ("sink-ignored", "wrong-scale-group"),
         ("topk-length-off-by-one", "no-max-subtraction"),
         ("sink-ignored", "no-max-subtraction"),
         ("no-max-subtraction", "wrong-scale-group")]
FAULTY = ["zeros", "run_error", "crash", "exit", "hang"]
VARIANTS = ["batch_order", "batch_wrong_inexact"]
# The reader-bug plugins (tests/plugins/reader_bug_plugin.c): 1 rounds fp32 V32 scales to a power
# of two, 2 masks only negative entries under out_of_range.
READER_BUGS = [1, 2]


def bugs(plugins: str) -> List[Dict[str, str]]:
    """Every planted bug: name and backend."""
    out = [{"name": f"cpu-mma~{m}", "backend": f"cpu-mma~{m}"} for m in HOST_MUTANTS]
    numpy = os.path.join(ROOT, "examples", "python", "numpy_decode.py")
    out += [{"name": f"numpy~{m}", "backend": f"python:{numpy}:decode~{m}"} for m in NUMPY_MUTANTS]
    out += [{"name": f"stride-bug-{n}",
             "backend": f"plugin:{plugins}/stride/libstride_bug_{n}.so"} for n in range(1, 7)]
    out += [{"name": f"faulty-{k}", "backend": f"plugin:{plugins}/faulty/libfaulty_{k}.so"}
            for k in FAULTY]
    out += [{"name": f"variant-{k}", "backend": f"plugin:{plugins}/variants/libvariant_{k}.so"}
            for k in VARIANTS]
    out += [{"name": f"reader-bug-{n}",
             "backend": f"plugin:{plugins}/reader/libreader_bug_{n}.so"} for n in READER_BUGS]
    pairs = os.path.join(ROOT, "bench", "triage", "pair_kernels.py")
    out += [{"name": f"pair {a} + {b}", "backend": f"python:{pairs}:decode~{a}+{b}",
             "pair": "1"} for a, b in PAIRS]
    return out


def run_one(exe: str, bug: Dict[str, str], seed: int, budget: str, shrink_evals: int,
            case_timeout: str, cases: int = 0) -> Dict[str, object]:
    work = tempfile.mkdtemp(prefix="mlafuzz-groups-")
    try:
        # A case budget ends the campaign after that many cases, every triage finished.
        limit = ["--cases", str(cases)] if cases > 0 else ["--time", budget]
        cmd = [exe, "fuzz", "--backends", bug["backend"], *limit, "--seed", str(seed),
               "--jobs", "1", "--corpus", os.path.join(work, "corpus"), "--report",
               os.path.join(work, "report"), "--progress", "plain", "--case-timeout",
               case_timeout, "--shrink-evals", str(shrink_evals)]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              check=False)
        wall = time.monotonic() - t0
        if proc.returncode not in (0, 1):
            return {"bug": bug["name"], "seed": seed, "error": proc.stdout[-2000:]}
        with open(os.path.join(work, "report", "report.json"), encoding="utf-8") as f:
            rep = json.load(f)
        raw = sum(s["failures"] for s in rep["results"])
        findings = rep.get("findings", [])
        return {"bug": bug["name"], "seed": seed, "cases": rep["campaign"]["cases"],
                "raw_failures": raw, "groups": len(findings),
                "signatures": sorted(f["signature"] for f in findings),
                "properties": sorted({p for f in findings
                                      for p in (f.get("properties") or [f.get("property")])}),
                "wall_s": round(wall, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace) -> None:
    results = []
    if args.resume and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            results = json.load(f)["runs"]
    done = {(r["bug"], r["seed"]) for r in results}
    for bug in bugs(os.path.abspath(args.plugins)):
        if args.only and not any(o in bug["name"] for o in args.only.split(",")):
            continue
        if args.no_pairs and bug.get("pair"):
            continue
        for seed in args.seeds:
            if (bug["name"], seed) in done:
                continue
            r = run_one(args.mlafuzz, bug, seed, args.time, args.shrink_evals, args.case_timeout,
                        args.cases)
            results.append(r)
            print(json.dumps(r), flush=True)
            tmp = args.out + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"mlafuzz": args.mlafuzz, "time": args.time, "cases": args.cases,
                           "runs": results}, f, indent=1)
            os.replace(tmp, args.out)


def table(args: argparse.Namespace) -> None:
    with open(args.table, encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    before: Dict[str, Dict[str, object]] = {}
    if args.before:
        with open(args.before, encoding="utf-8") as f:
            for r in json.load(f)["runs"]:
                if r["seed"] == args.seed:
                    before[r["bug"]] = r
    print("| bug | raw failures | groups before | groups after | signatures |")
    print("|---|---|---|---|---|")
    singles = []
    for r in runs:
        if r["seed"] != args.seed:
            continue
        if "error" in r:
            print(f"| {r['bug']} | error | | | {r['error'][-200:]!r} |")
            continue
        b = before.get(r["bug"], {}).get("groups", "")
        sigs = "<br>".join(r["signatures"])
        print(f"| {r['bug']} | {r['raw_failures']} | {b} | {r['groups']} | {sigs} |")
        if not r["bug"].startswith("pair "):
            singles.append(r["groups"])
    if singles:
        print(f"\nsingle bugs: {len(singles)}, groups max {max(singles)}, "
              f"median {statistics.median(singles)}")
    # Seed stability: the signatures of each bug over every seed measured.
    by_bug: Dict[str, List[Dict[str, object]]] = {}
    for r in runs:
        by_bug.setdefault(r["bug"], []).append(r)
    if any(len(v) > 1 for v in by_bug.values()):
        print("\n| bug | seeds | distinct signature sets | seeds finding nothing |")
        print("|---|---|---|---|")
        for name, rs in by_bug.items():
            sets = {tuple(r.get("signatures", [])) for r in rs if r.get("signatures")}
            empty = sum(1 for r in rs if not r.get("signatures"))
            print(f"| {name} | {len(rs)} | {len(sets)} | {empty} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mlafuzz", default=os.path.join(ROOT, "build", "mlafuzz"))
    p.add_argument("--plugins", default=os.path.join(ROOT, "build", "tests", "plugins"))
    p.add_argument("--time", default="60s")
    p.add_argument("--cases", type=int, default=0,
                   help="a case budget instead of --time (every triage runs to its end)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--shrink-evals", type=int, default=1000)
    p.add_argument("--case-timeout", default="5s")
    p.add_argument("--only", default="")
    p.add_argument("--no-pairs", action="store_true")
    p.add_argument("--resume", action="store_true", help="skip the runs already in --out")
    p.add_argument("--out", default="groups.json")
    p.add_argument("--table", help="print the table of a results file instead of measuring")
    p.add_argument("--before", help="with --table: results of the build before, for a column")
    p.add_argument("--seed", type=int, default=1, help="with --table: the seed tabulated")
    args = p.parse_args()
    if args.table:
        table(args)
        return 0
    os.environ.setdefault("MLAFUZZ_PYTHON", sys.executable)  # it needs numpy
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

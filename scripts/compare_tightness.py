#!/usr/bin/env python3
"""Per-case tightness figures of two mlafuzz builds, and what changed between them.

  compare_tightness.py collect --mlafuzz BIN --out FILE.json [--seeds 5,21] [--cases 300]
                               [--corpus corpus] [--backends cpu-mma,cpu-simt] [--jobs 2]
  compare_tightness.py compare OLD.json NEW.json
  compare_tightness.py reports OLD/report.json NEW/report.json

collect regenerates cases 0..N-1 of each seed (`fuzz --replay-index K --save-case`) and replays
each with `mlafuzz repro`, which prints every outcome's worst element with all its digits; the
corpus entries (corpus/cases, corpus/regression) are replayed the same way. compare prints, per
(property, backend), how many outcomes have the same figures, the ratio of the new tightness to
the old one (min, median, max) and every verdict that changed. reports compares the aggregated
tightness figures of two campaign reports (report.json's results).
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

OUTCOME = re.compile(r"^  (\S+) on (\S+): (pass|FAIL|not applicable)(.*)$")
RATIO = re.compile(r"error/bound ([0-9.eE+\-infa]+)")
BOUND = re.compile(r" bound ([0-9.eE+\-infa]+) error/bound")
TIGHT = re.compile(r"tightness ([0-9.eE+\-infa]+)\]")


def parse_repro(text):
    """Outcomes of one `mlafuzz repro` run: {"prop|backend": {...}}."""
    out = {}
    for line in text.splitlines():
        m = OUTCOME.match(line)
        if not m:
            continue
        prop, backend, verdict, rest = m.groups()
        rec = {"verdict": verdict}
        r = RATIO.search(rest)
        if r:
            rec["ratio"] = r.group(1)
        b = BOUND.search(rest)
        if b:
            rec["bound"] = b.group(1)
        t = TIGHT.search(rest)
        if t:
            rec["tightness"] = t.group(1)
        out[prop + "|" + backend] = rec
    return out


def replay(binary, backends, seed, index, profile):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.json")
        subprocess.run([binary, "fuzz", "--seed", str(seed), "--replay-index", str(index),
                        "--profile", profile, "--backends", backends, "--save-case", path],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if not os.path.exists(path):
            return {"error": "no case saved"}
        return repro(binary, backends, path)


def repro(binary, backends, path):
    p = subprocess.run([binary, "repro", path, "--backends", backends],
                       capture_output=True, text=True, check=False)
    return parse_repro(p.stdout)


def collect(args):
    jobs = []
    for seed in [int(s) for s in args.seeds.split(",") if s]:
        for k in range(args.cases):
            jobs.append((f"seed{seed}/{k}", ("replay", seed, k)))
    if args.corpus:
        for sub in ("cases", "regression"):
            d = os.path.join(args.corpus, sub)
            if os.path.isdir(d):
                for name in sorted(os.listdir(d)):
                    if name.endswith(".json"):
                        jobs.append((f"corpus/{sub}/{name}", ("repro", os.path.join(d, name))))
    backends = args.backends
    corpus_backends = backends + ",oracle-loop"

    def run(job):
        key, what = job
        if what[0] == "replay":
            return key, replay(args.mlafuzz, backends, what[1], what[2], args.profile)
        return key, repro(args.mlafuzz, corpus_backends, what[1])

    result = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        for key, rec in ex.map(run, jobs):
            result[key] = rec
    with open(args.out + ".tmp", "w") as f:
        json.dump({"mlafuzz": args.mlafuzz, "outcomes": result}, f, indent=1, sort_keys=True)
    os.replace(args.out + ".tmp", args.out)
    print(f"{len(result)} cases -> {args.out}")


def as_float(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def compare(args):
    old = json.load(open(args.old))["outcomes"]
    new = json.load(open(args.new))["outcomes"]
    groups = {}
    changed_verdicts = []
    missing = 0
    for case, outs in old.items():
        if case not in new:
            missing += 1
            continue
        for key, o in outs.items() if isinstance(outs, dict) else []:
            n = new[case].get(key)
            if n is None or not isinstance(o, dict):
                missing += 1
                continue
            prop, backend = key.split("|", 1)
            source = "corpus" if case.startswith("corpus/") else case.split("/")[0]
            g = groups.setdefault((source, prop, backend),
                                  {"n": 0, "same": 0, "ratios": [], "zero_both": 0})
            g["n"] += 1
            if o.get("verdict") != n.get("verdict"):
                changed_verdicts.append((case, key, o.get("verdict"), n.get("verdict")))
            if o == n:
                g["same"] += 1
            to, tn = as_float(o.get("ratio")), as_float(n.get("ratio"))
            if to is None or tn is None:
                continue
            if to == 0 and tn == 0:
                g["zero_both"] += 1
            elif to > 0:
                g["ratios"].append(tn / to)
    print("| source | property | backend | outcomes | same figures | both 0 | "
          "new/old tightness min | median | max |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (source, prop, backend), g in sorted(groups.items()):
        r = g["ratios"]
        stats = (f"{min(r):.6f} | {statistics.median(r):.6f} | {max(r):.6f}" if r
                 else "- | - | -")
        print(f"| {source} | {prop} | {backend} | {g['n']} | {g['same']} | {g['zero_both']} | "
              f"{stats} |")
    print(f"\nverdicts changed: {len(changed_verdicts)}; outcomes missing: {missing}")
    for c in changed_verdicts[:50]:
        print("  ", *c)
    return 1 if changed_verdicts else 0


def reports(args):
    old = json.load(open(args.old))
    new = json.load(open(args.new))

    def table(r):
        return {(x["property"], x["backend"]): x for x in r["results"]}
    to, tn = table(old), table(new)
    print("| property | backend | cases old/new | failures old/new | max old | max new | "
          "p99 old | p99 new | p50 old | p50 new |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(set(to) | set(tn)):
        a, b = to.get(key), tn.get(key)
        if a is None or b is None:
            print(f"| {key[0]} | {key[1]} | only in {'new' if a is None else 'old'} |")
            continue
        ta, tb = a["tightness"], b["tightness"]
        print(f"| {key[0]} | {key[1]} | {a['cases']}/{b['cases']} | "
              f"{a['failures']}/{b['failures']} | {ta['max']:.9g} | {tb['max']:.9g} | "
              f"{ta['p99']:.6g} | {tb['p99']:.6g} | {ta['p50']:.6g} | {tb['p50']:.6g} |")
    print(f"\nfindings old {len(old['findings'])} new {len(new['findings'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--mlafuzz", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--seeds", default="5,21")
    c.add_argument("--cases", type=int, default=300)
    c.add_argument("--profile", default="default")
    c.add_argument("--corpus", default="")
    c.add_argument("--backends", default="cpu-mma,cpu-simt")
    c.add_argument("--jobs", type=int, default=2)
    for name in ("compare", "reports"):
        p = sub.add_parser(name)
        p.add_argument("old")
        p.add_argument("new")
    args = ap.parse_args()
    if args.cmd == "collect":
        collect(args)
        return 0
    return compare(args) if args.cmd == "compare" else reports(args)


if __name__ == "__main__":
    sys.exit(main())

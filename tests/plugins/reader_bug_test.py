#!/usr/bin/env python3
"""What real cache writers produce, against two planted reader bugs (reader_bug_plugin.c).

A default campaign (`mlafuzz fuzz --backends plugin:...`, seed 1, a case budget) must find the
power-of-two scale reader (bug 1) and the negatives-only mask under out_of_range (bug 2), and
shrink each finding to one token (B = 1, H = 1, topk = 1), bug 2 to one group (a non-finite
mismatch, whether the campaign met it as a fault or as NaN); the correct kernel (0) must pass the
same campaign. Prints the cases to the first finding.
Usage: reader_bug_test.py MLAFUZZ PLUGIN_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

CASES = 300


def campaign(mlafuzz, plugin, work, name):
    report, corpus = os.path.join(work, "report-" + name), os.path.join(work, "corpus-" + name)
    cmd = [mlafuzz, "fuzz", "--backends", "plugin:" + plugin, "--cases", str(CASES), "--seed", "1",
           "--report", report, "--corpus", corpus, "--progress", "plain"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(report, "report.json")) as f:
        return proc.returncode, json.load(f), proc.stdout, " ".join(cmd)


def minimal_case(finding):
    with open(finding["corpus"]) as f:
        return json.load(f)["case"]


def main():
    mlafuzz, plugin_dir = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for bug in (0, 1, 2):
            plugin = os.path.join(plugin_dir, "libreader_bug_%d.so" % bug)
            rc, report, log, cmd = campaign(mlafuzz, plugin, work, str(bug))
            findings = report.get("findings", [])
            if bug == 0:
                if rc != 0 or findings:
                    print("FAIL: the correct reader has %d findings (exit %d)\n%s\nrepro: %s"
                          % (len(findings), rc, log[-3000:], cmd))
                    failures += 1
                continue
            if rc != 1 or not findings:
                print("FAIL: reader bug %d not found in %d cases (exit %d)\n%s\nrepro: %s"
                      % (bug, CASES, rc, log[-3000:], cmd))
                failures += 1
                continue
            first = min(f["case_index"] for f in findings)
            print("reader bug %d: %d findings, the first at case %d (%d cases)"
                  % (bug, len(findings), first, first + 1))
            one_token = []
            for f in findings:
                c = minimal_case(f)
                print("  %s on %s: shrunk to B=%d H=%d topk=%d layout=%s scales=%s indices=%s"
                      % (f["property"], f["backend"], c["batch"], c["heads"], c["topk"],
                         c["geometry"]["layout"], json.dumps(c["scales"]),
                         json.dumps(c.get("indices"))))
                if c["batch"] == 1 and c["heads"] == 1 and c["topk"] == 1:
                    one_token.append(f)
            if not one_token:
                print("FAIL: reader bug %d: no finding shrunk to one token\nrepro: %s"
                      % (bug, cmd))
                failures += 1
            # One bug, one group: an entry far past the cache faults or reads NaN by where it
            # lands; the walk moves it to the first slot past the end, where it reads NaN.
            if bug == 2 and [f["kind"] for f in findings] != ["non-finite mismatch"]:
                print("FAIL: reader bug 2: groups %s, wanted one non-finite mismatch\nrepro: %s"
                      % ([f["signature"] for f in findings], cmd))
                failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

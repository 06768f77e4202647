#!/bin/bash
# scripts/nightly_slurm.sh under a real Slurm on this machine: munge, slurmctld and slurmd from
# Debian's packages (slurm-wlm, munge), one node, a generated slurm.conf that puts every daemon
# on 127.0.0.1 with its own ports and state folder under a temporary folder. Night 1 is a short
# array of 4 tasks; night 2 another, one of whose tasks is requeued (scontrol requeue) mid-run and
# must resume its shard. Checked: the merged report (cases = the sum of the shards, each finding
# signature once with the shards' counts added), the requeued shard (its cases before the requeue
# kept, none lost, its findings kept) and the comparison with night 1. Every daemon started here
# is stopped by its PID, also when a check fails.
#
# Usage: slurm_nightly_test.sh MLAFUZZ REPO_ROOT
# Exit 77 (skipped) when it cannot run here (not root, packages missing), unless
# MLAFUZZ_REQUIRE_SLURM=1 (CI), which makes that a failure.
set -euo pipefail
mlafuzz=$(realpath "$1")
root=$(realpath "$2")
t_start=$SECONDS

cannot_run() {
  if [ "${MLAFUZZ_REQUIRE_SLURM:-0}" = 1 ]; then
    echo "FAIL: $1 (MLAFUZZ_REQUIRE_SLURM=1: this test must run here)"
    exit 1
  fi
  echo "SKIPPED: $1"
  exit 77
}
[ "$(id -u)" = 0 ] || cannot_run "needs root (slurmd runs jobs as their user, munged and the daemons as root here)"
for tool in munged mungekey slurmctld slurmd sbatch scontrol squeue sinfo python3; do
  command -v "$tool" >/dev/null || cannot_run "$tool not found (apt-get install slurm-wlm munge)"
done

work=$(mktemp -d /tmp/mlafuzz-slurm.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/munge-key" "$work/munge" "$work/state" "$work/spool" "$work/log" "$work/nights"
chmod 700 "$work/munge-key"
export SLURM_CONF=$work/slurm.conf

# Stops what this test started, by PID: the jobs, slurmd, slurmctld, munged.
cleanup() {
  local rc=$?
  set +e
  if [ -f "$work/slurmctld.pid" ]; then
    # Jobs first: their tasks end before the daemons that run them.
    scancel --quiet --full --name=mlafuzz-nightly 2>/dev/null
    for _ in $(seq 250); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  for f in slurmd.pid slurmctld.pid munge/munged.pid; do
    [ -f "$work/$f" ] || continue
    pid=$(cat "$work/$f")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  if [ "$rc" != 0 ]; then
    echo "--- logs ($work kept) ---"
    tail -n 20 "$work"/log/*.log
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port)
slurmd_port=$(free_port)
[ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$(free_port)

mungekey --create --keyfile="$work/munge-key/munge.key"
munged --force --socket="$work/munge/munge.socket" --key-file="$work/munge-key/munge.key" \
  --log-file="$work/log/munged.log" --pid-file="$work/munge/munged.pid" \
  --seed-file="$work/munge-key/munged.seed"

cat >"$SLURM_CONF" <<CONF
ClusterName=mlafuzz-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket,cred_expire=5
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SchedulerType=sched/builtin
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=15
InactiveLimit=0
NodeName=mlafuzz-node NodeAddr=127.0.0.1 NodeHostname=$(hostname) CPUs=$(nproc) State=UNKNOWN
PartitionName=nightly Nodes=mlafuzz-node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

slurmctld -i -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N mlafuzz-node
up=0
for _ in $(seq 300); do
  if [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; then up=1; break; fi
  sleep 0.1
done
[ "$up" = 1 ] || fail "the node did not come up: $(sinfo 2>&1)"
listening=$(python3 - "$ctld_port" "$slurmd_port" <<'PY'
import sys
ports = {int(p) for p in sys.argv[1:]}
for line in open("/proc/net/tcp").read().splitlines()[1:] + open("/proc/net/tcp6").read().splitlines()[1:]:
    f = line.split()
    addr, port = f[1].rsplit(":", 1)
    if f[3] == "0A" and int(port, 16) in ports:
        print(addr)
PY
)
for a in $listening; do
  [ "$a" = 0100007F ] || fail "a daemon listens on $a (hex), not only 127.0.0.1"
done
echo "slurm up in $((SECONDS - t_start)) s: slurmctld 127.0.0.1:$ctld_port, slurmd 127.0.0.1:$slurmd_port"

export MLAFUZZ="$mlafuzz" NIGHTS="$work/nights"
export BACKENDS=cpu-simt,cpu-mma~unmasked-pad-columns
export FUZZ_ARGS="--jobs 1 --properties run,tolerance --shrink-evals 40 --report-interval 1s"
submit() {  # submit SEED FUZZ_TIME: an array of 4 tasks of the nightly script; prints the job id
  SEED=$1 FUZZ_TIME=$2 sbatch --parsable --array=0-3 --oversubscribe --chdir="$work" \
    --output="$work/log/night-$1-%a.log" "$root/scripts/nightly_slurm.sh"
}
wait_job() {  # wait_job ID LIMIT_S: until no task of the job is left in the queue
  for _ in $(seq $(($2 * 5))); do
    [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "job $1 still queued after $2 s: $(squeue -j "$1")"
}
report_field() {  # report_field FILE PYTHON_EXPR(r): evaluates the expression on report.json
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"
}

# Night 1: the previous night.
job1=$(submit 20261201 6s)
wait_job "$job1" 120
night1=$NIGHTS/20261201
[ -f "$night1/report.json" ] || fail "night 1 was not merged: $(cat "$work"/log/night-20261201-*.log)"
echo "night 1: $(report_field "$night1/report.json" 'r["campaign"]["cases"]') cases merged"

# Night 2: task 1 is requeued once its report shows cases and a finding.
job2=$(submit 20261202 15s)
night2=$NIGHTS/20261202
shard1=$night2/shard-1/report/report.json
seen=0
for _ in $(seq 600); do
  if [ -f "$shard1" ] && [ "$(report_field "$shard1" 'int(r["campaign"]["cases"] >= 2 and len(r["findings"]) > 0)' 2>/dev/null)" = 1 ]; then
    seen=1
    break
  fi
  sleep 0.1
done
[ "$seen" = 1 ] || fail "shard 1 showed no case with a finding: $(cat "$work/log/night-20261202-1.log")"
cp "$shard1" "$work/shard1-before-requeue.json"
scontrol requeue "${job2}_1"
echo "requeued task ${job2}_1 at $((SECONDS - t_start)) s"
wait_job "$job2" 150
[ -f "$night2/report.json" ] || fail "night 2 was not merged: $(cat "$work"/log/night-20261202-*.log)"

log1=$work/log/night-20261202-1.log
grep -q "task 1: stopped by SIGTERM" "$log1" || fail "task 1 was not stopped by the requeue: $(cat "$log1")"
resumed=$(grep -o "resuming .*: [0-9]* case(s) done" "$log1" | grep -o "[0-9]* case(s)" | grep -o "[0-9]*" || true)
[ -n "$resumed" ] && [ "$resumed" -gt 0 ] || fail "task 1 did not resume its shard: $(cat "$log1")"

python3 - "$night1/report.json" "$night2" "$resumed" "$work/shard1-before-requeue.json" <<'PY' \
  || fail "night 2's reports"
import json, sys, collections
night1, night2, resumed = sys.argv[1], sys.argv[2], int(sys.argv[3])
before = json.load(open(sys.argv[4]))
merged = json.load(open(night2 + "/report.json"))
shards = [json.load(open(f"{night2}/shard-{i}/report/report.json")) for i in range(4)]
cases = [s["campaign"]["cases"] for s in shards]
errors = []
if merged["campaign"]["cases"] != sum(cases):
    errors.append(f"merged cases {merged['campaign']['cases']} != sum of the shards {cases}")
indices = sorted((s["index"], s["count"]) for s in merged["campaign"]["shards"])
if indices != [(i, 4) for i in range(4)]:
    errors.append(f"merged shards {indices}")
counts = collections.Counter()
for s in shards:
    for f in s["findings"]:
        counts[f["signature"]] += f["count"]
sigs = [f["signature"] for f in merged["findings"]]
if len(sigs) != len(set(sigs)):
    errors.append("a signature twice in the merged report")
if {f["signature"]: f["count"] for f in merged["findings"]} != dict(counts):
    errors.append("merged findings differ from the shards' findings added up")
if not sigs:
    errors.append("no finding (the planted bug must be found)")
s1 = shards[1]["campaign"]
if s1["stop_reason"] != "time" or s1["cases"] <= resumed:
    errors.append(f"shard 1 after the requeue: stop {s1['stop_reason']}, {s1['cases']} cases, "
                  f"resumed at {resumed}")
if before["campaign"]["cases"] > resumed:
    errors.append(f"shard 1 had {before['campaign']['cases']} cases before the requeue, resumed "
                  f"at {resumed}")
final_sigs = {f["signature"] for f in shards[1]["findings"]}
settled = [f["signature"] for f in before["findings"]
           if not f.get("shrink_note", "").startswith("being shrunk")]
lost = [s for s in settled if s not in final_sigs]
if lost:
    errors.append(f"findings of shard 1 lost by the requeue: {lost}")
ranges = s1["shards"][0]["case_ranges"]
if sum(hi - lo for lo, hi in ranges) != s1["cases"]:
    errors.append(f"shard 1 case ranges {ranges} do not hold its {s1['cases']} cases")
compare = open(night2 + "/compare.txt").read()
n1 = json.load(open(night1))["campaign"]["cases"]
if f"cases: {n1} -> {merged['campaign']['cases']};" not in compare or "verdict:" not in compare:
    errors.append("compare.txt: " + compare)
print(f"night 2: merged {merged['campaign']['cases']} cases = shards {'+'.join(map(str, cases))}; "
      f"{len(sigs)} finding signature(s), {sum(counts.values())} failures")
print(f"requeued shard 1: {before['campaign']['cases']} cases and {len(settled)} finding(s) "
      f"seen before the requeue, resumed at {resumed} cases, ended with {s1['cases']} "
      f"(case ranges {ranges}) and {len(final_sigs)} finding(s), none lost")
print("compare with night 1: " + " | ".join(l for l in compare.splitlines()
                                           if l.startswith(("cases:", "verdict:"))))
for e in errors:
    print("FAIL: " + e)
sys.exit(1 if errors else 0)
PY

echo "slurm nightly test passed in $((SECONDS - t_start)) s"

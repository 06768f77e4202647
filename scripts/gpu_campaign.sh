#!/usr/bin/env bash
# The nightly GPU campaign as run on the lent H200, in phases that fit the device tool's
# 10-minute calls (the campaign itself runs detached in the background between calls):
#
#   scripts/gpu_campaign.sh start  BIN_DIR MINUTES   # two shards (0/2, 1/2) on every GPU, detached
#   scripts/gpu_campaign.sh wait   SECONDS           # wait until both finish (or SECONDS pass)
#   scripts/gpu_campaign.sh finish BIN_DIR           # merge the shard reports, copy to $OUT
#
# Work folder: $CAMP (default /tmp/mlafuzz-camp). Each shard writes its own report and corpus;
# `mlafuzz report merge` combines them into merged.json / merged.html / merged.xml.
set -u
CAMP=${CAMP:-/tmp/mlafuzz-camp}
SEED=${SEED:-20261129}
phase=${1:?phase: start|wait|finish}
case $phase in
  start)
    BIN=${2:?bin dir}
    MIN=${3:-20}
    mkdir -p "$CAMP"
    for s in 0 1; do
      setsid nohup "$BIN/mlafuzz" fuzz --backends cuda-mma,cuda-simt --time "${MIN}m" \
        --seed "$SEED" --shard "$s/2" --devices all --case-timeout 120s --shrink-time 60s \
        --report "$CAMP/shard$s" --corpus "$CAMP/corpus$s" --progress plain \
        >"$CAMP/shard$s.log" 2>&1 </dev/null &
      echo "shard $s/2 started (pid $!)"
    done
    ;;
  wait)
    LIMIT=${2:-560}
    t0=$SECONDS
    while pgrep -f "mlafuzz fuzz --backends cuda-mma" >/dev/null; do
      ((SECONDS - t0 >= LIMIT)) && break
      sleep 5
    done
    tail -n 2 "$CAMP"/shard*.log
    ;;
  finish)
    BIN=${2:?bin dir}
    O=${OUT:-$CAMP/out}
    mkdir -p "$O"
    "$BIN/mlafuzz" report merge "$CAMP/shard0/report.json" "$CAMP/shard1/report.json" \
      -o "$O/merged.json" --html "$O/merged.html" --junit "$O/merged.xml"
    echo "merge rc=$?"
    cp "$CAMP/shard0/report.json" "$O/shard0.json"
    cp "$CAMP/shard1/report.json" "$O/shard1.json"
    tar czf "$O/corpus.tgz" -C "$CAMP" corpus0 corpus1 shard0.log shard1.log 2>/dev/null
    "$BIN/mlafuzz" report "$O/merged.json" | tail -n 60
    ;;
esac

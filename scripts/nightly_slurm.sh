#!/bin/bash
# Nightly mlafuzz campaign as a Slurm job array: one shard per array task, no coordinator.
#
#   sbatch scripts/nightly_slurm.sh              # 8 machines x 8 h, tonight's seed
#   SEED=20261129 sbatch --array=0-3 scripts/nightly_slurm.sh
#   FUZZ_TIME=30s BACKENDS=cpu-mma,cpu-simt FUZZ_ARGS="--jobs 1" sbatch --array=0-3 ...
#
# Every task runs `mlafuzz fuzz` on its shard (SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT are
# read by mlafuzz itself), on every GPU of its node (--devices all), into a shared folder. The
# last task to finish merges the shard reports and compares the night with the previous one.
# A requeued task (scontrol requeue, a preempted or lost node) resumes its shard from the report
# it left (fuzz --resume) instead of starting it over. tests/slurm runs this under a real Slurm.
#SBATCH --job-name=mlafuzz-nightly
#SBATCH --array=0-7
#SBATCH --nodes=1
#SBATCH --exclusive
#SBATCH --time=08:30:00
#SBATCH --output=nightly-%A_%a.log
#SBATCH --open-mode=append
#SBATCH --requeue
set -euo pipefail

MLAFUZZ=${MLAFUZZ:-build/mlafuzz}
NIGHTS=${NIGHTS:-nightly}                   # shared file system
SEED=${SEED:-$(date -u +%Y%m%d)}            # the same seed for every shard of the night
NIGHT="$NIGHTS/$SEED"
SHARD="$NIGHT/shard-${SLURM_ARRAY_TASK_ID}"
mkdir -p "$SHARD"
# Slurm stops a task it requeues or cancels with SIGTERM: mlafuzz writes its report, and the
# task ends there, without marking the shard done.
trap 'echo "task ${SLURM_ARRAY_TASK_ID}: stopped by SIGTERM"; exit 143' TERM

# Exit 1 only means "findings": the night's verdict comes from the merge and the comparison.
# FUZZ_ARGS: more fuzz options, split on spaces.
# shellcheck disable=SC2086
"$MLAFUZZ" fuzz --resume --seed "$SEED" --time "${FUZZ_TIME:-8h}" --devices all \
  --backends "${BACKENDS:-available}" --report "$SHARD/report" --corpus "$SHARD/corpus" \
  --progress plain ${FUZZ_ARGS:-} || [ $? -eq 1 ]

# The last shard to finish merges (a lock file elects it).
touch "$SHARD/done"
done_count=$(ls "$NIGHT"/shard-*/done 2>/dev/null | wc -l)
if [ "$done_count" -eq "${SLURM_ARRAY_TASK_COUNT}" ] && mkdir "$NIGHT/.merging" 2>/dev/null; then
  "$MLAFUZZ" report merge "$NIGHT"/shard-*/report/report.json -o "$NIGHT/report.json" \
    --corpus "$NIGHT/corpus" --html "$NIGHT/report.html" --junit "$NIGHT/junit.xml"
  previous=$(ls -d "$NIGHTS"/*/report.json 2>/dev/null | grep -v "/$SEED/" | sort | tail -1 || true)
  if [ -n "$previous" ]; then
    "$MLAFUZZ" report --compare "$previous" "$NIGHT/report.json" | tee "$NIGHT/compare.txt"
  fi
fi

#!/bin/bash
# Nightly mlafuzz campaign as a Slurm job array: one shard per array task, no coordinator.
#
#   sbatch scripts/nightly_slurm.sh              # 8 machines x 8 h, tonight's seed
#   SEED=20261129 sbatch --array=0-3 scripts/nightly_slurm.sh
#
# Every task runs `mlafuzz fuzz` on its shard (SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT are
# read by mlafuzz itself), on every GPU of its node (--devices all), into a shared folder. The
# last task to finish merges the shard reports and compares the night with the previous one.
#SBATCH --job-name=mlafuzz-nightly
#SBATCH --array=0-7
#SBATCH --nodes=1
#SBATCH --exclusive
#SBATCH --time=08:30:00
#SBATCH --output=nightly-%A_%a.log
set -euo pipefail

MLAFUZZ=${MLAFUZZ:-build/mlafuzz}
NIGHTS=${NIGHTS:-nightly}                   # shared file system
SEED=${SEED:-$(date -u +%Y%m%d)}            # the same seed for every shard of the night
NIGHT="$NIGHTS/$SEED"
SHARD="$NIGHT/shard-${SLURM_ARRAY_TASK_ID}"
mkdir -p "$SHARD"

# Exit 1 only means "findings": the night's verdict comes from the merge and the comparison.
"$MLAFUZZ" fuzz --seed "$SEED" --time "${FUZZ_TIME:-8h}" --devices all \
  --backends "${BACKENDS:-available}" --report "$SHARD/report" --corpus "$SHARD/corpus" \
  --progress plain || [ $? -eq 1 ]

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

#!/bin/bash
# Nsight Compute sections for bench rows, one profile per argument, appended to one CSV file:
#   bench/ncu_rows.sh OUT.csv 'MHA d=128 S=1k$|tlc' 'MHA d=128 S=1k$|cudnn' 'MHA d=128 S=16k causal|tlc|Persistent=true'
# Each argument is ROW_REGEX|BACKEND[|TLC_BENCH_DEFINES]; see bench/profile_row.py. Clocks are left alone.
set -u
out=$1; shift
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$NCU" ] || { echo "ncu_rows: no ncu on this machine"; exit 1; }
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats
          --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"   # the stall reasons
for spec in "$@"; do
  IFS='|' read -r row backend defines <<<"$spec"
  echo "### $row | $backend | ${defines:-}" >>"$out"
  TLC_BENCH_DEFINES="${defines:-}" "$NCU" --clock-control none --profile-from-start off $sections --csv --page details \
    python3 bench/profile_row.py "$row" --backend "$backend" >>"$out" 2>&1 || echo "ncu_rows: $spec failed" >>"$out"
done

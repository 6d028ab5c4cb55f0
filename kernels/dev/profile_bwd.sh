#!/usr/bin/env bash
# Nsight Compute profile of one backward launch (GPU machine): where the
# warps of a bwd template stall, per SASS instruction. Runs kforge-bench-attn
# on one shape with one template's default knobs and profiles its first
# timed launch (the 8 hostile checks and the benchmark check come before it).
#   BUNDLE=.bundle OUT=/tmp/prof [SHAPE=hstu_prod_causal] [TEMPLATE=bwd_sm90] [LENGTHS=f.json]
#     [SKIP=10] kernels/dev/profile_bwd.sh
# Writes $OUT/bwd.ncu-rep, details.csv (every section), sass.csv (the source
# page), sass.txt (kernels/dev/sass_dump.py: every instruction with its
# samples and top stall reasons) and stalls.txt (the instructions with the most stall samples, and the
# totals by stall reason), and prints stalls.txt's head.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$(realpath "${BUNDLE:-.bundle}")
O=${OUT:-/tmp/kforge-prof}
mkdir -p "$O"
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# LENGTHS: a lengths file of your own (lengths.py's format), e.g. one sequence
# cut out of a benchmark shape; SHAPE then names one of its shapes.
if [ -n "${LENGTHS:-}" ]; then cp "$LENGTHS" "$O/lengths.json" || exit 1
else python3 bench/attention/lengths.py bench/shapes.json > "$O/lengths.json" || exit 1; fi
# --clock-control none: the clocks as the benchmark sees them (device README).
timeout "${PROF_S:-240}" "$NCU" --clock-control none -k 'regex:^kf_attn_bwd$' \
  --launch-skip "${SKIP:-10}" --launch-count 1 --set full --import-source no \
  -f -o "$O/bwd" "$B/bin/kforge-bench-attn" --lengths "$O/lengths.json" --op bwd \
  --variants default --templates "${TEMPLATE:-bwd_sm90}" --only "${SHAPE:-hstu_prod_causal}" \
  --reps 1 > "$O/ncu.log" 2>&1
echo "ncu rc=$?" | tee -a "$O/ncu.log"
"$NCU" -i "$O/bwd.ncu-rep" --page details --csv > "$O/details.csv" 2>&1
"$NCU" -i "$O/bwd.ncu-rep" --page source --csv --print-source sass > "$O/sass.csv" 2>&1
python3 kernels/dev/sass_dump.py "$O/sass.csv" > "$O/sass.txt"
python3 kernels/dev/sass_dump.py --summary "$O/sass.csv" > "$O/stalls.txt"
head -n 120 "$O/stalls.txt"
grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Eligible Warps Per Scheduler|No Eligible|Registers Per Thread|L2 Hit Rate|Achieved Occupancy)"' \
  "$O/details.csv" | cut -d, -f12- | head -n 20

# Sourced by the device-call scripts here (run from the repository root on the GPU
# machine): the bundle's libraries, B (its binaries), and left N, the seconds a step
# may take: N, or what is left of the call's budget (${BUDGET:-DEFAULT_BUDGET} s from
# sourcing, DEFAULT_BUDGET set by the script), at least 5.
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
end=$(( $(date +%s) + ${BUDGET:-${DEFAULT_BUDGET:-560}} ))
left() { local l=$(( end - $(date +%s) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }

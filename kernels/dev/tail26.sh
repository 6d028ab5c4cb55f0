#!/usr/bin/env bash
# notes/bwd.md v22: the grouped list's tail dealt longest first. hstu_prod_causal
# (the one public shape whose list changes) with the previous bench binary
# (kforge-bench-attn.old, the same kernels and the plain grouped list) and the
# new one, in turn, twice each; then the results run of that shape with the new
# binary and the anchors (res22.sh). OUT must be set.
set -u
source kernels/dev/call_env.sh
python3 bench/attention/lengths.py bench/shapes.json > /tmp/l.json
for r in 1 2; do
  for v in old new; do
    bin=$B/kforge-bench-attn; [ $v = old ] && bin=$B/kforge-bench-attn.old
    timeout 90 $bin --lengths /tmp/l.json --out $OUT/$v$r.json --op bwd --variants default \
      --templates bwd_sm90 --only ${ONLY:-hstu_prod_causal} > $OUT/$v$r.log 2>&1
    grep -E "OK |BAD" $OUT/$v$r.log | sed -E 's/ +rel_l2.*//; s/BLOCK_M=64 BLOCK_N=128 //; s/STAGES=2 TMA=1//; s/^ +bwd_sm90 //' | sed "s/^/$v$r /" | tee -a $OUT/ab.txt
  done
done
[ "${RESULTS:-1}" = 1 ] && ONLY=${ONLY:-hstu_prod_causal} SETTINGS='bwd_sm90:SPLIT=0,KVFIRST=0' bash kernels/dev/res22.sh > $OUT/res22.out 2>&1
tail -4 $OUT/res22.out; cat $OUT/ab.txt

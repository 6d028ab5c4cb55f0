set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HelpVerify:EvalGpu.BwdSm90Verifies' > $OUT/eval.log 2>&1; echo "eval rc=$?"
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -8
L=kernels/dev/trace_shapes.json
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'; }
timeout 50 $B/kforge-bench-attn --lengths $L --only powerlaw_short,pl_long --op bwd --variants default --templates bwd_sm90 --settings "bwd_sm90:HELP=1" > $OUT/n.log 2>&1; echo "new rc=$?"; short $OUT/n.log
timeout 40 $B/kforge-bench-attn-old --lengths $L --only powerlaw_short,pl_long --op bwd --variants default --templates bwd_sm90 > $OUT/o.log 2>&1; echo "old rc=$?"; short $OUT/o.log

#!/usr/bin/env bash
# CPU test of run.sh's plumbing with stand-ins for the GPU parts: a fake
# kforge-bench-attn (records its arguments, writes the fixture ours.json) and
# a python3 that fakes lengths.py and anchors.py (recording whether FWD_ONLY
# reached anchors.py) and runs report.py for real.
#   bench/attention/run_sh_test.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
real_py=${REAL_PYTHON:-/usr/bin/python3}
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bundle/bin" "$tmp/bundle/lib" "$tmp/path"
cat > "$tmp/bundle/bin/kforge-bench-attn" <<STUB
#!/usr/bin/env bash
echo "\$@" > "$tmp/ours_args"
while [ \$# -gt 0 ]; do [ "\$1" = --out ] && cp "$here/testdata/ours.json" "\$2"; shift; done
STUB
cat > "$tmp/path/python3" <<STUB
#!/usr/bin/env bash
case "\$1" in
  *lengths.py) echo '[]' ;;
  anchors.py) echo "FWD_ONLY=\${FWD_ONLY-unset}" > "$tmp/anchor_env"; cp "$here/testdata/anchors.jsonl" "\$ANCHORS_OUT" ;;
  *) exec "$real_py" "\$@" ;;
esac
STUB
chmod +x "$tmp/bundle/bin/kforge-bench-attn" "$tmp/path/python3"
fail() { echo "FAIL: $*" >&2; exit 1; }
for op in fwd bwd both; do
  rm -f "$tmp/anchor_env" "$tmp/ours_args"
  PATH="$tmp/path:$PATH" FWD_ONLY=1 BUNDLE="$tmp/bundle" OUT="$tmp/out-$op" OP=$op \
    bash "$here/run.sh" > "$tmp/log-$op" 2>&1 || fail "run.sh OP=$op: $(cat "$tmp/log-$op")"
  grep -q -- "--op $op" "$tmp/ours_args" || fail "OP=$op: kforge-bench-attn got $(cat "$tmp/ours_args")"
  if [ $op = fwd ]; then want=FWD_ONLY=1; else want=FWD_ONLY=unset; fi
  [ "$(cat "$tmp/anchor_env")" = $want ] || fail "OP=$op: anchors.py saw $(cat "$tmp/anchor_env"), want $want"
  grep -q "### backward" "$tmp/out-$op/table.md" || fail "OP=$op: no backward table"
  grep -q "kforge-bench-attn rc=0" "$tmp/out-$op/ours.log" || fail "OP=$op: no rc line"
done
# Without OP: forward, as before.
rm -f "$tmp/ours_args"
PATH="$tmp/path:$PATH" BUNDLE="$tmp/bundle" OUT="$tmp/out-default" bash "$here/run.sh" > /dev/null 2>&1
grep -q -- "--op fwd" "$tmp/ours_args" || fail "default OP is not fwd"
if OP=bwdx BUNDLE="$tmp/bundle" OUT="$tmp/out-bad" bash "$here/run.sh" > /dev/null 2>&1; then
  fail "OP=bwdx accepted"
fi
echo "run.sh plumbing: ok"

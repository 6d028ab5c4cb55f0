#!/usr/bin/env bash
# CPU test of sweep.sh's plumbing with a stand-in for kforge-bench-attn
# (records its arguments; sleeps past CAP when asked): the shapes come from
# both shape files in the order named, the lengths are drawn for them, the
# bench gets --variants all, a run stopped by CAP exits 0 and says so, and an
# unknown shape name is refused before anything runs.
#   bench/search/sweep_sh_test.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bundle/bin" "$tmp/bundle/lib"
cat > "$tmp/bundle/bin/kforge-bench-attn" <<STUB
#!/usr/bin/env bash
echo "\$@" > "$tmp/args"
[ -n "\${STUB_SLEEP:-}" ] && sleep "\$STUB_SLEEP"
echo "op | shape | best verified variant | us | TFLOP/s"
STUB
chmod +x "$tmp/bundle/bin/kforge-bench-attn"
fail() { echo "FAIL: $*" >&2; exit 1; }

BUNDLE="$tmp/bundle" OUT="$tmp/out" NAMES=hstu_imbal_causal,above_tile_causal REPS=5 JOBS=3 \
  bash "$here/sweep.sh" > "$tmp/log" 2>&1 || fail "sweep.sh: $(cat "$tmp/log")"
args=$(cat "$tmp/args")
for want in "--variants all" "--op fwd" "--reps 5" "--jobs 3" "--out $tmp/out/sweep.json" \
            "--lengths $tmp/out/lengths.json"; do
  [[ "$args" == *"$want"* ]] || fail "bench got '$args', no '$want'"
done
order=$(python3 -c "import json,sys; print(','.join(s['name'] for s in json.load(open(sys.argv[1]))))" "$tmp/out/lengths.json")
[ "$order" = hstu_imbal_causal,above_tile_causal ] || fail "lengths.json has $order"
python3 - "$tmp/out/lengths.json" <<'PY' || fail "lengths not drawn"
import json, sys
for s in json.load(open(sys.argv[1])):
    assert len(s["lq"]) == s["B"] and len(s["lk"]) == s["B"], s["name"]
PY
grep -q "kforge-bench-attn rc=0" "$tmp/out/sweep.log" || fail "no rc line"
[ -s "$tmp/out/gpu.txt" ] || fail "no gpu.txt"

# Stopped by its cap: a result, exit 0, and the log says so.
STUB_SLEEP=5 CAP=1 BUNDLE="$tmp/bundle" OUT="$tmp/capped" NAMES=powerlaw_short \
  bash "$here/sweep.sh" > "$tmp/log" 2>&1 || fail "capped run exited non-zero"
grep -q "rc=124 .*(cap 1 s)" "$tmp/capped/sweep.log" || fail "capped run: $(cat "$tmp/capped/sweep.log")"

# An unknown shape: refused, the bench never runs.
rm -f "$tmp/args"
if BUNDLE="$tmp/bundle" OUT="$tmp/bad" NAMES=powerlaw_short,no_such_shape bash "$here/sweep.sh" \
     > "$tmp/log" 2>&1; then
  fail "unknown shape accepted"
fi
grep -q "no_such_shape" "$tmp/log" || fail "no reason given: $(cat "$tmp/log")"
[ ! -e "$tmp/args" ] || fail "the bench ran for an unknown shape"
echo "sweep.sh plumbing: ok"

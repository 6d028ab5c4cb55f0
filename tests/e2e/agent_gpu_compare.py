"""The model loop against a GPU worker, next to the builtin proposer at the
same budget (label gpu: run it on the GPU machine; without a GPU it exits
77, which CTest reports as skipped).

For each proposer a fresh kforge-server (its own SQLite file) and one
kforge-worker on GPU 0 run one tuning job on the same shape with the same
variant budget: the scripted model (scripted_model.py: knob edits, an
injected compile error, a comment-only change, a refused include and a
semantic bug, each broken one repaired) against the builtin knob search.
Printed per proposer: variants evaluated, verified, the verified rate, the
best verified median, how many repairs there were and how many of them
verified, the model calls and their outcomes, and the wall time. The
database of each run is left in $OUT (default ./agent_gpu_out) for a
closer look.

usage: agent_gpu_compare.py <kforge-server> <repo root> <kforge-worker> <kforge>
       [MAX_VARIANTS=20] [HEAD_DIM=128] [ARCH=sm_90a]
Environment: GATE=<compute-sanitizer> to gate promotions (otherwise the
server runs with --allow-ungated-promotion; promotion does not change
what is compared here).
"""
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import kfe2e
from scripted_model import ScriptedModel

SKIP = 77


def has_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run(proposer, bins, repo, out, max_variants, head_dim, arch, base_url):
    """One tuning job through the real binaries: kforge-server, one GPU
    kforge-worker, and the kforge CLI to submit and watch it. Only the CLI
    and the SQLite file are read: the GPU machine's Python has no gRPC."""
    server_bin, worker_bin, cli_bin = bins
    work = kfe2e.tempdir()
    db = os.path.join(work, "kforge.db")
    flags = []
    if base_url:
        config = os.path.join(work, "server.json")
        with open(config, "w") as f:
            json.dump({"model_proposer": {"base_url": base_url, "model": "scripted", "api_key_env": "",
                                          "max_tokens": 8192, "parallelism": 2, "max_repair_attempts": 2,
                                          "max_retries": 0}}, f)
        flags += ["--config", config]
    if not os.environ.get("GATE"):
        flags.append("--allow-ungated-promotion")
    address = "127.0.0.1:%d" % kfe2e.free_port()
    env = dict(os.environ, KFORGE_CLIENT_TOKEN=kfe2e.CLIENT_TOKEN, KFORGE_WORKER_TOKEN=kfe2e.WORKER_TOKEN,
               KFORGE_TOKEN=kfe2e.CLIENT_TOKEN, KFORGE_SERVER=address)
    slog = open(os.path.join(work, "server.log"), "ab")
    server = subprocess.Popen([server_bin, "--listen", address, "--db", db, "--init"] + flags,
                              stdout=slog, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 60
    while subprocess.run([cli_bin, "health"], env=env, capture_output=True).returncode != 0:
        if server.poll() is not None or time.time() > deadline:
            server.kill()
            raise RuntimeError("kforge-server did not come up; log:\n" +
                               open(os.path.join(work, "server.log")).read())
        time.sleep(0.5)
    wlog = open(os.path.join(work, "worker.log"), "ab")
    gate = ["--sanitizer-gate", os.environ["GATE"]] if os.environ.get("GATE") else []
    worker = subprocess.Popen([worker_bin, "--server", address, "--gpu", "0", "--name", "gpu0",
                               "--cache-dir", os.path.join(work, "cache")] + gate,
                              stdout=wlog, stderr=subprocess.STDOUT, env=env)
    start = time.time()
    try:
        tune = subprocess.run([cli_bin, "--timeout", "60", "tune", "--op", "fwd", "--head-dim", str(head_dim),
                               "--heads", "16", "--causal", "--arch", arch, "--batch", "16",
                               "--max-len-q", "4096", "--total-q", str(16 * 2048), "--name", "compare-" + proposer,
                               "--proposer", proposer, "--seed", "1", "--max-variants", str(max_variants)],
                              env=env, capture_output=True, text=True, timeout=3600)
        wall = time.time() - start
        with open(os.path.join(work, "tune.log"), "w") as f:
            f.write(tune.stdout + tune.stderr)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    dest = os.path.join(out, proposer.replace(":", "_"))
    os.makedirs(dest, exist_ok=True)
    for name in ("kforge.db", "server.log", "worker.log", "tune.log"):
        shutil.copy(os.path.join(work, name), os.path.join(dest, name))
    con = sqlite3.connect(os.path.join(dest, "kforge.db"))
    job_id, state, message = con.execute("SELECT id, state, message FROM jobs ORDER BY id DESC LIMIT 1").fetchone()
    return summarize(os.path.join(dest, "kforge.db"), "j%d" % job_id, wall, state, message)


def summarize(db, job_id, wall, state, message):
    con = sqlite3.connect(db)
    evals = con.execute(
        "SELECT e.outcome, e.median_us, v.kind FROM evaluations e JOIN variants v ON v.id = e.variant "
        "JOIN tasks t ON t.id = CAST(substr(e.task, 2) AS INTEGER) WHERE e.job = ? AND t.kind = 'evaluate'",
        (job_id,)).fetchall()
    verified = [e for e in evals if e[0] == "verified"]
    repairs = [e for e in evals if e[2] == "repair"]
    calls = dict(con.execute("SELECT outcome, count(*) FROM model_calls WHERE job = ? GROUP BY outcome",
                             (job_id,)).fetchall())
    return {
        "state": state, "message": message,
        "evaluated": len(evals), "verified": len(verified),
        "verified_rate": len(verified) / len(evals) if evals else 0.0,
        "best_us": min((e[1] for e in verified), default=None),
        "repairs": len(repairs), "repairs_verified": sum(1 for e in repairs if e[0] == "verified"),
        "model_calls": calls, "wall_s": round(wall, 1),
    }


def main():
    server_bin, repo, worker_bin, cli_bin = sys.argv[1:5]
    max_variants = int(sys.argv[5]) if len(sys.argv) > 5 else 20
    head_dim = int(sys.argv[6]) if len(sys.argv) > 6 else 128
    arch = sys.argv[7] if len(sys.argv) > 7 else "sm_90a"
    if not has_gpu():
        print("agent_gpu_compare: no GPU here (nvidia-smi -L failed): skipped")
        return SKIP
    out = os.environ.get("OUT", os.path.join(os.getcwd(), "agent_gpu_out"))
    os.makedirs(out, exist_ok=True)
    model = ScriptedModel(refuse_max_tokens_first=False)
    base = model.start()
    try:
        results = {"model": run("model", (server_bin, worker_bin, cli_bin), repo, out, max_variants, head_dim, arch, base),
                   "builtin": run("builtin", (server_bin, worker_bin, cli_bin), repo, out, max_variants, head_dim, arch, None)}
    finally:
        model.stop()
    print("\nsame budget: %d variants, head_dim %d, %s" % (max_variants, head_dim, arch))
    print("%-8s %9s %8s %8s %12s %8s %10s %8s" % ("proposer", "evaluated", "verified", "rate", "best us",
                                                   "repairs", "repairs ok", "wall s"))
    for name, r in results.items():
        print("%-8s %9d %8d %7.0f%% %12s %8d %10d %8.1f" % (
            name, r["evaluated"], r["verified"], 100 * r["verified_rate"],
            "%.2f" % r["best_us"] if r["best_us"] else "-", r["repairs"], r["repairs_verified"], r["wall_s"]))
    print("model calls by outcome:", results["model"]["model_calls"])
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

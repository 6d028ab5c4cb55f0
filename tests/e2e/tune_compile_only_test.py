"""The agent loop end to end without a GPU: the real kforge-server, a real
kforge-worker in compile-only mode (it finds no CUDA driver here) and the
builtin proposer. `kforge tune --compile-only` for a Blackwell (sm_100a)
bucket must run to completion: every proposal compiled by the worker with
NVRTC, each result stored with its resource report, no best chosen (nothing
was run), and GetKernel still answering "not tuned".

usage: tune_compile_only_test.py <kforge-server> <repo root> <kforge> <kforge-worker>
"""
import json
import os
import sqlite3
import subprocess
import sys

import kfe2e


def main():
    server_bin, repo, cli, worker_bin = sys.argv[1:5]
    work = kfe2e.tempdir()
    db = os.path.join(work, "kforge.db")
    server = kfe2e.ServerProcess(server_bin, db, kfe2e.free_port())
    server.start()
    addr = server.address
    env = dict(os.environ, KFORGE_WORKER_TOKEN=kfe2e.WORKER_TOKEN, KFORGE_TOKEN=kfe2e.CLIENT_TOKEN)
    worker_log = open(os.path.join(work, "worker.log"), "wb")
    worker = subprocess.Popen(
        [worker_bin, "--server", addr, "--compile-only", "--arch", "sm_100a", "--name", "cpu0",
         "--cache-dir", os.path.join(work, "cache"), "--compile-threads", "2"],
        stdout=worker_log, stderr=subprocess.STDOUT, env=env)
    try:
        shape = ["--head-dim", "128", "--heads", "4", "--arch", "sm_100a", "--batch", "8",
                 "--max-len-q", "512", "--total-q", "2000"]
        p = subprocess.run([cli, "--server", addr, "tune", *shape, "--compile-only",
                            "--max-variants", "3", "--seed", "7", "--name", "b200-check"],
                           capture_output=True, text=True, env=env, timeout=400)
        log = open(os.path.join(work, "worker.log")).read()
        assert p.returncode == 0, (p.stdout, p.stderr, log[-3000:])
        assert "state=succeeded" in p.stdout, p.stdout
        assert "no CUDA driver" in log, log[-2000:]

        p = subprocess.run([cli, "--server", addr, "--json", "jobs"], capture_output=True,
                           text=True, env=env, timeout=60)
        jobs = json.loads(p.stdout)
        job = jobs["jobs"][0] if isinstance(jobs, dict) else jobs[0]
        assert job.get("compileOnly") or job.get("compile_only"), job
        progress = job["progress"][0]
        assert progress["proposed"] == 3 and progress["evaluated"] == 3, progress

        con = sqlite3.connect(db)
        kinds = {k for (k,) in con.execute("SELECT kind FROM tasks")}
        assert kinds == {"compile"}, kinds
        rows = con.execute("SELECT outcome, arch, registers, compile_ms FROM evaluations").fetchall()
        assert len(rows) == 3, rows
        for outcome, arch, registers, compile_ms in rows:
            assert arch == "sm_100a", rows
            assert outcome in ("compiled", "compile_error"), rows
            if outcome == "compiled":
                assert registers > 0 and compile_ms > 0, rows
        assert any(r[0] == "compiled" for r in rows), rows
        assert con.execute("SELECT COUNT(*) FROM best").fetchone()[0] == 0

        p = subprocess.run([cli, "--server", addr, "get", *shape], capture_output=True, text=True,
                           env=env, timeout=120)
        assert p.returncode == 0 and "tuned        no" in p.stdout, (p.stdout, p.stderr)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.terminate()
    print("tune_compile_only: ok")


if __name__ == "__main__":
    main()

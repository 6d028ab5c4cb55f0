"""The agent loop end to end without a GPU: the real kforge-server, a real
kforge-worker in compile-only mode (it finds no CUDA driver here) and the
builtin proposer, as README's "runs anywhere" example and deploy/run.sh set
them up: the worker registers for sm_90a (its default) and, from its NVRTC,
takes compile tasks of every other arch too.

`kforge tune --compile-only` for a Blackwell (sm_100a) bucket first says
what it waits for while no worker is there, then runs to completion once
the worker comes: every proposal compiled with NVRTC, each result stored
with its resource report, the compiled ones counted in the job's table, no
best chosen (nothing was run), and GetKernel still answering "not tuned".
A second server with --stuck-job-timeout-ms fails a job that no worker can
run, saying why.

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

    def kforge(*args, timeout=60):
        return subprocess.run([cli, "--server", addr, *args], capture_output=True, text=True,
                              env=env, timeout=timeout)

    worker = None
    try:
        shape = ["--head-dim", "128", "--heads", "4", "--arch", "sm_100a", "--batch", "8",
                 "--max-len-q", "512", "--total-q", "2000"]
        p = kforge("--json", "tune", *shape, "--compile-only", "--max-variants", "3", "--seed",
                   "7", "--name", "b200-check", "--no-watch")
        assert p.returncode == 0, (p.stdout, p.stderr)
        job_id = json.loads(p.stdout)["id"]
        # No worker yet: the job says so (the engine checks once a second).
        shown = kfe2e.wait_until(
            lambda: "waiting: waiting for a worker of arch sm_100a" in kforge("jobs", "show", job_id).stdout,
            timeout=30)
        assert shown, kforge("jobs", "show", job_id).stdout

        worker_log = open(os.path.join(work, "worker.log"), "wb")
        worker = subprocess.Popen(
            [worker_bin, "--server", addr, "--compile-only", "--name", "cpu0",
             "--cache-dir", os.path.join(work, "cache"), "--compile-threads", "2"],
            stdout=worker_log, stderr=subprocess.STDOUT, env=env)
        p = kforge("jobs", "watch", job_id, timeout=400)
        log = open(os.path.join(work, "worker.log")).read()
        assert p.returncode == 0, (p.stdout, p.stderr, log[-3000:])
        assert "state=succeeded" in p.stdout, p.stdout
        assert "no CUDA driver" in log, log[-2000:]
        assert "a connected worker can run its tasks" in p.stdout, p.stdout

        workers = json.loads(kforge("--json", "workers").stdout)["workers"]
        assert len(workers) == 1 and workers[0]["arch"] == "sm_90a", workers
        assert "sm_100a" in workers[0]["compile_archs"], workers

        p = kforge("--json", "jobs")
        jobs = json.loads(p.stdout)
        job = jobs["jobs"][0] if isinstance(jobs, dict) else jobs[0]
        assert job["compile_only"] is True and job["state"] == "succeeded", job
        assert job["waiting_for"] == "", job
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
        compiled = sum(1 for r in rows if r[0] == "compiled")
        assert compiled > 0, rows
        assert con.execute("SELECT COUNT(*) FROM best").fetchone()[0] == 0
        # The job's table counts what compiled (nothing is verified).
        assert progress["compiled"] == compiled and progress["verified"] == 0, progress
        table = kforge("jobs", "show", job_id).stdout
        header = [l for l in table.splitlines() if l.startswith("BUCKET")][0]
        assert header.split()[1:5] == ["PROP", "EVAL", "COMPILED", "FAIL"], table
        row = [l for l in table.splitlines() if l.startswith(progress["bucket"])][0]
        assert row.split()[1:5] == ["3", "3", str(compiled), str(3 - compiled)], table

        p = kforge("get", *shape, timeout=120)
        assert p.returncode == 0 and "tuned        no" in p.stdout, (p.stdout, p.stderr)
    finally:
        if worker:
            worker.terminate()
            worker.wait(timeout=30)
        server.terminate()

    # A job no connected worker can run fails after the stuck-job timeout,
    # with what it waited for.
    stuck = kfe2e.ServerProcess(server_bin, os.path.join(work, "stuck.db"), kfe2e.free_port(),
                                extra=["--stuck-job-timeout-ms", "1500"])
    stuck.start()
    addr = stuck.address
    try:
        p = kforge("tune", "--head-dim", "128", "--heads", "4", "--arch", "sm_90a", "--batch", "8",
                   "--max-len-q", "512", "--total-q", "2000", "--max-variants", "2")
        assert p.returncode == 1, (p.stdout, p.stderr)
        assert "state=failed" in p.stdout, p.stdout
        assert "message: waiting for a GPU worker of arch sm_90a for 1.5 s: no connected worker " \
               "can run its tasks" in p.stdout, p.stdout
    finally:
        stuck.terminate()
    print("tune_compile_only: ok")


if __name__ == "__main__":
    main()

"""Scale-out: one kforge-server and 16 kforge-worker processes in
compile-only mode (no GPU here; each compiles with NVRTC), workers SIGKILLed
and restarted at random while a job runs.

The job finishes SUCCEEDED; every task of it has exactly one recorded result
(none lost, none twice), including the tasks whose worker was killed holding
their lease (they went back to the queue when the lease expired and another
worker did them); no result the server had stored before a kill is missing
or changed afterwards; every compiled result's cubin is in the store under
its SHA-256. Kills prefer workers that hold a lease, so that they hit work in
flight. A restarted worker process registers as a new worker (it has no
session), as after any crash.

The server ends watch streams after max_watch_ms (2 s here), and
`kforge jobs watch` watches again each time: it runs from submission to the
end of the job and exits 0 with the final state.

Small on purpose (4 buckets x 8 variants): 2 cores compile about two
variants a second whatever the number of workers.

usage: scale_out_test.py <kforge-server> <repo root> <kforge> <kforge-worker>
Environment: KFORGE_SCALE_SEED picks the kills (default: from the clock; printed).
"""
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import kfe2e

WORKERS = 16
SHAPES = 4
VARIANTS = 8
JOB_TIMEOUT_S = 240


class Worker:
    """One kforge-worker process slot: the same name and cache folder after
    each restart."""

    def __init__(self, binary, addr, work, index, env):
        self.binary, self.addr, self.env = binary, addr, env
        self.name = "cpu%02d" % index
        self.cache = os.path.join(work, "cache", self.name)
        self.log = os.path.join(work, "worker-%s.log" % self.name)
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--server", self.addr, "--compile-only", "--name", self.name,
             "--cache-dir", self.cache, "--compile-threads", "1", "--lease-wait-ms", "3000"],
            stdout=logf, stderr=subprocess.STDOUT, env=self.env)
        logf.close()

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def stored_results(db):
    """(evaluation id, task, outcome, cubin hash) of every stored result."""
    con = sqlite3.connect(db, timeout=30)
    try:
        return {r[0]: r[1:] for r in
                con.execute("SELECT id, task, outcome, cubin_hash FROM evaluations")}
    finally:
        con.close()


def leased_workers(db):
    """Names of the workers that hold a lease now."""
    con = sqlite3.connect(db, timeout=30)
    try:
        return {name for (name,) in con.execute(
            "SELECT w.name FROM tasks t JOIN workers w ON t.worker = 'w' || w.id "
            "WHERE t.state = 'leased'")}
    finally:
        con.close()


def main():
    server_bin, repo, cli, worker_bin = sys.argv[1:5]
    seed = int(os.environ.get("KFORGE_SCALE_SEED", int(time.time())))
    print("seed", seed, flush=True)
    rng = random.Random(seed)
    work = kfe2e.tempdir()
    kfe2e.generate_stubs(repo, os.path.join(work, "gen"))
    from kforge.v1 import kforge_pb2 as pb
    from kforge.v1 import kforge_pb2_grpc as rpc

    # Short leases so that a killed worker's task is back in the queue within
    # seconds; attempts enough that no task is given up however often the
    # kills hit it; watch streams that end every 2 s.
    config = os.path.join(work, "server.jsonc")
    with open(config, "w") as f:
        json.dump({"max_watch_ms": 2000, "max_task_attempts": 100}, f)
    db = os.path.join(work, "kforge.db")
    server = kfe2e.ServerProcess(server_bin, db, kfe2e.free_port(),
                                 ["--config", config, "--lease-ttl-ms", "3000",
                                  "--heartbeat-ms", "500"])
    channel = server.start()
    kernels = rpc.KernelServiceStub(channel)
    env = dict(os.environ, KFORGE_WORKER_TOKEN=kfe2e.WORKER_TOKEN, KFORGE_TOKEN=kfe2e.CLIENT_TOKEN)
    workers = [Worker(worker_bin, server.address, work, i, env) for i in range(WORKERS)]
    watch = None
    try:
        for w in workers:
            w.start()
        shapes = [pb.Shape(op=pb.OP_FORWARD, dtype=pb.DTYPE_BF16, head_dim=128, heads=4,
                           causal=bool(i % 2), arch="sm_90a", batch=8 << i, max_len_q=512,
                           total_q=(8 << i) * 250) for i in range(SHAPES)]
        job = kernels.SubmitJob(pb.SubmitJobRequest(name="scale-out", shapes=shapes,
                                                    budget=pb.Budget(max_variants=VARIANTS),
                                                    seed=5, compile_only=True),
                                metadata=kfe2e.client_md(), timeout=30)
        watch_out = open(os.path.join(work, "watch.out"), "w")
        watch = subprocess.Popen([cli, "--server", server.address, "jobs", "watch", job.id],
                                 stdout=watch_out, stderr=subprocess.STDOUT, env=env, text=True)

        # Kill a worker every 0.5-1.5 s, two times in three one that holds a
        # lease; restart it after 0-1 s. Before each kill, note what is stored.
        kills = kills_holding = 0
        before_kills = {}
        end = time.time() + JOB_TIMEOUT_S
        state = None
        while time.time() < end:
            state = kernels.GetJob(pb.GetJobRequest(job_id=job.id), metadata=kfe2e.client_md(),
                                   timeout=30).state
            if state not in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING):
                break
            time.sleep(rng.uniform(0.5, 1.5))
            before_kills.update(stored_results(db))
            holding = leased_workers(db)
            pool = [w for w in workers if w.name in holding] if holding and rng.random() < 2 / 3 \
                else workers
            victim = rng.choice(pool)
            kills_holding += victim.name in holding
            victim.kill9()
            kills += 1
            time.sleep(rng.uniform(0, 1))
            victim.start()
        print("kills", kills, "of which holding a lease", kills_holding, flush=True)
        assert state == pb.JOB_STATE_SUCCEEDED, \
            "job ended %s (or timed out after %d s)" % (pb.JobState.Name(state), JOB_TIMEOUT_S)
        assert kills >= 5 and kills_holding >= 3, (kills, kills_holding)

        final = kernels.GetJob(pb.GetJobRequest(job_id=job.id), metadata=kfe2e.client_md(),
                               timeout=30)
        proposed = sum(p.proposed for p in final.progress)
        evaluated = sum(p.evaluated for p in final.progress)
        assert proposed == SHAPES * VARIANTS and evaluated == proposed, final.progress

        # The CLI watched throughout, re-watching whenever a stream ended.
        rc = watch.wait(timeout=60)
        watch_out.close()
        out = open(os.path.join(work, "watch.out")).read()
        assert rc == 0 and "state=succeeded" in out, (rc, out[-3000:])
        rewatches = out.count("current state")
        assert rewatches >= 3, "the watch was not renewed: %s" % out[-3000:]
        print("kforge jobs watch: %d watches of 2 s for one job" % rewatches, flush=True)
    finally:
        if watch and watch.poll() is None:
            watch.kill()
        for w in workers:
            w.stop()
        server.terminate()

    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    job_row = con.execute("SELECT id FROM jobs").fetchall()
    assert len(job_row) == 1, job_row
    tasks = con.execute("SELECT id, kind, state, attempts FROM tasks").fetchall()
    assert len(tasks) == SHAPES * VARIANTS, tasks
    assert all(kind == "compile" and st == "done" for _, kind, st, _ in tasks), tasks
    # Exactly one result per task: none lost, none recorded twice.
    per_task = dict(con.execute("SELECT task, COUNT(*) FROM evaluations GROUP BY task"))
    assert set(per_task) == {"t%d" % tid for tid, _, _, _ in tasks}, (per_task, tasks)
    assert set(per_task.values()) == {1}, per_task
    # Tasks whose lease a kill ended were leased again and still have one result.
    released = [tid for tid, _, _, attempts in tasks if attempts > 1]
    print("tasks leased more than once:", len(released), flush=True)
    assert released, "no kill hit a task in flight"
    rows = con.execute("SELECT id, task, outcome, cubin_hash FROM evaluations").fetchall()
    outcomes = {o for _, _, o, _ in rows}
    assert outcomes <= {"compiled", "compile_error"}, outcomes  # nothing given up as crashed
    compiled = [r for r in rows if r[2] == "compiled"]
    assert compiled, rows
    for _, task, _, digest in compiled:
        (blob,) = con.execute("SELECT bytes FROM cubins WHERE hash = ?", (digest,)).fetchone()
        assert hashlib.sha256(blob).hexdigest() == digest, task
    # What was stored before any kill is there unchanged.
    now = {r[0]: r[1:] for r in rows}
    lost = {k: v for k, v in before_kills.items() if now.get(k) != v}
    assert not lost, lost
    registered = con.execute("SELECT COUNT(*) FROM workers").fetchone()[0]
    restarts = sum(w.starts for w in workers) - WORKERS
    assert registered > WORKERS, (registered, restarts)  # a restarted process registers anew
    con.close()
    print("scale_out: ok (%d workers, %d kills, %d tasks, %d results)"
          % (WORKERS, kills, len(tasks), len(rows)))


if __name__ == "__main__":
    main()

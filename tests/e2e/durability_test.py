"""kill -9 durability: a job survives the server dying mid-flight.

Starts the real kforge-server on a temp SQLite file, submits a job (builtin
proposer), completes some tasks with a scripted worker and keeps one leased,
then SIGKILLs the server. After a restart on the same file: every recorded
result is still there, PRAGMA integrity_check is ok, the job is still
running with its progress intact, the leased task returns to the queue after
its lease expires, and the job runs to completion.

usage: durability_test.py <kforge-server binary> <repo root>
"""
import os
import sqlite3
import sys

import kfe2e


def main():
    binary, repo = sys.argv[1], sys.argv[2]
    work = kfe2e.tempdir()
    kfe2e.generate_stubs(repo, os.path.join(work, "gen"))
    import grpc
    from kforge.v1 import kforge_pb2 as pb
    from kforge.v1 import kforge_pb2_grpc as rpc

    db = os.path.join(work, "kforge.db")
    port = kfe2e.free_port()
    # Short leases so the test does not wait long for the requeue.
    flags = ["--lease-ttl-ms", "1500", "--heartbeat-ms", "200"]
    server = kfe2e.ServerProcess(binary, db, port, flags)
    ch = server.start()
    kernels, workers = rpc.KernelServiceStub(ch), rpc.WorkerServiceStub(ch)
    shape = pb.Shape(op=pb.OP_FORWARD, dtype=pb.DTYPE_BF16, head_dim=128, heads=4,
                     causal=True, arch="sm_90a", batch=16, max_len_q=2048, total_q=16 * 1500)
    job = kernels.SubmitJob(pb.SubmitJobRequest(name="durability", shapes=[shape],
                                                budget=pb.Budget(max_variants=6), seed=3),
                            metadata=kfe2e.client_md(), timeout=30)
    # A gated worker, so that its CONFIRM and RETIME results promote.
    reg = workers.Register(pb.RegisterRequest(worker_name="scripted", gpu=pb.GpuInfo(arch="sm_90a"),
                                              sanitizer_tools=["memcheck"]),
                           metadata=kfe2e.worker_md())
    w, session = reg.worker_id, reg.session_token
    assert session, "Register issued no session"

    def lease(wait_ms=5000):
        r = workers.LeaseTask(pb.LeaseTaskRequest(worker_id=w, wait_ms=wait_ms),
                              metadata=kfe2e.worker_md(session), timeout=30)
        return r.task if r.HasField("task") else None

    def report(task, us):
        res = pb.EvalResult(outcome=pb.EVAL_OUTCOME_VERIFIED,
                            timing=pb.Timing(median_us=us, min_us=us - 0.5, max_us=us + 0.5, samples=5),
                            incumbent_timing=pb.Timing(median_us=us + 50, min_us=us + 49.5,
                                                       max_us=us + 50.5, samples=5),
                            compile=pb.CompileReport(cubin=b"cubin-" + task.variant.variant_id.encode()))
        return workers.ReportResult(pb.ReportResultRequest(worker_id=w, task_id=task.task_id, result=res),
                                    metadata=kfe2e.worker_md(session), timeout=30).accepted

    done, done_evaluations = [], 0
    for i in range(3):
        t = lease()
        assert t is not None, "no task to lease"
        assert report(t, 500.0 - 10 * i), "report refused"
        done.append(t.task_id)
        # A verified result queues a CONFIRM (no best yet) or a re-timing
        # task (faster than the best), which is leased first.
        done_evaluations += t.kind == pb.TASK_KIND_EVALUATE
    held = lease()
    assert held is not None
    print("completed", done, "holding", held.task_id, flush=True)

    server.kill9()

    con = sqlite3.connect(db)
    tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
    assert con.execute("pragma integrity_check").fetchone()[0] == "ok"
    con.close()
    print("tables:", tables, flush=True)

    server = kfe2e.ServerProcess(binary, db, port, flags)
    ch = server.start()
    kernels, workers = rpc.KernelServiceStub(ch), rpc.WorkerServiceStub(ch)
    j = kernels.GetJob(pb.GetJobRequest(job_id=job.id), metadata=kfe2e.client_md())
    assert j.state == pb.JOB_STATE_RUNNING, j
    evaluated = sum(p.evaluated for p in j.progress)
    assert evaluated >= done_evaluations, "recorded results lost: %s" % j
    con = sqlite3.connect(db)
    states = dict(con.execute("select 't' || id, state from tasks"))
    con.close()
    assert all(states[t] == "done" for t in done), "completed tasks not done: %s" % states
    # Every completed task is still done: their variants' evaluations exist.
    variants = kernels.ListVariants(pb.ListVariantsRequest(bucket=j.progress[0].bucket, page_size=100),
                                    metadata=kfe2e.client_md())
    assert sum(v.evaluations for v in variants.variants) >= 3, variants
    # The worker keeps its session (and id) across the restart; the held
    # lease expires and the task comes back.
    back = kfe2e.wait_until(lambda: lease(500), timeout=30)
    seen = set()
    while back is not None and back.task_id != held.task_id:
        seen.add(back.task_id)
        assert report(back, 450.0)
        back = lease(3000)
    assert back is not None and back.task_id == held.task_id, "held task did not return to the queue"
    assert report(back, 440.0)
    # Drive the job to the end.
    while True:
        t = lease(3000)
        if t is None:
            j = kernels.GetJob(pb.GetJobRequest(job_id=job.id), metadata=kfe2e.client_md())
            if j.state != pb.JOB_STATE_RUNNING:
                break
            continue
        assert report(t, 400.0)
    assert j.state == pb.JOB_STATE_SUCCEEDED, j
    assert sum(p.evaluated for p in j.progress) == sum(p.proposed for p in j.progress), j
    k = kernels.GetKernel(pb.GetKernelRequest(shape=shape), metadata=kfe2e.client_md())
    assert k.kernel.tuned, k.kernel
    rc = server.terminate()
    assert rc == 0, "server exit status %s" % rc
    con = sqlite3.connect(db)
    assert con.execute("pragma integrity_check").fetchone()[0] == "ok"
    print("OK: job", job.id, "survived kill -9;", j.progress[0].evaluated, "evaluations")


if __name__ == "__main__":
    main()

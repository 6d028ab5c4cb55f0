"""The model loop end to end without a GPU: the real kforge-server with the
model proposer pointed at a scripted model on loopback (scripted_model.py),
and a real kforge-worker in compile-only mode (NVRTC for sm_100a). The
scripted model answers with real edits of the seed kernel: knob edits, an
injected compile error, a comment-only change, a refused #include and a
semantic bug. Checked, from the store and from what the model received:

  - the endpoint's refusal of max_tokens is learned, not a failure;
  - repairs carry the failing source and its diagnostics (the NVRTC log of
    a compile error; the static check's reason for a refused draft), and no
    task seed;
  - dedupe: the comment-only change is never compiled, and no two variants
    of a job normalize to the same source;
  - provenance: every model variant has its model, prompt, answer, kind,
    attempt and parent, and the model call that wrote it; every call is in
    the ledger with its parent, and a repair's parent is what it repaired;
  - spend: a job's token limit and the server's hold (the server's across a
    restart, from the ledger in the store);
  - a restart (SIGKILL mid-job) replays: the job finishes, nothing is
    proposed twice, no failure is repaired twice.

usage: agent_loop_test.py <kforge-server> <repo root> <kforge-worker>
"""
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time

import kfe2e
from scripted_model import ScriptedModel

ARCH = "sm_100a"
# Room for the scripted model's whole-source answers (about 5,600 tokens):
# it cuts an answer off at the request's limit, as an endpoint does.
MAX_TOKENS = 8192


def write_config(path, base_url, **extra):
    model = {"base_url": base_url, "model": "scripted", "api_key_env": "", "max_tokens": MAX_TOKENS,
             "min_completion_tokens": 256, "parallelism": 2, "max_repair_attempts": 2, "max_retries": 0,
             "initial_backoff_ms": 10, "price_prompt_per_mtok": 1.0, "price_completion_per_mtok": 4.0}
    model.update(extra)
    with open(path, "w") as f:
        json.dump({"model_proposer": model}, f)


def shape(pb):
    return pb.Shape(op=pb.OP_FORWARD, dtype=pb.DTYPE_BF16, head_dim=128, heads=4, causal=True, arch=ARCH,
                    batch=8, max_len_q=512, total_q=2000)


def submit(kernels, pb, name, max_variants, max_tokens, seed):
    return kernels.SubmitJob(pb.SubmitJobRequest(name=name, shapes=[shape(pb)], proposer="model",
                                                 compile_only=True, seed=seed,
                                                 budget=pb.Budget(max_variants=max_variants, max_tokens=max_tokens)),
                             metadata=kfe2e.client_md(), timeout=60)


def wait_final(kernels, pb, job_id, timeout=300):
    final = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)
    end = time.time() + timeout
    while time.time() < end:
        j = kernels.GetJob(pb.GetJobRequest(job_id=job_id), metadata=kfe2e.client_md(), timeout=30)
        if j.state in final:
            return j
        time.sleep(0.3)
    raise AssertionError("job %s did not finish: %s" % (job_id, j))


def rows(db, sql, *args):
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql, args).fetchall()]
    finally:
        con.close()


def reserved_per_request(db):
    """The most a request of these prompts reserves: the prompt's bytes / 3
    plus the answer's limit (agent/model_proposer.cc, Reserve)."""
    return max(len(c["prompt"]) // 3 + MAX_TOKENS for c in rows(db, "SELECT prompt FROM model_calls"))


def check_job(db, job_id, max_tokens):
    variants = rows(db, "SELECT * FROM variants WHERE job = ? ORDER BY id", job_id)
    calls = rows(db, "SELECT * FROM model_calls WHERE job = ? ORDER BY id", job_id)
    tasks = rows(db, "SELECT * FROM tasks WHERE job = ? ORDER BY id", int(job_id[1:]))
    evals = {r["variant"]: r for r in rows(db, "SELECT * FROM evaluations WHERE job = ?", job_id)}
    assert variants and calls, (variants, calls)
    by_id = {"v%d" % v["id"]: v for v in variants}
    calls_by_id = {"call%d" % c["id"]: c for c in calls}

    # Provenance of every variant.
    for v in variants:
        assert v["origin"] == "model" and v["model"] and v["prompt"] and v["answer"], v
        assert v["prompt_hash"] == hashlib.sha256(v["prompt"].encode()).hexdigest(), v["id"]
        assert v["kind"] in ("fresh", "repair"), v
        prov = json.loads(v["provenance"])
        call = calls_by_id["call%d" % prov["call_id"]]
        assert call["outcome"] == "candidate" and call["prompt_hash"] == v["prompt_hash"], (v["id"], call)
        assert v["normalized_hash"], v["id"]
        if v["kind"] == "repair":
            assert v["attempt"] >= 1 and prov["repair_of"], v
            # The repair's call names what it repaired.
            assert call["parent"] == prov["repair_of"] and call["purpose"] == "repair", (call, prov)
        else:
            assert v["attempt"] == 0, v

    # Every call is recorded with its parent and a settled outcome.
    for c in calls:
        assert c["outcome"] in ("candidate", "refused", "duplicate", "error", "dropped", "lost"), c
        assert c["purpose"] in ("propose", "repair") and c["parent"] and c["bucket"], c
    # Calls in flight when the server was killed are "lost", counted at their
    # reserved size; none stays pending after a restart.
    for c in calls:
        if c["outcome"] == "lost":
            assert c["completion_tokens"] == MAX_TOKENS or c["completion_tokens"] > 0, c

    # Dedupe: one task per variant, no two variants with one normalized source.
    assert len(tasks) == len(variants), (len(tasks), len(variants))
    norm = [v["normalized_hash"] for v in variants]
    assert len(set(norm)) == len(norm), "two variants of one job normalize to the same source"

    # Spend: the ledger sums to the job's tokens and stays within its limit.
    spent = sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls)
    job = rows(db, "SELECT tokens_used FROM jobs WHERE id = ?", int(job_id[1:]))[0]
    assert job["tokens_used"] == spent, (job, spent)
    if max_tokens:
        assert spent <= max_tokens, (spent, max_tokens)
    return variants, calls, tasks, evals, by_id, calls_by_id


def main():
    server_bin, repo, worker_bin = sys.argv[1:4]
    work = kfe2e.tempdir()
    kfe2e.generate_stubs(repo, os.path.join(work, "gen"))
    from kforge.v1 import kforge_pb2 as pb
    from kforge.v1 import kforge_pb2_grpc as rpc

    model = ScriptedModel(delay_s=0.25)
    base = model.start()
    config = os.path.join(work, "server.json")
    write_config(config, base)
    db = os.path.join(work, "kforge.db")
    port = kfe2e.free_port()
    server = kfe2e.ServerProcess(server_bin, db, port, ["--config", config, "--lease-ttl-ms", "4000", "--heartbeat-ms", "1000"])
    channel = server.start()
    kernels = rpc.KernelServiceStub(channel)
    env = dict(os.environ, KFORGE_WORKER_TOKEN=kfe2e.WORKER_TOKEN)
    worker_log = open(os.path.join(work, "worker.log"), "ab")
    worker = subprocess.Popen(
        [worker_bin, "--server", server.address, "--compile-only", "--arch", ARCH, "--name", "cpu0",
         "--cache-dir", os.path.join(work, "cache"), "--compile-threads", "2", "--lease-wait-ms", "500"],
        stdout=worker_log, stderr=subprocess.STDOUT, env=env)
    try:
        # ---- job 1: the rotation, with a SIGKILL of the server mid-job
        job = submit(kernels, pb, "agent-loop", max_variants=12, max_tokens=5_000_000, seed=5)
        job_id = job.id
        assert kfe2e.wait_until(lambda: len(rows(db, "SELECT id FROM variants WHERE job = ?", job_id)) >= 4,
                                timeout=180), "the job made no progress"
        before = rows(db, "SELECT id, normalized_hash FROM variants WHERE job = ?", job_id)
        server.kill9()
        sent_before_kill = len(model.requests)
        channel = server.start()
        kernels = rpc.KernelServiceStub(channel)
        j = wait_final(kernels, pb, job_id)
        log = open(server.log).read()
        assert j.state == pb.JOB_STATE_SUCCEEDED, (j, log[-3000:], open(os.path.join(work, "worker.log")).read()[-2000:])
        variants, calls, tasks, evals, by_id, calls_by_id = check_job(db, job_id, 5_000_000)
        assert len(variants) > len(before), "nothing was proposed after the restart"
        assert len(variants) == 12, len(variants)

        # The max_tokens refusal was learned at the first request: it was sent
        # again at once as max_completion_tokens, and so was everything after
        # (requests already in flight then went as they were).
        first = model.requests[0]
        assert "max_tokens" in first, list(first)
        retry = next(i for i, r in enumerate(model.requests) if "max_completion_tokens" in r)
        assert retry <= 2, retry
        assert all("max_tokens" not in r for r in model.requests[retry + 2:sent_before_kill])
        # (Learned per client: the restarted server's client starts over, and
        # this endpoint refuses only once.)

        # Repairs of compile errors: the failing source and the NVRTC log.
        task_seeds = {str(t["seed"]) for t in tasks} | {str(t["seed"] & (2**64 - 1)) for t in tasks}
        compile_repairs = 0
        for v in variants:
            if v["kind"] != "repair":
                continue
            prov = json.loads(v["provenance"])
            failed = by_id.get(prov["repair_of"])
            if failed is None:
                continue  # a refused draft's repair: checked below
            compile_repairs += 1
            e = evals[failed["id"]]
            assert e["outcome"] == "compile_error", e
            assert failed["source"] in v["prompt"] or json.dumps(failed["source"])[1:-1] in v["prompt"], \
                "the repair prompt lacks the failing source"
            assert "undefined_symbol_" in e["message"], e["message"][:500]
            assert "is undefined" in v["prompt"], "the repair prompt lacks the compile log"
            for seed in task_seeds:
                assert seed not in v["prompt"], "a task seed reached a prompt"
        assert compile_repairs >= 1, [(v["kind"], v["provenance"]) for v in variants]
        # The repaired ones compiled.
        repaired_ok = [v for v in variants if v["kind"] == "repair" and evals[v["id"]]["outcome"] == "compiled"]
        assert repaired_ok, [(v["id"], evals[v["id"]]["outcome"]) for v in variants if v["kind"] == "repair"]

        # Refused drafts: recorded, and repaired with their source and reason.
        refused = [c for c in calls if c["outcome"] == "refused"]
        includes = [c for c in refused if "#include <stdio.h>" in c["answer"]]
        assert includes, [(c["id"], c["detail"][:100]) for c in refused]
        for r in refused:
            fixes = [c for c in calls if c["parent"] == "call%d" % r["id"]]
            if r["attempt"] >= 2:
                assert not fixes, "a draft was repaired past the attempt limit"
                continue
            assert fixes, "refused call %d was not repaired: %s" % (r["id"], r["detail"])
            body = json.loads(fixes[0]["prompt"])[-1]["content"]
            reason = r["detail"].split("refused: ", 1)[1]
            assert reason[:60] in body.split("Diagnostics:")[1], "the repair lacks the refusal's reason"
            assert fixes[0]["attempt"] == r["attempt"] + 1, (fixes[0], r)
            if r in includes:
                assert "#include <stdio.h>" in body, "the repair lacks the refused source"
        # and the include drafts were repaired into candidates
        assert any(c["outcome"] == "candidate" and c["parent"] == "call%d" % r["id"] for r in includes for c in calls)

        # Comment-only changes: refused as duplicates, never a task.
        # (Two requests in flight on the same parent can also get the same
        # scripted answer: an exact duplicate, refused the same way.)
        dups = [c for c in calls if c["outcome"] == "duplicate"]
        assert dups, [c["outcome"] for c in calls]
        assert any("apart from comments and whitespace" in c["detail"] for c in dups), [c["detail"] for c in dups]
        for c in dups:
            assert ("apart from comments and whitespace" in c["detail"]
                    or "identical to one proposed before" in c["detail"]), c["detail"]

        # A restart replays: no failure repaired twice.
        repaired_parents = [json.loads(v["provenance"]).get("repair_of") for v in variants if v["kind"] == "repair"]
        assert len(repaired_parents) == len(set(repaired_parents)), repaired_parents

        # ---- job 2: a small token budget ends the job, not the bucket in error
        spent_before = sum(c["prompt_tokens"] + c["completion_tokens"] for c in rows(db, "SELECT * FROM model_calls"))
        # Room for about three requests at their reserved size, so that two
        # whole answers fit (one draw of the rotation alone may give no
        # variant); a request sized down to the spend left gets an answer cut
        # off there (scripted_model.py), so the spend stays within the limit
        # however the answers fall.
        job2_tokens = 3 * reserved_per_request(db)
        job2 = submit(kernels, pb, "budget", max_variants=50, max_tokens=job2_tokens, seed=6)
        j2 = wait_final(kernels, pb, job2.id)
        assert j2.state == pb.JOB_STATE_SUCCEEDED, j2
        v2 = check_job(db, job2.id, job2_tokens)[0]
        assert 0 < len(v2) < 50, "the token budget, not the variant budget, ended the job: %d" % len(v2)

        # ---- job 3: the server's limit, after a restart with a lower one
        total = sum(c["prompt_tokens"] + c["completion_tokens"] for c in rows(db, "SELECT * FROM model_calls"))
        assert total > spent_before
        # Room for about four requests at their reserved size: the job needs
        # a refused draft and its repair at least, and a fixed margin stopped
        # fitting them once the prompts (the contract, the parent's source)
        # grew.
        limit = total + 4 * reserved_per_request(db)
        write_config(config, base, server_max_tokens=limit)
        server.terminate()
        channel = server.start()
        kernels = rpc.KernelServiceStub(channel)
        job3 = submit(kernels, pb, "server-budget", max_variants=50, max_tokens=0, seed=7)
        j3 = wait_final(kernels, pb, job3.id)
        assert j3.state == pb.JOB_STATE_SUCCEEDED, j3
        v3 = check_job(db, job3.id, 0)[0]
        after = sum(c["prompt_tokens"] + c["completion_tokens"] for c in rows(db, "SELECT * FROM model_calls"))
        assert after <= limit, (after, limit)
        assert len(v3) < 50, "the server's budget ended the job: %d variants" % len(v3)
    except BaseException:
        report_failure(db, server.log, os.path.join(work, "worker.log"))
        raise
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.terminate()
        model.stop()
    print("agent_loop: ok (%d model requests)" % len(model.requests))


def report_failure(db, server_log, worker_log):
    """What a failed run leaves for the reader of a CI log, which shows the
    test's output and nothing of its temp directory: each job's end, each
    job's calls by outcome, and the logs' last lines."""
    try:
        for j in rows(db, "SELECT id, name, state, message, tokens_used FROM jobs ORDER BY id"):
            print("job", j, file=sys.stderr)
        for c in rows(db, "SELECT job, purpose, outcome, attempt, COUNT(*) AS n FROM model_calls "
                          "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"):
            print("calls", c, file=sys.stderr)
    except Exception as e:  # the store itself may be what failed
        print("could not read the store:", e, file=sys.stderr)
    for name, path in (("server", server_log), ("worker", worker_log)):
        try:
            print("---- %s log, last lines:\n%s" % (name, open(path, errors="replace").read()[-4000:]),
                  file=sys.stderr)
        except OSError as e:
            print("no %s log: %s" % (name, e), file=sys.stderr)


if __name__ == "__main__":
    main()

"""The kforge CLI against the real kforge-server: get (table, --json, --out),
tune with a shapes file and a progress display until the job ends, jobs
list/show/cancel (and what a job without a worker waits for), variants,
shapes, workers (with a real kforge-worker), --json state names, the default
--arch, --version of every binary, and the unreachable-server message.

usage: cli_test.py <kforge-server binary> <repo root> <kforge binary> <kforge-worker binary>
"""
import json
import os
import re
import subprocess
import sys
import time

import kfe2e


def run(cli, server, *args, ok=True):
    env = dict(os.environ, KFORGE_TOKEN=kfe2e.CLIENT_TOKEN)
    p = subprocess.run([cli, "--server", server] + list(args), capture_output=True, text=True,
                       env=env, timeout=240)
    if ok and p.returncode != 0:
        raise AssertionError("kforge %s failed (%d): %s %s" % (args, p.returncode, p.stdout, p.stderr))
    return p


def main():
    binary, repo, cli, worker_bin = sys.argv[1:5]
    work = kfe2e.tempdir()
    # --version: every binary prints the project(VERSION) of CMakeLists.txt
    # and exits 0, with no server and no other flag needed.
    version = re.search(r"project\(kforge VERSION ([0-9.]+)",
                        open(os.path.join(repo, "CMakeLists.txt")).read()).group(1)
    for b, name in ((cli, "kforge"), (binary, "kforge-server"), (worker_bin, "kforge-worker")):
        p = subprocess.run([b, "--version"], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and p.stdout.strip() == "%s %s" % (name, version), \
            (b, p.returncode, p.stdout, p.stderr)
    p = run(cli, "127.0.0.1:1", "shapes", ok=False)
    assert p.returncode == 1 and "cannot reach kforge-server at 127.0.0.1:1" in p.stderr, p.stderr

    server = kfe2e.ServerProcess(binary, os.path.join(work, "kforge.db"), kfe2e.free_port())
    server.start()
    addr = server.address
    shape = ["--head-dim", "128", "--heads", "4", "--causal", "--batch", "8",
             "--max-len-q", "1024", "--total-q", "6000"]
    p = run(cli, addr, "get", *shape, "--out", os.path.join(work, "k"))
    assert "tuned        no" in p.stdout and "(seed default)" in p.stdout, p.stdout
    assert os.path.getsize(os.path.join(work, "k", "kernel.cu")) > 0
    assert json.load(open(os.path.join(work, "k", "manifest.json")))["entry_point"]
    p = run(cli, addr, "--json", "get", *shape)
    assert json.loads(p.stdout)["kernel"]["requested_bucket"].startswith("fwd.bf16.d128.h4"), p.stdout
    # No --arch: the local GPU's, and sm_90a on this machine, which has none.
    assert ".sm_90a." in json.loads(p.stdout)["kernel"]["requested_bucket"], p.stdout
    # --json writes defaults (an untuned kernel says tuned: false) and
    # 64-bit integers as numbers, not proto3 JSON's strings.
    got = json.loads(p.stdout)
    assert got["kernel"]["tuned"] is False and got["tuning_job_id"] == "", p.stdout
    # Backward shapes are served too: the seed is the key-major backward template.
    p = run(cli, addr, "get", "--op", "bwd", *shape, "--out", os.path.join(work, "kb"))
    assert "tuned        no" in p.stdout, p.stdout
    manifest = json.load(open(os.path.join(work, "kb", "manifest.json")))
    assert manifest["entry_point"] == "kf_attn_bwd" and manifest.get("key_major"), manifest
    # --deterministic: a bucket of its own (".det") served a deterministic
    # backward (bwd_sm90 DET=1 on sm_90a); the forward refuses the flag.
    p = run(cli, addr, "--json", "get", "--op", "bwd", "--deterministic", *shape)
    got = json.loads(p.stdout)["kernel"]
    assert got["requested_bucket"].endswith(".sm_90a.b8.mq1024.aq1024.mk1024.ak1024.det"), p.stdout
    assert json.loads(got["manifest"]["json"]).get("deterministic") is True, got["manifest"]
    # sm_80: bwd_mma DET=1; a head dim no kernel has: refused, saying so.
    p = run(cli, addr, "--json", "get", "--op", "bwd", "--deterministic", *shape, "--arch", "sm_80")
    got = json.loads(p.stdout)["kernel"]
    assert json.loads(got["manifest"]["json"]).get("deterministic") is True, got["manifest"]
    odd = [x if x != "128" or shape[i - 1] != "--head-dim" else "96" for i, x in enumerate(shape)]
    assert odd != shape, shape
    p = run(cli, addr, "get", "--op", "bwd", "--deterministic", *odd, "--arch", "sm_80", ok=False)
    assert p.returncode == 1 and "head_dim: 96 is not supported" in p.stderr, p.stderr
    p = run(cli, addr, "get", "--deterministic", *shape, ok=False)
    assert p.returncode == 1 and "shape.deterministic" in p.stderr, p.stderr
    p = run(cli, addr, "tune", "--op", "bwd", "--deterministic", *shape, "--no-watch", "--json")
    submitted = json.loads(p.stdout)
    assert submitted["shapes"][0]["deterministic"] is True, p.stdout
    assert submitted["progress"][0]["bucket"].endswith(".det"), p.stdout
    run(cli, addr, "jobs", "cancel", submitted["id"])

    with open(os.path.join(work, "lens.json"), "w") as f:
        json.dump([0, 100, 1000, 1500], f)
    p = run(cli, addr, "get", "--head-dim", "64", "--heads", "8",
            "--cu-seqlens-file", os.path.join(work, "lens.json"))
    assert "b4.mq1024" in p.stdout, p.stdout
    p = run(cli, addr, "get", "--head-dim", "100", "--heads", "4", "--batch", "1",
            "--max-len-q", "8", "--total-q", "8", ok=False)
    assert p.returncode == 1 and "shape.head_dim: 100" in p.stderr, p.stderr

    # No worker runs here, so the job ends on its 2 s time budget.
    p = run(cli, addr, "tune", "--shapes", os.path.join(repo, "bench/shapes.json"),
            "--max-variants", "4", "--max-seconds", "2", "--name", "cli")
    assert "submitted job" in p.stdout and "evaluated" in p.stdout, p.stdout
    assert "state=succeeded" in p.stdout and "time budget" in p.stdout, p.stdout
    # With stdout to a file, each progress line is there while the job still
    # runs (flushed per line, not when the process exits).
    out_path = os.path.join(work, "tune.out")
    with open(out_path, "w") as out:
        proc = subprocess.Popen([cli, "--server", addr, "tune", *shape, "--max-variants", "4",
                                 "--max-seconds", "6", "--name", "to-file"], stdout=out,
                                stderr=subprocess.STDOUT,
                                env=dict(os.environ, KFORGE_TOKEN=kfe2e.CLIENT_TOKEN))
        try:
            seen = ""
            deadline = time.time() + 4
            while time.time() < deadline and "evaluated" not in seen:
                time.sleep(0.1)
                seen = open(out_path).read()
            assert proc.poll() is None, "the job ended before the check: " + seen
            assert "submitted job" in seen and "0/4 evaluated" in seen, seen
        finally:
            assert proc.wait(timeout=60) == 0, open(out_path).read()
    assert "state=succeeded" in open(out_path).read()
    # A shapes file with exact lengths (bench/attention/lengths.py's output):
    # the job's buckets come from the offsets; bad lengths name the shape.
    with open(os.path.join(work, "exact.json"), "w") as f:
        json.dump([{"name": "x", "B": 3, "H": 4, "D": 64, "q": {"dist": "fixed", "hi": 9},
                    "kv": {"dist": "fixed", "hi": 9}, "causal": False,
                    "lq": [500, 0, 1000], "lk": [20, 30, 40]}], f)
    p = run(cli, addr, "tune", "--shapes", os.path.join(work, "exact.json"), "--no-watch", "--json")
    buckets = [s["bucket"] for s in json.loads(p.stdout)["progress"]]
    assert buckets and ".cross." in buckets[0] and ".b4.mq1024." in buckets[0] \
        and ".mk64." in buckets[0], p.stdout
    run(cli, addr, "jobs", "cancel", json.loads(p.stdout)["id"])
    with open(os.path.join(work, "bad.json"), "w") as f:
        json.dump([{"B": 2, "H": 4, "D": 64, "kv": "same", "lq": [5, -1]}], f)
    p = run(cli, addr, "tune", "--shapes", os.path.join(work, "bad.json"), ok=False)
    assert p.returncode == 2 and "shape 0: lq has a negative length" in p.stderr, p.stderr
    p = run(cli, addr, "tune", *shape, "--no-watch", "--json")
    job_id = json.loads(p.stdout)["id"]
    p = run(cli, addr, "jobs")
    assert job_id in p.stdout and "cli" in p.stdout, p.stdout
    listed = json.loads(run(cli, addr, "--json", "jobs").stdout)["jobs"]
    for j in listed:
        assert type(j["tokens_used"]) is int and type(j["seed"]) is int, j
        # The tables' state names, not the enum's JOB_STATE_RUNNING.
        assert j["state"] in ("running", "succeeded", "cancelled"), j
        assert j["compile_only"] is False and j["message"] is not None, j
        assert all(type(p["proposed"]) is int for p in j["progress"]), j
    shape_sizes = listed[0]["shapes"][0]
    assert type(shape_sizes["batch"]) is int and type(shape_sizes["total_q"]) is int, shape_sizes
    # No worker at all: the job says what it waits for (checked once a
    # second), in `jobs show`, the jobs table and --json.
    p = kfe2e.wait_until(lambda: (lambda r: r if "waiting:" in r.stdout else None)(
        run(cli, addr, "jobs", "show", job_id)), timeout=30)
    assert p, "the job never said it was waiting"
    assert "state=running" in p.stdout, p.stdout
    assert "waiting: waiting for a GPU worker of arch sm_90a" in p.stdout, p.stdout
    row = [l for l in run(cli, addr, "jobs").stdout.splitlines() if l.startswith(job_id + " ")]
    assert row and row[0].endswith("waiting for a GPU worker of arch sm_90a"), row
    got = json.loads(run(cli, addr, "--json", "jobs", "show", job_id).stdout)
    assert got["waiting_for"] == "waiting for a GPU worker of arch sm_90a", got
    p = run(cli, addr, "jobs", "cancel", job_id)
    assert "state=cancelled" in p.stdout, p.stdout
    p = run(cli, addr, "jobs", "show", "j424242", ok=False)
    assert p.returncode == 1 and "not found" in p.stderr.lower(), p.stderr
    p = run(cli, addr, "variants", "--limit", "5")
    assert p.stdout.count("\n") == 6, p.stdout
    p = run(cli, addr, "shapes")
    assert p.stdout.startswith("BUCKET"), p.stdout
    p = run(cli, addr, "--json", "shapes")
    json.loads(p.stdout)

    # Workers: none yet; then a real compile-only worker (no CUDA driver
    # here) over loopback, listed as connected once it has registered.
    p = run(cli, addr, "--json", "workers")
    assert json.loads(p.stdout).get("workers", []) == [], p.stdout
    env = dict(os.environ, KFORGE_WORKER_TOKEN=kfe2e.WORKER_TOKEN)
    worker_log = open(os.path.join(work, "worker.log"), "wb")
    worker = subprocess.Popen(
        [worker_bin, "--server", addr, "--compile-only", "--arch", "sm_100a", "--name", "cli-w0",
         "--cache-dir", os.path.join(work, "cache"), "--compile-threads", "1"],
        stdout=worker_log, stderr=subprocess.STDOUT, env=env)
    try:
        listed = []
        deadline = time.time() + 60
        while not listed and time.time() < deadline:
            listed = json.loads(run(cli, addr, "--json", "workers").stdout).get("workers", [])
            time.sleep(0.2)
        assert len(listed) == 1, (listed, open(os.path.join(work, "worker.log")).read()[-2000:])
        w = listed[0]
        assert w["name"] == "cli-w0" and w["arch"] == "sm_100a" and w["compile_only"], w
        assert w["state"] == "connected" and w["last_seen"], w
        # It takes compile tasks for every arch its NVRTC compiles for.
        assert "sm_90a" in w["compile_archs"] and "sm_100a" not in w["compile_archs"], w
        assert w["principal"], w
        assert type(w["last_seen_unix_ms"]) is int and w["last_seen_unix_ms"] > 0, w
        assert type(w["gpu"]["memory_bytes"]) is int, w
        p = run(cli, addr, "workers")
        header, row = p.stdout.splitlines()
        assert header.split()[:5] == ["ID", "NAME", "ARCH", "KIND", "STATE"], p.stdout
        assert row.split()[:5] == [w["id"], "cli-w0", "sm_100a", "compile", "connected"], p.stdout
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert server.terminate() == 0
    print("OK: kforge CLI")


if __name__ == "__main__":
    main()

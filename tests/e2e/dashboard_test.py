"""The operators' dashboard and /metrics of the real kforge-server, in a real
browser (Chromium driven by Selenium, both from Debian's packages).

The server holds the data of two tuning runs made here: a compile-only job
for sm_100a run by a real kforge-worker (no GPU on this machine; it waits
for a worker first, which the dashboard shows), and a job for sm_90a run by
a scripted GPU worker over the real gRPC API (verified timings, promotions,
a best, an anchor to compare it with). Every page is opened, its numbers
are compared with what the gRPC API and the SQLite file say, and the
browser's console must stay free of errors. /metrics is parsed with
prometheus_client's parser and checked by a strict reading of the text
format of our own, and its figures compared with the store.

usage: dashboard_test.py <kforge-server> <repo root> <kforge> <kforge-worker>
"""
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

import kfe2e

VIEWER_TOKEN = "e2e-viewer-token-0123456789abcdef012345"
# The sm_90a job's shape and the bucket it falls into (core/shape.h Bucket::Id).
GPU_BUCKET = "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b16.mq2048.aq2048.mk2048.ak2048"
ANCHOR_US = 900.0


def http_get(url, token=None, method="GET"):
    req = urllib.request.Request(url, method=method, data=b"x" if method == "POST" else None)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


# ------------------------------------------------------------ /metrics ---

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def strict_parse(text):
    """Our own strict reading of the text format: every sample belongs to a
    family announced by HELP and TYPE lines before it, families are not
    interleaved, series are unique, values parse, histograms are cumulative
    with +Inf equal to _count. Returns {(name, frozenset(labels)): value}."""
    assert text.endswith("\n"), "the text must end with a newline"
    types, helps, series, done = {}, set(), {}, set()
    current = None
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert name not in helps, "line %d: second HELP for %s" % (n, name)
            helps.add(name)
            if current:
                done.add(current)
            current = name
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and name not in types, "line %d: TYPE out of place" % n
            assert kind in ("counter", "gauge", "histogram"), line
            types[name] = kind
            continue
        assert not line.startswith("#") and line, "line %d: unexpected %r" % (n, line)
        m = SAMPLE.match(line)
        assert m, "line %d: not a sample: %r" % (n, line)
        name, _, labels_text, value = m.groups()
        family = name
        if types.get(current) == "histogram":
            family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert family == current and current in types, "line %d: %s outside its family" % (n, name)
        assert family not in done, "line %d: family %s interleaved" % (n, family)
        labels = {}
        rest = labels_text or ""
        while rest:
            lm = LABEL.match(rest)
            assert lm, "line %d: bad labels %r" % (n, labels_text)
            labels[lm.group(1)] = lm.group(2)
            rest = rest[lm.end():]
        v = float(value.replace("+Inf", "inf"))
        assert not math.isnan(v), line
        key = (name, frozenset(labels.items()))
        assert key not in series, "line %d: duplicate series %s" % (n, line)
        series[key] = v
    # Histograms: cumulative buckets, +Inf bucket == _count.
    buckets = {}
    for (name, labels), v in series.items():
        if name.endswith("_bucket"):
            base = dict(labels)
            le = float(base.pop("le").replace("+Inf", "inf"))
            buckets.setdefault((name[:-len("_bucket")], frozenset(base.items())), []).append((le, v))
    for (name, base), points in buckets.items():
        points.sort()
        assert points[-1][0] == math.inf, (name, base)
        assert points[-1][1] == series[(name + "_count", base)], (name, base)
        assert all(a[1] <= b[1] for a, b in zip(points, points[1:])), ("not cumulative", name, base)
    return series


def check_metrics(text, db, counts):
    from prometheus_client.parser import text_string_to_metric_families
    families = {f.name: f for f in text_string_to_metric_families(text)}
    series = strict_parse(text)

    def value(metric, **labels):
        return series.get((metric, frozenset(labels.items())))

    assert families["kforge_rpc_duration_seconds"].type == "histogram"
    assert families["kforge_jobs"].type == "gauge"
    assert value("kforge_jobs", state="succeeded") == 2, text
    assert value("kforge_jobs", state="running") == 0
    assert value("kforge_tasks_queued") == 0 and value("kforge_tasks_leased") == 0
    con = sqlite3.connect(db)
    for kind, outcome, n in con.execute(
            "SELECT t.kind, e.outcome, COUNT(*) FROM evaluations e JOIN tasks t "
            "ON 't' || t.id = e.task GROUP BY 1, 2"):
        assert value("kforge_evaluations_total", kind=kind, outcome=outcome) == n, (kind, outcome, n)
    reports = con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    assert value("kforge_rpc_duration_seconds_count", method="kforge.v1.WorkerService/ReportResult",
                 code="OK") == reports, reports
    assert value("kforge_rpc_duration_seconds_count", method="kforge.v1.KernelService/SubmitJob",
                 code="OK") == 2
    assert value("kforge_compile_duration_seconds_count") == counts["compile_reports"]
    assert value("kforge_promotions_total") == counts["promotions"] >= 1
    assert value("kforge_workers", arch="sm_90a", state="connected", kind="gpu") == 1
    assert value("kforge_workers", arch="sm_90a", state="connected", kind="compile") == 1
    assert value("kforge_tuned_buckets", arch="sm_90a") == 1
    assert value("kforge_model_tokens_total", proposer="builtin") == 0
    page_count = con.execute("PRAGMA page_count").fetchone()[0]
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    assert value("kforge_database_bytes") == page_count * page_size
    assert value("kforge_build_info", version=counts["version"]) == 1
    assert value("kforge_verified_variants_last_minute") >= 1
    assert value("kforge_worker_gpu_utilization_ratio", worker=counts["gpu_worker"],
                 name="scripted-h200", arch="sm_90a") == 0.37
    assert value("kforge_worker_gpu_memory_used_bytes", worker=counts["gpu_worker"],
                 name="scripted-h200", arch="sm_90a") == 41 << 30


# ------------------------------------------------------------- browser ---

def server_events(path):
    """--log-format json: every line of the server's log is a JSON object."""
    out = []
    for n, line in enumerate(open(path), 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError("%s:%d is not JSON: %r" % (path, n, line))
    return out


def check_logs(events, worker_log, gpu_job, compile_job, scripted_worker):
    for e in events:
        assert set(e) >= {"ts", "level", "pid", "thread", "msg"}, e
    by = lambda name: [e for e in events if e.get("event") == name]
    submitted = {e["job"] for e in by("job_submitted")}
    assert submitted == {gpu_job, compile_job}, submitted
    finished = {e["job"]: e for e in by("job_finished")}
    assert finished[gpu_job]["state"] == "succeeded" and finished[compile_job]["state"] == "succeeded"
    assert [e["waiting_for"] for e in by("job_waiting")] == ["waiting for a worker of arch sm_100a"], by("job_waiting")
    # Unblocked once a worker for it joins, unless the job's last task
    # finished before the engine's next look (then job_finished says it).
    assert [e["job"] for e in by("job_unblocked")] in ([compile_job], []), by("job_unblocked")
    joined = {e["worker"]: e for e in by("worker_joined")}
    assert joined[scripted_worker]["sanitizer_tools"] == ["memcheck"], joined
    assert any("sm_100a" in e["compile_archs"] for e in joined.values()), joined
    promotions = by("promotion")
    assert promotions and all(e["bucket"] == GPU_BUCKET and e["median_us"] > 0 for e in promotions)
    assert not by("job_cancelled")
    # The worker's log is JSON lines too.
    lines = open(worker_log).read().splitlines()
    assert lines, "the worker logged nothing"
    for line in lines:
        assert json.loads(line)["msg"], line


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-component-update"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


class Page:
    def __init__(self, driver, base):
        self.d, self.base = driver, base
        self.console = []

    def open(self, hash_):
        from selenium.webdriver.support.ui import WebDriverWait
        # Forget the page drawn last, so the wait is for this one; going to
        # the URL already shown would change nothing, so that is a reload.
        self.d.execute_script("const v = document.getElementById('view'); if (v) v.dataset.loaded = ''")
        url = self.base + "/" + hash_
        if self.d.current_url == url:
            self.d.refresh()
        else:
            self.d.get(url)
        WebDriverWait(self.d, 30).until(
            lambda d: d.find_element("id", "view").get_attribute("data-loaded") == hash_
            or d.find_elements("id", "error"))
        errors = self.d.find_elements("id", "error")
        assert not errors, "%s: %s" % (hash_, errors[0].text)
        self.check_console(hash_)
        # To look at the pages: KFORGE_DASHBOARD_SCREENSHOTS=<dir>.
        shots = os.environ.get("KFORGE_DASHBOARD_SCREENSHOTS")
        if shots:
            os.makedirs(shots, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9]+", "_", hash_).strip("_")[:60] or "root"
            self.d.save_screenshot(os.path.join(shots, name + ".png"))

    def check_console(self, where):
        logs = self.d.get_log("browser")
        self.console += logs
        bad = [l for l in logs if l["level"] in ("SEVERE", "ERROR")]
        assert not bad, "console errors on %s: %s" % (where, bad)

    def css(self, sel):
        return self.d.find_elements("css selector", sel)

    def text(self, sel, sub=None, index=0):
        """The text of the index-th element matching sel (or of the first
        element matching sub inside it). The page re-renders on its refresh
        timer, so an element found here can be replaced before its text is
        read (seen in CI, for cards and for table rows): every read looks the
        element up again, and once more when it went stale. Hold selectors,
        not elements."""
        from selenium.common.exceptions import StaleElementReferenceException
        for attempt in range(5):
            found = self.css(sel)
            assert len(found) > index, "nothing matches %s [%d] on %s" % (
                sel, index, self.d.current_url)
            try:
                el = found[index]
                return el.find_element("css selector", sub).text if sub else el.text
            except StaleElementReferenceException:
                if attempt == 4:
                    raise
                time.sleep(0.1)


def number(text):
    return float(re.search(r"[-0-9.]+", text).group(0))


def us_text(v):
    """The dashboard's us() formatting."""
    return "%.3f ms" % (v / 1000) if v >= 1000 else "%.1f \u00b5s" % v


def main():
    server_bin, repo, cli, worker_bin = sys.argv[1:5]
    work = kfe2e.tempdir()
    kfe2e.generate_stubs(repo, os.path.join(work, "gen"))
    from kforge.v1 import kforge_pb2 as pb
    from kforge.v1 import kforge_pb2_grpc as rpc

    db = os.path.join(work, "kforge.db")
    anchors = os.path.join(work, "anchors.json")
    with open(anchors, "w") as f:
        json.dump([{"bucket": GPU_BUCKET, "name": "varlen_attn", "us": ANCHOR_US}], f)
    config = os.path.join(work, "server.json")
    with open(config, "w") as f:
        json.dump({"anchors_file": anchors}, f)
    http_port = kfe2e.free_port()
    # The viewer token in the environment: the server takes none from flags.
    server = kfe2e.ServerProcess(server_bin, db, kfe2e.free_port(),
                                 ["--config", config, "--http-port", str(http_port),
                                  "--log-format", "json"],
                                 env=dict(os.environ, KFORGE_VIEWER_TOKEN=VIEWER_TOKEN))
    ch = server.start()
    base = "http://127.0.0.1:%d" % http_port
    kernels, workers = rpc.KernelServiceStub(ch), rpc.WorkerServiceStub(ch)
    md = kfe2e.client_md()
    env = dict(os.environ, KFORGE_WORKER_TOKEN=kfe2e.WORKER_TOKEN, KFORGE_TOKEN=kfe2e.CLIENT_TOKEN)
    version = re.search(r"project\(kforge VERSION ([0-9.]+)",
                        open(os.path.join(repo, "CMakeLists.txt")).read()).group(1)

    # Access: a client or a viewer token; not a worker token, not none.
    for token, want in ((None, 401), (kfe2e.WORKER_TOKEN, 401), ("x" * 30, 401),
                        (kfe2e.CLIENT_TOKEN, 200), (VIEWER_TOKEN, 200)):
        for path in ("/metrics", "/api/overview"):
            status, headers, _ = http_get(base + path, token)
            assert status == want, (path, token, status)
    status, headers, body = http_get(base + "/")
    assert status == 200 and "<script src=\"/app.js\"></script>" in body
    assert "default-src 'none'" in headers["Content-Security-Policy"], headers
    assert http_get(base + "/api/jobs", VIEWER_TOKEN, method="POST")[0] == 405
    assert json.loads(http_get(base + "/api/auth")[2]) == {"open": False}
    assert http_get(base + "/api/bucket?id=nonsense", VIEWER_TOKEN)[0] == 400

    d = browser()
    worker = None
    try:
        page = Page(d, base)
        # The page asks for a token, keeps it for the tab, and loads.
        d.get(base + "/")
        from selenium.webdriver.support.ui import WebDriverWait
        WebDriverWait(d, 30).until(lambda d: d.find_element("id", "login").is_displayed())
        d.find_element("id", "token").send_keys(VIEWER_TOKEN)
        d.find_element("id", "token-submit").click()
        WebDriverWait(d, 30).until(
            lambda d: d.find_element("id", "view").get_attribute("data-loaded") == "#/overview")
        assert d.execute_script("return sessionStorage.getItem('kforge-token')") == VIEWER_TOKEN
        page.check_console("login")

        # Run 1: compile-only for sm_100a, submitted before any worker runs:
        # the dashboard says what it waits for.
        compile_job = kernels.SubmitJob(pb.SubmitJobRequest(
            name="b200-compile", compile_only=True, seed=5, budget=pb.Budget(max_variants=2),
            shapes=[pb.Shape(op=pb.OP_FORWARD, dtype=pb.DTYPE_BF16, head_dim=128, heads=4,
                             arch="sm_100a", batch=8, max_len_q=512, total_q=2000)]),
            metadata=md, timeout=30)
        waiting = kfe2e.wait_until(lambda: kernels.GetJob(pb.GetJobRequest(job_id=compile_job.id),
                                                          metadata=md).waiting_for, timeout=30)
        assert waiting == "waiting for a worker of arch sm_100a", waiting
        page.open("#/overview")
        assert "waiting for a worker of arch sm_100a" in page.text("#waiting"), page.text("#waiting")
        page.open("#/jobs")
        assert page.text('tr[data-job="%s"] [data-k="waiting"]' % compile_job.id) == waiting

        worker_log = open(os.path.join(work, "worker.log"), "wb")
        worker = subprocess.Popen(
            [worker_bin, "--server", server.address, "--compile-only", "--name", "cpu0",
             "--cache-dir", os.path.join(work, "cache"), "--compile-threads", "2",
             "--log-format", "json"],
            stdout=worker_log, stderr=subprocess.STDOUT, env=env)
        p = subprocess.run([cli, "--server", server.address, "jobs", "watch", compile_job.id],
                           capture_output=True, text=True, env=env, timeout=400)
        assert p.returncode == 0 and "state=succeeded" in p.stdout, \
            (p.stdout, p.stderr, open(os.path.join(work, "worker.log")).read()[-3000:])

        # Run 2: sm_90a, a scripted GPU worker with the memcheck gate.
        shape = pb.Shape(op=pb.OP_FORWARD, dtype=pb.DTYPE_BF16, head_dim=128, heads=4, causal=True,
                         arch="sm_90a", batch=16, max_len_q=2048, total_q=16 * 1500)
        gpu_job = kernels.SubmitJob(pb.SubmitJobRequest(name="h200-tune", shapes=[shape], seed=3,
                                                        budget=pb.Budget(max_variants=6)),
                                    metadata=md, timeout=30)
        assert gpu_job.progress[0].bucket == GPU_BUCKET, gpu_job.progress
        reg = workers.Register(pb.RegisterRequest(
            worker_name="scripted-h200", sanitizer_tools=["memcheck"],
            gpu=pb.GpuInfo(name="NVIDIA H200", arch="sm_90a", compute_capability="9.0",
                           sm_count=132, nvrtc_version="13.0")),
            metadata=kfe2e.worker_md())
        session = reg.session_token
        times = {}  # variant -> its (scripted) time
        n = 0
        while True:
            r = workers.LeaseTask(pb.LeaseTaskRequest(wait_ms=2000),
                                  metadata=kfe2e.worker_md(session), timeout=30)
            if not r.HasField("task"):
                if kernels.GetJob(pb.GetJobRequest(job_id=gpu_job.id), metadata=md).state != \
                        pb.JOB_STATE_RUNNING:
                    break
                continue
            t = r.task
            v = t.variant.variant_id
            times.setdefault(v, 700.0 - 40 * len(times))
            us = times[v]
            n += 1
            cubin = b"scripted-cubin-" + v.encode()
            comp = pb.CompileReport(compile_ms=900 + n, registers=96 + n, static_smem_bytes=0,
                                    dynamic_smem_bytes=49152, cubin=cubin)
            if t.kind == pb.TASK_KIND_EVALUATE and len(times) == 2:
                res = pb.EvalResult(outcome=pb.EVAL_OUTCOME_WRONG, compile=comp,
                                    message="O: max_abs_error 3.2 at batch 1 row 7",
                                    errors=pb.ErrorMetrics(max_abs_error=3.2, rel_l2_error=0.4))
            else:
                res = pb.EvalResult(
                    outcome=pb.EVAL_OUTCOME_VERIFIED, compile=comp,
                    timing=pb.Timing(median_us=us, min_us=us - 2, max_us=us + 2, samples=9),
                    incumbent_timing=pb.Timing(median_us=us + 80, min_us=us + 78, max_us=us + 82,
                                               samples=9),
                    gpu=pb.GpuInfo(name="NVIDIA H200", arch="sm_90a", nvrtc_version="13.0"))
            assert workers.ReportResult(pb.ReportResultRequest(task_id=t.task_id, result=res),
                                        metadata=kfe2e.worker_md(session), timeout=30).accepted
        gpu = kernels.GetJob(pb.GetJobRequest(job_id=gpu_job.id), metadata=md)
        assert gpu.state == pb.JOB_STATE_SUCCEEDED, gpu
        # What its GPU is doing, as a real worker reads it from NVML.
        workers.Heartbeat(pb.HeartbeatRequest(gpu_usage=pb.GpuUsage(
            utilization=0.37, memory_used_bytes=41 << 30, memory_total_bytes=141 << 30)),
            metadata=kfe2e.worker_md(session), timeout=30)
        served = kernels.GetKernel(pb.GetKernelRequest(shape=shape), metadata=md).kernel
        assert served.tuned, served
        comp = kernels.GetJob(pb.GetJobRequest(job_id=compile_job.id), metadata=md)
        con = sqlite3.connect(db)
        compile_reports = con.execute(
            "SELECT COUNT(*) FROM evaluations WHERE compile_ms > 0").fetchone()[0]
        # The store keeps the current best only; the log has every promotion.
        events = server_events(server.log)
        promotions = sum(1 for e in events if e.get("event") == "promotion")

        # Overview: the workers as the API lists them.
        listed = kernels.ListWorkers(pb.ListWorkersRequest(), metadata=md).workers
        page.open("#/overview")
        rows = page.css("#workers tbody tr")
        assert len(rows) == len(listed) == 2, [r.text for r in rows]
        for w in listed:
            row = 'tr[data-worker="%s"]' % w.id
            assert page.text(row, '[data-k="state"]') == "connected", page.text(row)
            assert page.text(row, '[data-k="arch"]') == w.arch, page.text(row)
            assert w.name in page.text(row), page.text(row)
        scripted = 'tr[data-worker="%s"]' % reg.worker_id
        assert "NVIDIA H200" in page.text(scripted)
        usage = [w for w in listed if w.id == reg.worker_id][0].gpu_usage
        assert abs(usage.utilization - 0.37) < 1e-9, usage
        shown = page.text(scripted, '[data-k="gpu-usage"]')
        assert shown == "37% \u00b7 41.00 GiB of 141.00 GiB", shown
        others = [w.id for w in listed if w.id != reg.worker_id]
        assert page.text('tr[data-worker="%s"] [data-k="gpu-usage"]' % others[0]) == \
            "not reported"
        cards = page.text(".cards")
        assert page.text('[data-k="jobs-succeeded"]') == "2", cards
        assert page.text('[data-k="tuned-buckets"]') == "1", cards
        assert page.text('[data-k="tasks-queued"]') == "0", cards

        # Jobs: the table's counts are the API's.
        page.open("#/jobs")
        for job in (gpu, comp):
            row = 'tr[data-job="%s"]' % job.id
            get = lambda k: page.text(row, '[data-k="%s"]' % k)
            assert get("state") == "succeeded"
            assert int(get("proposed")) == sum(p.proposed for p in job.progress)
            assert int(get("evaluated")) == sum(p.evaluated for p in job.progress)
            assert int(get("failed")) == sum(p.failed for p in job.progress)
            if job.compile_only:
                assert int(get("compiled")) == sum(p.compiled for p in job.progress) > 0
            else:
                assert int(get("verified")) == sum(p.verified for p in job.progress) > 0

        # One job: its progress, the plot of its best over time, the served
        # best and the speedup against the anchor.
        page.open("#/jobs/" + gpu.id)
        p0 = gpu.progress[0]
        row = '#progress tr[data-bucket="%s"]' % GPU_BUCKET
        for k in ("proposed", "evaluated", "verified", "failed", "compiled"):
            assert int(page.text(row, '[data-k="%s"]' % k)) == getattr(p0, k), k
        assert page.text(row, '[data-k="best"]') == us_text(p0.best_timing.median_us)
        box = 'div.bucket[data-bucket="%s"]' % GPU_BUCKET
        verified = con.execute("SELECT COUNT(*) FROM evaluations WHERE job = ? AND outcome = 'verified'",
                               (gpu.id,)).fetchone()[0]
        assert len(page.css(box + " svg.plot circle")) == verified, verified
        assert page.css(box + " svg.plot path.best")
        assert us_text(served.timing.median_us) in page.text(box, '[data-k="served"]')
        speedup = number(page.text(box, '[data-k="speedup"]'))
        assert abs(speedup - ANCHOR_US / served.timing.median_us) < 0.006, speedup
        page.open("#/jobs/" + comp.id)
        assert int(page.text('#progress tr', '[data-k="compiled"]', 1)) == comp.progress[0].compiled
        assert "no verified results yet" in page.text("svg.plot")

        # Buckets: every bucket with a best or a job; the best is the served one.
        page.open("#/buckets")
        assert len(page.css("#buckets tbody tr")) == 2
        row = '#buckets tr[data-bucket="%s"]' % GPU_BUCKET
        assert page.text(row, '[data-k="best"]') == us_text(served.timing.median_us)
        assert served.variant_id in page.text(row)

        # One bucket: best, history, evaluations with outcomes and ptxas
        # resources, variants with provenance.
        page.open("#/buckets/" + GPU_BUCKET)
        assert page.text("#bucket-id") == GPU_BUCKET
        assert page.text('#best [data-k="best"]') == us_text(served.timing.median_us)
        evals = con.execute("SELECT id, outcome, registers, dynamic_smem_bytes, compile_ms FROM "
                            "evaluations WHERE bucket = ?", (GPU_BUCKET,)).fetchall()
        rows = page.css("table.evaluations tbody tr")
        assert len(rows) == len(evals), (len(rows), len(evals))
        for eid, outcome, regs, dsmem, cms in evals:
            r = 'tr[data-evaluation="%d"]' % eid
            assert page.text(r, '[data-k="outcome"]') == outcome
            assert int(page.text(r, '[data-k="registers"]')) == regs
            assert int(page.text(r, '[data-k="dynamic_smem"]')) == dsmem
            assert int(page.text(r, '[data-k="compile_ms"]')) == round(cms)
        for outcome, count in con.execute("SELECT outcome, COUNT(*) FROM evaluations WHERE bucket = ? "
                                          "GROUP BY 1", (GPU_BUCKET,)):
            assert number(page.text('#outcomes [data-outcome="%s"]' % outcome)) == count
        nvariants = con.execute("SELECT COUNT(DISTINCT variant) FROM evaluations WHERE bucket = ?",
                                (GPU_BUCKET,)).fetchone()[0]
        assert len(page.css("#variants tbody tr")) == nvariants
        assert "template" in page.text('#variants tr[data-variant="%s"]' % served.variant_id)

        # The best variant: its source is the served source.
        page.open("#/variants/" + served.variant_id)
        assert page.text("#variant-id") == served.variant_id
        source = d.find_element("id", "source").get_attribute("textContent")
        assert source == served.source, "the page shows another source"
        assert served.provenance.template_name in page.text("#provenance")

        # Model spend: tokens (the builtin proposer spends none).
        page.open("#/spend")
        assert page.text('[data-k="total-tokens"]') == str(gpu.tokens_used + comp.tokens_used)
        assert page.text('#by-proposer tr[data-proposer="builtin"] [data-k="jobs"]') == "2"

        # A reload keeps the token (sessionStorage) and shows no form.
        d.refresh()
        WebDriverWait(d, 30).until(
            lambda d: d.find_element("id", "view").get_attribute("data-loaded") == "#/spend")
        assert not d.find_element("id", "login").is_displayed()
        page.check_console("reload")
        print("pages checked; console messages:", len(page.console))

        status, headers, text = http_get(base + "/metrics", VIEWER_TOKEN)
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        check_metrics(text, db, {"compile_reports": compile_reports, "promotions": promotions,
                                 "version": version, "gpu_worker": reg.worker_id})
        print("metrics checked:", len(text.splitlines()), "lines")
    finally:
        d.quit()
        if worker:
            worker.terminate()
            worker.wait(timeout=30)
    assert server.terminate() == 0
    check_logs(server_events(server.log), os.path.join(work, "worker.log"), gpu_job.id,
               compile_job.id, reg.worker_id)

    # Local development (no auth): open without a token.
    open_port = kfe2e.free_port()
    dev = subprocess.Popen([server_bin, "--insecure-no-auth", "--listen",
                            "127.0.0.1:%d" % kfe2e.free_port(), "--db", os.path.join(work, "dev.db"),
                            "--http-port", str(open_port)],
                           stdout=open(os.path.join(work, "dev.log"), "wb"), stderr=subprocess.STDOUT)
    try:
        ok = kfe2e.wait_until(lambda: _reachable(open_port), timeout=30)
        assert ok, open(os.path.join(work, "dev.log")).read()
        assert json.loads(http_get("http://127.0.0.1:%d/api/auth" % open_port)[2]) == {"open": True}
        assert http_get("http://127.0.0.1:%d/metrics" % open_port)[0] == 200
    finally:
        dev.terminate()
        assert dev.wait(timeout=30) == 0
    print("OK: dashboard")


def _reachable(port):
    import socket
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    main()

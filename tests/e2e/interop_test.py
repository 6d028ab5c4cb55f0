"""Interop: a Python grpcio client calls every KernelService RPC and the
health service of the real kforge-server binary.

usage: interop_test.py <kforge-server binary> <repo root>
"""
import os
import sys
import threading

import kfe2e


def main():
    binary, repo = sys.argv[1], sys.argv[2]
    work = kfe2e.tempdir()
    kfe2e.generate_stubs(repo, os.path.join(work, "gen"))
    import grpc
    import kf_health_pb2 as hpb
    import kf_health_pb2_grpc as hrpc
    from kforge.v1 import kforge_pb2 as pb
    from kforge.v1 import kforge_pb2_grpc as rpc

    server = kfe2e.ServerProcess(binary, os.path.join(work, "kforge.db"), kfe2e.free_port())
    ch = server.start()
    md = kfe2e.client_md()
    k = rpc.KernelServiceStub(ch)
    health = hrpc.HealthStub(ch)

    assert health.Check(hpb.HealthCheckRequest()).status == hpb.HealthCheckResponse.SERVING
    assert health.Check(hpb.HealthCheckRequest(service="kforge.v1.KernelService")).status == \
        hpb.HealthCheckResponse.SERVING

    # Server reflection is on (open, like health): it lists both services.
    import kf_reflection_pb2 as rpb
    import kf_reflection_pb2_grpc as rrpc
    refl = rrpc.ServerReflectionStub(ch)
    answers = list(refl.ServerReflectionInfo(iter([rpb.ServerReflectionRequest(list_services="*")]),
                                             timeout=10))
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"kforge.v1.KernelService", "kforge.v1.WorkerService"} <= names, names

    # No token: UNAUTHENTICATED, saying what is missing.
    try:
        k.ListJobs(pb.ListJobsRequest())
        raise AssertionError("ListJobs without a token succeeded")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
        assert "client token" in e.details(), e.details()

    shape = pb.Shape(op=pb.OP_FORWARD, dtype=pb.DTYPE_BF16, head_dim=128, heads=4, causal=True,
                     arch="sm_90a", cu_seqlens_q=[0, 100, 612, 1000])
    # GetKernel: the seed default for an untuned bucket (needs NVRTC for the
    # cubin; the source and manifest are always there).
    r = k.GetKernel(pb.GetKernelRequest(shape=shape, tune_if_untuned=True), metadata=md, timeout=120)
    assert not r.kernel.tuned and r.kernel.source and r.kernel.manifest.entry_point, r.kernel.manifest
    assert r.kernel.requested_bucket.startswith("fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b4"), r.kernel
    assert r.tuning_job_id, "tune_if_untuned enqueued nothing"
    print("GetKernel:", r.kernel.requested_bucket, "cubin", len(r.kernel.cubin), "bytes,",
          "tuning job", r.tuning_job_id)

    bad = pb.Shape(op=pb.OP_FORWARD, dtype=pb.DTYPE_BF16, head_dim=100, heads=4, arch="sm_90a",
                   batch=1, max_len_q=10, total_q=10)
    try:
        k.GetKernel(pb.GetKernelRequest(shape=bad), metadata=md)
        raise AssertionError("head_dim 100 accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert e.details().startswith("shape.head_dim: 100"), e.details()

    job = k.SubmitJob(pb.SubmitJobRequest(name="interop", shapes=[shape],
                                          budget=pb.Budget(max_variants=4), seed=1),
                      metadata=md, timeout=30)
    assert job.id and job.state in (pb.JOB_STATE_RUNNING, pb.JOB_STATE_QUEUED), job
    got = k.GetJob(pb.GetJobRequest(job_id=job.id), metadata=md)
    assert got.id == job.id and got.shapes[0].head_dim == 128, got
    jobs = k.ListJobs(pb.ListJobsRequest(page_size=1), metadata=md)
    assert len(jobs.jobs) == 1 and jobs.next_page_token, jobs
    more = k.ListJobs(pb.ListJobsRequest(page_size=1, page_token=jobs.next_page_token), metadata=md)
    assert len(more.jobs) == 1 and more.jobs[0].id != jobs.jobs[0].id, more

    events = []
    done = threading.Event()

    def watch():
        for ev in k.WatchJob(pb.WatchJobRequest(job_id=job.id), metadata=md, timeout=60):
            events.append(ev)
        done.set()

    t = threading.Thread(target=watch)
    t.start()
    kfe2e.wait_until(lambda: events, timeout=30)
    cancelled = k.CancelJob(pb.CancelJobRequest(job_id=job.id), metadata=md)
    assert cancelled.state == pb.JOB_STATE_CANCELLED, cancelled
    assert done.wait(20), "WatchJob did not end after CancelJob"
    t.join()
    assert events[-1].job.state == pb.JOB_STATE_CANCELLED, events[-1]

    variants = k.ListVariants(pb.ListVariantsRequest(page_size=10), metadata=md)
    assert len(variants.variants) >= 1, "the jobs proposed nothing"
    print("ListVariants:", [v.variant_id for v in variants.variants])
    shapes = k.ListShapes(pb.ListShapesRequest(arch="sm_90a"), metadata=md)
    assert len(shapes.shapes) == 0, shapes  # nothing verified yet

    try:
        k.GetJob(pb.GetJobRequest(job_id="j999999"), metadata=md)
        raise AssertionError("unknown job found")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e

    assert server.terminate() == 0
    print("OK: every KernelService RPC and health answered a Python client")


if __name__ == "__main__":
    main()

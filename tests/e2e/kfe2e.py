"""Helpers shared by the end-to-end tests: stub generation, a kforge-server
process on a free port with a temp SQLite file, and authenticated stubs.

Stubs are generated at test time from proto/ with grpc_tools, so the tests
always speak the current API. health.proto is copied under another name
first: a generated package called `grpc` would shadow the grpc module.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

CLIENT_TOKEN = "e2e-client-token-0123456789abcdef012345"
WORKER_TOKEN = "e2e-worker-token-0123456789abcdef012345"


def generate_stubs(repo, out):
    from grpc_tools import protoc
    health_dir = os.path.join(out, "_health_src")
    os.makedirs(health_dir, exist_ok=True)
    shutil.copy(os.path.join(repo, "server/testdata/grpc/health/v1/health.proto"),
                os.path.join(health_dir, "kf_health.proto"))
    shutil.copy(os.path.join(repo, "server/testdata/grpc/reflection/v1alpha/reflection.proto"),
                os.path.join(health_dir, "kf_reflection.proto"))
    for include, proto in ((os.path.join(repo, "proto"), "kforge/v1/kforge.proto"),
                           (health_dir, "kf_health.proto"), (health_dir, "kf_reflection.proto")):
        rc = protoc.main(["protoc", "-I", include, "--python_out=" + out,
                          "--grpc_python_out=" + out, os.path.join(include, proto)])
        if rc != 0:
            raise RuntimeError("protoc failed for " + proto)
    sys.path.insert(0, out)


def free_port():
    """A loopback port nothing is bound to, from below the kernel's ephemeral
    range. Ports in that range are also the ones the kernel hands to outgoing
    connections (every worker's, every client's), so one taken from it could
    be in use again by the time the server binds it, or when a test restarts
    its server on the same address (its workers keep that address)."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    pick = random.SystemRandom()
    if low - 1024 >= 4096:
        for _ in range(100):
            port = pick.randrange(max(1024, low - 16384), low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                    return port
                except OSError:
                    continue
    with socket.socket() as s:  # no room below the range: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, binary, db, port, extra=(), env=None):
        self.binary, self.db, self.port, self.extra = binary, db, port, list(extra)
        self.env = env
        self.proc = None
        self.log = db + ".log"

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        import grpc
        logf = open(self.log, "ab")
        # Tokens go in the environment: the server takes none from flags.
        env = dict(os.environ if self.env is None else self.env,
                   KFORGE_CLIENT_TOKEN=CLIENT_TOKEN, KFORGE_WORKER_TOKEN=WORKER_TOKEN)
        self.proc = subprocess.Popen(
            [self.binary, "--listen", self.address, "--db", self.db] + self.extra,
            stdout=logf, stderr=subprocess.STDOUT, env=env)
        # A local subchannel pool: otherwise a new channel inherits the
        # reconnect backoff of a channel to the previous (killed) server.
        channel = grpc.insecure_channel(self.address,
                                        options=[("grpc.use_local_subchannel_pool", 1)])
        try:
            grpc.channel_ready_future(channel).result(timeout=30)
        except grpc.FutureTimeoutError:
            self.proc.kill()
            raise RuntimeError("kforge-server did not come up; log:\n" + open(self.log).read())
        return channel

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def terminate(self, timeout=30):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=timeout)
        return self.proc.returncode if self.proc else None


def client_md():
    return (("authorization", "Bearer " + CLIENT_TOKEN),)


def worker_md(session=None):
    """A worker call's metadata; `session` is the token Register returned,
    which every call after Register carries."""
    md = (("authorization", "Bearer " + WORKER_TOKEN),)
    if session:
        md += (("x-kforge-session", session),)
    return md


def tempdir():
    return tempfile.mkdtemp(prefix="kforge_e2e_")


def wait_until(pred, timeout=20, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()

"""deploy/'s artefacts, checked on a machine without Docker or Kubernetes.

Every YAML file parses; each flag the Dockerfiles, compose file, Kubernetes
manifests and systemd units pass to kforge-server, kforge-worker or kforge
is one that binary's --help lists (and each KFORGE_* variable they set is
one it names); the manifests ask for what the deployment needs (a volume
for the database, one GPU per worker, probes through `kforge health`,
secrets from Secrets). Then the pieces that run here are run: the
compose file's server and worker commands, with its volumes mapped onto the
folder deploy/compose-init.sh makes, serve and register over TLS; the token
rules hold at the binaries (no token flag, 32+ characters, plaintext and
--insecure-no-auth on loopback only); deploy/local-env.sh makes the 0600
env file run.sh and the README use; systemd-analyze verifies the units.

  deploy_test.py REPO SERVER_BIN WORKER_BIN CLI_BIN
"""
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

REPO, SERVER, WORKER, CLI = (os.path.abspath(a) for a in sys.argv[1:5])
DEPLOY = os.path.join(REPO, "deploy")
BINARIES = {"kforge-server": SERVER, "kforge-worker": WORKER, "kforge": CLI}
TOKEN_A = "a" * 24 + "-deploy-test-client"
TOKEN_B = "b" * 24 + "-deploy-test-worker"


def run(args, env=None, timeout=60):
    return subprocess.run(args, env=env, timeout=timeout, capture_output=True, text=True)


_help = {}


def help_text(binary, sub=None):
    key = (binary, sub)
    if key not in _help:
        args = [BINARIES[binary]] + ([sub] if sub else []) + ["--help"]
        out = run(args)
        _help[key] = out.stdout + out.stderr
    return _help[key]


CLI_SUBCOMMANDS = ("get", "tune", "jobs", "variants", "shapes", "export", "workers", "health")


def check_command(test, binary, args, where):
    """Each --flag of `args` is in `binary`'s help (a CLI subcommand's own
    flags in that subcommand's help)."""
    binary = os.path.basename(binary)
    test.assertIn(binary, BINARIES, "%s: unknown binary %s" % (where, binary))
    sub = next((a for a in args if binary == "kforge" and a in CLI_SUBCOMMANDS), None)
    text = help_text(binary) + (help_text(binary, sub) if sub else "")
    flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    test.assertTrue(flags or args == [], "%s: no flags in %r" % (where, args))
    for flag in flags:
        test.assertRegex(text, r"(^|[\s,])%s([\s,=]|$)" % re.escape(flag),
                         "%s: %s %s is not in its --help" % (where, binary, flag))
    for a in args:
        test.assertNotIn(a, ("--token", "--client-token", "--worker-token", "--viewer-token"),
                         "%s: a token on the command line" % where)


def check_env(test, binary, names, where):
    for name in names:
        if name.startswith("KFORGE_"):
            test.assertIn(name, help_text(binary), "%s: %s sets %s, which its --help does not name"
                          % (where, binary, name))


def yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


class Proc:
    """A binary running in the background, its output in a file."""

    def __init__(self, args, log, env=None):
        self.log = log
        self.f = open(log, "wb")
        self.p = subprocess.Popen(args, stdout=self.f, stderr=subprocess.STDOUT, env=env)

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.f.close()


def wait_for(pred, timeout=30, step=0.2):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


class YamlAndFlags(unittest.TestCase):
    def test_every_yaml_file_parses(self):
        found = []
        for root, _, files in os.walk(DEPLOY):
            for name in files:
                if name.endswith((".yaml", ".yml")):
                    found.append(os.path.join(root, name))
                    self.assertTrue(yaml_docs(found[-1]), found[-1])
        self.assertGreaterEqual(len(found), 5, found)

    def test_compose_passes_only_flags_the_binaries_have(self):
        compose = yaml_docs(os.path.join(DEPLOY, "compose.yaml"))[0]
        services = compose["services"]
        self.assertIn("kforge-server", services)
        workers = {k: v for k, v in services.items() if k.startswith("worker-")}
        self.assertGreaterEqual(len(workers), 2)
        check_command(self, "kforge-server", services["kforge-server"]["command"], "compose server")
        devices = set()
        for name, w in workers.items():
            check_command(self, "kforge-worker", w["command"], "compose " + name)
            check_command(self, "kforge", w["healthcheck"]["test"][2:], name + " healthcheck")
            gpus = w["deploy"]["resources"]["reservations"]["devices"]
            self.assertEqual(len(gpus), 1, name)
            self.assertEqual(len(gpus[0]["device_ids"]), 1, name + ": one GPU per worker")
            devices.add(gpus[0]["device_ids"][0])
            self.assertEqual(w["depends_on"]["kforge-server"]["condition"], "service_healthy")
        self.assertEqual(len(devices), len(workers), "each worker its own GPU")
        check_command(self, "kforge", services["kforge-server"]["healthcheck"]["test"][2:],
                      "server healthcheck")
        for svc in services.values():
            check_env(self, "kforge-server", (svc.get("environment") or {}), "compose")

    def test_kubernetes_manifests(self):
        docs = {}
        for name in ("server.yaml", "workers.yaml", "namespace.yaml", "kustomization.yaml"):
            for d in yaml_docs(os.path.join(DEPLOY, "k8s", name)):
                docs.setdefault(d["kind"], []).append(d)
        kust = docs["Kustomization"][0]
        for r in kust["resources"]:
            self.assertTrue(os.path.exists(os.path.join(DEPLOY, "k8s", r)), r)
        sts = docs["StatefulSet"][0]
        self.assertEqual(sts["spec"]["replicas"], 1, "SQLite: one server")
        self.assertTrue(sts["spec"]["volumeClaimTemplates"])
        server = sts["spec"]["template"]["spec"]["containers"][0]
        check_command(self, "kforge-server", server["args"], "k8s server")
        db = server["args"][server["args"].index("--db") + 1]
        mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
        claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
        self.assertTrue(db.startswith(mounts[claim] + "/"), "the database is on the volume")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            cmd = server[probe]["exec"]["command"]
            self.assertEqual(cmd[0], "kforge")
            self.assertIn("health", cmd)
            check_command(self, "kforge", cmd[1:], "k8s server " + probe)
        dep = docs["Deployment"][0]
        pod = dep["spec"]["template"]["spec"]
        worker = pod["containers"][0]
        check_command(self, "kforge-worker", worker["args"], "k8s worker")
        for kind in ("requests", "limits"):
            self.assertEqual(worker["resources"][kind]["nvidia.com/gpu"], 1, kind)
        self.assertEqual(worker["args"][worker["args"].index("--gpu") + 1], "0")
        env = {e["name"] for e in worker.get("env", [])}
        for a in worker["args"]:
            for var in re.findall(r"\$\((\w+)\)", a):
                self.assertIn(var, env, "$(%s) needs an env entry" % var)
        check_env(self, "kforge-worker", env, "k8s worker")
        probe = worker["readinessProbe"]["exec"]["command"]
        check_command(self, "kforge", probe[1:], "k8s worker readiness")
        # Tokens and keys come from Secrets, and no value is written inline.
        for spec, c in ((sts["spec"]["template"]["spec"], server), (pod, worker)):
            secrets = [v for v in spec["volumes"] if "secret" in v]
            self.assertTrue(secrets)
            for e in c.get("env", []):
                self.assertNotIn("TOKEN", e["name"].upper() if "value" in e else "")
        ca = [v for v in pod["volumes"] if v["name"] == "ca"][0]["secret"]
        self.assertEqual([i["key"] for i in ca["items"]], ["ca.crt"], "workers never get the key")

    def test_dockerfiles(self):
        for name, binary, base in (("server.Dockerfile", "kforge-server", "debian:bookworm-slim"),
                                   ("worker.Dockerfile", "kforge-worker", "${CUDA_IMAGE}")):
            with open(os.path.join(DEPLOY, "docker", name)) as f:
                text = f.read()
            froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
            self.assertGreaterEqual(len(froms), 2, name + ": multi-stage")
            self.assertEqual(froms[0], ("debian:bookworm", "build"), name)
            self.assertEqual(froms[-1][0], base, name)
            self.assertIn("RUN ./deploy/docker/build-in-container.sh", text)
            entry = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])", text, re.M).group(1))
            self.assertEqual(entry, [binary])
            cmd = json.loads(re.search(r"^CMD\s+(\[.*?\])", text.replace("\\\n", " "),
                                       re.M | re.S).group(1))
            check_command(self, binary, cmd, name + " CMD")
            self.assertRegex(text, r"(?m)^USER 10001", name + ": not root")
        with open(os.path.join(DEPLOY, "docker", "worker.Dockerfile")) as f:
            arg = re.search(r"^ARG CUDA_IMAGE=(\S+)", f.read(), re.M).group(1)
        self.assertRegex(arg, r"^nvidia/cuda:13\.\d+\.\d+-runtime-", "a CUDA runtime base")
        build = os.path.join(DEPLOY, "docker", "build-in-container.sh")
        self.assertTrue(os.access(build, os.X_OK))
        self.assertEqual(run(["bash", "-n", build]).returncode, 0)

    def test_systemd_units(self):
        units = {}
        for name in ("kforge-server.service", "kforge-worker@.service"):
            with open(os.path.join(DEPLOY, "systemd", name)) as f:
                text = f.read()
            units[name] = text
            body = re.search(r"^ExecStart=(.*?)(?<!\\)$", text, re.M | re.S).group(1)
            args = body.replace("\\\n", " ").split()
            check_command(self, os.path.basename(args[0]), args[1:], name)
            self.assertIn("LoadCredential=", text, name + ": secrets as credentials")
            self.assertIn("NoNewPrivileges=yes", text)
        analyze = shutil.which("systemd-analyze")
        if not analyze:
            self.skipTest("no systemd-analyze")
        tmp = tempfile.mkdtemp(prefix="kforge_units_")
        try:
            for name, text in units.items():
                text = (text.replace("/usr/local/bin/kforge-server", SERVER)
                        .replace("/usr/local/bin/kforge-worker", WORKER)
                        .replace("/usr/local/bin/kforge ", CLI + " "))
                out = name.replace("@.", "@0.")
                with open(os.path.join(tmp, out), "w") as f:
                    f.write(text)
            r = run([analyze, "verify"] + [os.path.join(tmp, n.replace("@.", "@0."))
                                           for n in units])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)


class TokenRules(unittest.TestCase):
    def env(self, **kw):
        e = {k: v for k, v in os.environ.items() if "KFORGE" not in k}
        e.update(kw)
        return e

    def test_the_server_takes_no_token_from_a_flag(self):
        secret = "s" * 40
        for flag in ("--client-token", "--worker-token", "--viewer-token"):
            r = run([SERVER, "--listen", "127.0.0.1:0", flag, secret], env=self.env())
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("KFORGE_CLIENT_TOKEN", r.stderr)
            self.assertIn("--client-tokens-file", r.stderr)
            self.assertNotIn(secret, r.stderr + r.stdout)

    def test_short_tokens_are_refused(self):
        r = run([SERVER, "--listen", "127.0.0.1:0", "--db", ":memory:"],
                env=self.env(KFORGE_CLIENT_TOKEN="short", KFORGE_WORKER_TOKEN=TOKEN_B))
        self.assertEqual(r.returncode, 2)
        self.assertIn("fewer than 32", r.stderr)
        r = run([CLI, "shapes"], env=self.env(KFORGE_TOKEN="short"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("KFORGE_TOKEN: the token has 5 characters", r.stderr)

    def test_plaintext_and_no_auth_only_on_loopback(self):
        r = run([SERVER, "--listen", "0.0.0.0:0", "--db", ":memory:", "--insecure-no-auth",
                 "--allow-plaintext"], env=self.env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("--insecure-no-auth listens on loopback addresses only", r.stderr)
        r = run([SERVER, "--listen", "0.0.0.0:0", "--db", ":memory:"],
                env=self.env(KFORGE_CLIENT_TOKEN=TOKEN_A, KFORGE_WORKER_TOKEN=TOKEN_B))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a loopback address and TLS is off", r.stderr)
        r = run([CLI, "--server", "kforge.example.com:50051", "shapes"], env=self.env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("--tls-ca", r.stderr)

    def test_local_env_file_is_private_and_serves(self):
        tmp = tempfile.mkdtemp(prefix="kforge_localenv_")
        try:
            path = os.path.join(tmp, "kforge-local.env")
            script = os.path.join(DEPLOY, "local-env.sh")
            self.assertEqual(run([script, path]).returncode, 0)
            self.assertEqual(mode(path), 0o600)
            with open(path) as f:
                first = f.read()
            tokens = dict(re.findall(r"export (KFORGE_\w+_TOKEN)=([0-9a-f]+)", first))
            self.assertEqual(len(tokens["KFORGE_CLIENT_TOKEN"]), 64)
            self.assertNotEqual(tokens["KFORGE_CLIENT_TOKEN"], tokens["KFORGE_WORKER_TOKEN"])
            os.chmod(path, 0o644)
            self.assertEqual(run([script, path]).returncode, 0)
            self.assertEqual(mode(path), 0o600, "a looser file is tightened")
            with open(path) as f:
                self.assertEqual(f.read(), first, "and kept")
            # Sourced as run.sh and the README do, the tokens serve.
            env_out = run(["bash", "-c", ". '%s' && env" % path]).stdout
            env = self.env(**dict(l.split("=", 1) for l in env_out.splitlines()
                                  if l.startswith("KFORGE_")))
            port = free_port()
            server = Proc([SERVER, "--listen", "127.0.0.1:%d" % port, "--db",
                           os.path.join(tmp, "k.db")], os.path.join(tmp, "server.log"), env)
            try:
                addr = "127.0.0.1:%d" % port
                self.assertTrue(wait_for(lambda: run([CLI, "--server", addr, "--timeout", "2",
                                                      "health"], env=env).returncode == 0),
                                server.text())
                r = run([CLI, "--server", addr, "shapes"], env=env)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(mode(os.path.join(tmp, "k.db")), 0o600)
            finally:
                server.stop()
        finally:
            shutil.rmtree(tmp)


class ComposeOnThisHost(unittest.TestCase):
    """The compose file's server and worker commands, run here as they would
    run in their containers: container paths mapped to the folder
    compose-init.sh makes, the server's name to localhost."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kforge_compose_")
        self.home = os.path.join(self.tmp, "home")
        r = run([os.path.join(DEPLOY, "compose-init.sh"), self.home, "2"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(DEPLOY, "compose.yaml")) as f:
            self.compose = yaml.safe_load(f)
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.stop()
        shutil.rmtree(self.tmp)

    def mapped(self, service, port):
        """The service's command with its volumes' container paths replaced
        by the host paths under KFORGE_HOME."""
        svc = self.compose["services"][service]
        pairs = []
        for v in svc["volumes"]:
            v = re.sub(r"\$\{KFORGE_HOME[^}]*\}", self.home, v)
            host, container = v.split(":")[:2]
            pairs.append((container, host))
        pairs.sort(key=lambda p: -len(p[0]))
        out = []
        for a in svc["command"]:
            for container, host in pairs:
                if a == container or a.startswith(container + "/"):
                    a = host + a[len(container):]
                    break
            a = a.replace("0.0.0.0:50051", "127.0.0.1:%d" % port)
            a = a.replace("kforge-server:50051", "localhost:%d" % port)
            a = re.sub(r"\$\{KFORGE_HOST[^}]*\}", "test", a)
            out.append(a)
        return out

    def test_files_are_private_and_tokens_long(self):
        secrets = os.path.join(self.home, "secrets")
        for name in ("client.tokens", "worker.token", "worker.tokens"):
            self.assertEqual(mode(os.path.join(secrets, name)), 0o600, name)
        for name in ("server.key", "ca.key", "client.key"):
            self.assertEqual(mode(os.path.join(self.home, "tls", name)), 0o600, name)
        with open(os.path.join(secrets, "worker.tokens")) as f:
            name, token = f.read().strip().split(":", 1)
        with open(os.path.join(secrets, "worker.token")) as f:
            self.assertEqual(f.read().strip(), token)
        self.assertRegex(name, r"^[A-Za-z0-9._-]{1,64}$")
        self.assertGreaterEqual(len(token), 32)
        # Again: nothing is rotated.
        self.assertEqual(run([os.path.join(DEPLOY, "compose-init.sh"), self.home, "2"]).returncode, 0)
        with open(os.path.join(secrets, "worker.token")) as f:
            self.assertEqual(f.read().strip(), token)

    def test_server_and_worker_commands_serve_over_tls(self):
        port = free_port()
        env = {k: v for k, v in os.environ.items() if "KFORGE" not in k}
        server_args = self.mapped("kforge-server", port)
        server = Proc([SERVER] + server_args, os.path.join(self.tmp, "server.log"), env)
        self.procs.append(server)
        ca = os.path.join(self.home, "tls", "ca.crt")
        health = self.compose["services"]["kforge-server"]["healthcheck"]["test"][2:]
        health = [a.replace("/etc/kforge/tls/ca.crt", ca).replace("localhost:50051",
                                                                  "localhost:%d" % port)
                  for a in health]
        self.assertTrue(wait_for(lambda: run([CLI] + health, env=env).returncode == 0, 60),
                        server.text())
        self.assertIn("TLS", server.text())
        worker_args = self.mapped("worker-0", port) + ["--lease-wait-ms", "1000"]
        worker = Proc([WORKER] + worker_args, os.path.join(self.tmp, "worker.log"), env)
        self.procs.append(worker)
        token_file = os.path.join(self.home, "secrets", "client.tokens")
        cli = [CLI, "--server", "localhost:%d" % port, "--tls-ca", ca, "--token-file", token_file]

        def registered():
            r = run(cli + ["workers", "--json"], env=env)
            return r.returncode == 0 and "test-gpu0" in r.stdout
        self.assertTrue(wait_for(registered, 60), worker.text() + "\n" + server.text())
        # Plaintext to the TLS port gets nowhere.
        r = run([CLI, "--server", "127.0.0.1:%d" % port, "--token-file", token_file,
                 "--timeout", "3", "shapes"], env=env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)


class SampleConfig(unittest.TestCase):
    def test_the_sample_config_serves(self):
        """deploy/kforge-server.jsonc as it is, its /etc/kforge and
        /var/lib/kforge paths moved into a folder with the files it names."""
        tmp = tempfile.mkdtemp(prefix="kforge_sample_")
        try:
            tls, private = os.path.join(tmp, "tls"), os.path.join(tmp, "private")
            self.assertEqual(run([os.path.join(DEPLOY, "make-certs.sh"), tls]).returncode, 0)
            os.makedirs(private, mode=0o700)
            os.rename(os.path.join(tls, "server.key"), os.path.join(private, "server.key"))
            for name, text in (("client.tokens", TOKEN_A + "\n"),
                               ("worker.tokens", "host-a:" + TOKEN_B + "\n")):
                with open(os.path.join(private, name), "w") as f:
                    f.write(text)
                os.chmod(os.path.join(private, name), 0o600)
            port = free_port()
            with open(os.path.join(DEPLOY, "kforge-server.jsonc")) as f:
                text = f.read()
            text = (text.replace("/etc/kforge/", tmp + "/").replace("/var/lib/kforge/", tmp + "/")
                    .replace("0.0.0.0:50051", "0.0.0.0:%d" % port))
            config = os.path.join(tmp, "server.jsonc")
            with open(config, "w") as f:
                f.write(text)
            env = {k: v for k, v in os.environ.items() if "KFORGE" not in k}
            server = Proc([SERVER, "--config", config], os.path.join(tmp, "server.log"), env)
            try:
                cli = [CLI, "--server", "localhost:%d" % port, "--tls-ca",
                       os.path.join(tls, "ca.crt"), "--timeout", "3"]
                self.assertTrue(wait_for(lambda: run(cli + ["health"], env=env).returncode == 0,
                                         30), server.text())
                r = run(cli + ["shapes"], env=dict(env, KFORGE_TOKEN=TOKEN_A))
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(os.path.exists(os.path.join(tmp, "kforge.db")))
            finally:
                server.stop()
        finally:
            shutil.rmtree(tmp)


class MutualTls(unittest.TestCase):
    def test_the_cli_needs_its_certificate_when_the_server_asks(self):
        tmp = tempfile.mkdtemp(prefix="kforge_mtls_")
        try:
            pki = os.path.join(tmp, "pki")
            self.assertEqual(run([os.path.join(DEPLOY, "make-certs.sh"), pki]).returncode, 0)
            f = lambda n: os.path.join(pki, n)
            port = free_port()
            env = {k: v for k, v in os.environ.items() if "KFORGE" not in k}
            env.update(KFORGE_CLIENT_TOKEN=TOKEN_A, KFORGE_WORKER_TOKEN=TOKEN_B)
            server = Proc([SERVER, "--listen", "0.0.0.0:%d" % port, "--db",
                           os.path.join(tmp, "k.db"), "--tls-cert", f("server.crt"),
                           "--tls-key", f("server.key"), "--tls-client-ca", f("ca.crt")],
                          os.path.join(tmp, "server.log"), env)
            try:
                base = [CLI, "--server", "localhost:%d" % port, "--tls-ca", f("ca.crt"),
                        "--timeout", "3"]
                mtls = base + ["--tls-cert", f("client.crt"), "--tls-key", f("client.key")]
                self.assertTrue(wait_for(lambda: run(mtls + ["health"], env=env).returncode == 0,
                                         30), server.text())
                cenv = dict(env, KFORGE_TOKEN=TOKEN_A)
                self.assertEqual(run(mtls + ["shapes"], env=cenv).returncode, 0)
                self.assertEqual(run(base + ["health"], env=cenv).returncode, 1,
                                 "no client certificate")
            finally:
                server.stop()
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])

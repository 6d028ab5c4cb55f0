"""The Python package without a GPU or PyTorch (CI): the ctypes binding of
libkforge_runtime.so (struct layouts, errors as KforgeError, packs refused),
and `pip install ./python` offline, bundling the library.

usage: cpu_test.py <libkforge_runtime.so> <repo root>
"""
import glob
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

LIB, REPO = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
os.environ["KFORGE_RUNTIME_LIB"] = LIB
sys.path.insert(0, os.path.join(REPO, "python"))

from kforge import _lib  # noqa: E402
from kforge._lib import KforgeError, Runtime  # noqa: E402


def args(**kw):
    a = _lib.new_args()
    a.batch, a.heads, a.kv_heads, a.head_dim, a.total_q, a.max_seqlen_q, a.causal = 3, 8, 2, 64, 1000, 700, 1
    a.cu_seqlens_q = 8  # an address: only sizes are read without a GPU
    for k, v in kw.items():
        setattr(a, k, v)
    return a


class Binding(unittest.TestCase):
    def setUp(self):
        self.rt = Runtime(arch="sm_90a", cache_dir=None)

    def test_structs_match_the_c_layout(self):
        # Every size field lands where the library reads it: the bucket says so.
        info = self.rt.prepare(args())
        self.assertEqual(info["bucket"], "fwd.bf16.d64.h8.kv2.causal.self.sm_90a.b4.mq1024.aq512.mk1024.ak512")
        self.assertEqual(info["source"], "seed")
        self.assertTrue(info["variant_id"].startswith("s-"), info)
        self.assertEqual(info["entry_point"], "kf_attn_fwd")
        self.assertGreater(info["cubin_bytes"], 1000)
        cross = self.rt.prepare(args(cu_seqlens_k=16, total_k=50, max_seqlen_k=20, causal=0),
                                _lib.OP_BACKWARD)
        self.assertEqual(cross["bucket"], "bwd.bf16.d64.h8.kv2.full.cross.sm_90a.b4.mq1024.aq512.mk32.ak32")
        self.assertEqual(cross["entry_point"], "kf_attn_bwd")
        s = self.rt.stats()
        self.assertEqual(s["seed_compiles"], 2)
        self.assertEqual(s["calls"], 2)

    def test_deterministic_reaches_the_library(self):
        # The field after dv: a backward that asks gets the ".det" bucket and
        # the deterministic seed; the forward ignores it.
        det = self.rt.prepare(args(deterministic=1), _lib.OP_BACKWARD)
        self.assertEqual(det["bucket"], "bwd.bf16.d64.h8.kv2.causal.self.sm_90a.b4.mq1024.aq512.mk1024.ak512.det")
        self.assertEqual(det["entry_point"], "kf_attn_bwd")
        fwd = self.rt.prepare(args(deterministic=1))
        self.assertFalse(fwd["bucket"].endswith(".det"), fwd)
        # sm_80: bwd_mma DET=1; a head dim no backward kernel has: unsupported, saying so.
        ampere = Runtime(arch="sm_80", cache_dir=None)
        l = _lib.lib()
        self.assertEqual(l.kf_attention_supported(ampere.handle, args(deterministic=1), _lib.OP_BACKWARD),
                         _lib.OK, l.kf_last_error())
        self.assertEqual(l.kf_attention_supported(ampere.handle, args(deterministic=1, head_dim=96),
                                                  _lib.OP_BACKWARD),
                         _lib.ERR_UNSUPPORTED)
        self.assertIn("no deterministic backward kernel for sm_80", l.kf_last_error().decode())

    def test_errors_are_kforge_errors_with_the_c_message(self):
        with self.assertRaises(KforgeError) as e:
            self.rt.prepare(args(batch=0))
        self.assertEqual(e.exception.code, "KF_ERR_INVALID_ARGUMENT")
        self.assertEqual(e.exception.message, "args.batch: 0 must be positive")
        with self.assertRaises(KforgeError) as e:
            self.rt.forward(args(head_dim=100))
        self.assertEqual(e.exception.code, "KF_ERR_UNSUPPORTED")

    def test_supported_needs_no_compile(self):
        l = _lib.lib()
        self.assertEqual(l.kf_attention_supported(self.rt.handle, args(), _lib.OP_FORWARD), _lib.OK)
        self.assertEqual(l.kf_attention_supported(self.rt.handle, args(head_dim=96), _lib.OP_FORWARD),
                         _lib.ERR_UNSUPPORTED)
        self.assertIn("head_dim 96", l.kf_last_error().decode())
        self.assertEqual(self.rt.stats()["seed_compiles"], 0)

    def test_a_damaged_pack_is_refused(self):
        with tempfile.NamedTemporaryFile(suffix=".kfpack") as f:
            f.write(b"KFPACK\r\n" + b"\x01\x00\x00\x00" * 2 + b"\xff" * 8)
            f.flush()
            with self.assertRaises(KforgeError) as e:
                Runtime(packs=[f.name], arch="sm_90a")
            self.assertEqual(e.exception.code, "KF_ERR_PACK")
            self.assertIn("truncated", e.exception.message)


class Install(unittest.TestCase):
    def test_pip_builds_offline_and_bundles_the_library(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, KFORGE_RUNTIME_LIB=LIB, PIP_ROOT_USER_ACTION="ignore")
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", tmp, os.path.join(REPO, "python")],
                           check=True, env=env, cwd=tmp)
            wheels = glob.glob(os.path.join(tmp, "kforge-*.whl"))
            self.assertEqual(len(wheels), 1, os.listdir(tmp))
            self.assertTrue(wheels[0].endswith("-py3-none-linux_x86_64.whl"), wheels[0])
            names = zipfile.ZipFile(wheels[0]).namelist()
            self.assertTrue(any(n.endswith("kforge/lib/libkforge_runtime.so") for n in names), names)
            site = os.path.join(tmp, "site")
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                            "--target", site, wheels[0]], check=True,
                           env=dict(os.environ, PIP_ROOT_USER_ACTION="ignore"))
            # Imported from the install, with no KFORGE_RUNTIME_LIB: the bundled library.
            env = {k: v for k, v in os.environ.items() if k != "KFORGE_RUNTIME_LIB"}
            env["PYTHONPATH"] = site
            out = subprocess.run(
                [sys.executable, "-c",
                 "import kforge, kforge._lib as l; print(l.library_path()); "
                 "print(kforge.Runtime(arch='sm_90a', cache_dir=None).stats()['calls'])"],
                check=True, env=env, cwd=tmp, capture_output=True, text=True).stdout.split()
            self.assertTrue(out[0].startswith(site), out)
            self.assertEqual(out[1], "0")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])

"""kforge.jagged_attention as a PyTorch user meets it, on the H200: autograd
and torch.compile (fullgraph), the current stream with no host wait, offsets
on the GPU, the varlen_attn fallback and strict mode, prepare(), a kernel
pack with no server, and the README's example. Exit 77 (skipped) without a GPU.
"""
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

import kftest

torch = kftest.need_gpu()
import kforge  # noqa: E402

LENGTHS = [0, 1, 130, 257, 64, 1000]


def inputs(lengths, heads=4, kv_heads=4, head_dim=128, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = sum(lengths)
    q = torch.randn(n, heads, head_dim, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(n, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(n, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    return q, k, v


class Integration(unittest.TestCase):
    def setUp(self):
        kforge.configure(cache_dir=tempfile.mkdtemp(prefix="kforge_py_"))

    def expect_matches(self, out, q, k, v, lengths, causal, lk=None):
        ro, _, _, _, _ = kftest.reference(q, k, v, torch.zeros_like(q), lengths, lk or lengths, causal,
                                          1.0 / math.sqrt(q.shape[-1]))
        self.assertEqual(kftest.judge_bf16("O", out, ro), "")

    def test_autograd_and_torch_compile_agree_with_eager(self):
        q, k, v = inputs(LENGTHS, heads=8, kv_heads=2)
        cu = kftest.offsets(LENGTHS)

        def loss(q, k, v):
            out = kforge.jagged_attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
            return out.float().square().sum()

        grads = []
        for fn in (loss, torch.compile(loss, fullgraph=True)):
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            value = fn(qg, kg, vg)
            value.backward()
            grads.append((value.detach(), qg.grad, kg.grad, vg.grad))
        (l0, *g0), (l1, *g1) = grads
        self.assertTrue(torch.allclose(l0, l1, rtol=1e-3), (l0, l1))
        for name, a, b in zip(("dQ", "dK", "dV"), g0, g1):
            self.assertEqual(kftest.judge_bf16(name, b, a.float()), "")

    def test_runs_on_the_current_stream_and_never_waits(self):
        q0, k0, v0 = inputs(LENGTHS)
        cu = kftest.offsets(LENGTHS)  # on the CPU: nothing to copy back
        kforge.jagged_attention(q0, k0, v0, cu, cu, max(LENGTHS), max(LENGTHS))  # warm: compile, load
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(2e9))  # about a second of GPU time
            q = q0 * 1.0  # written after the sleep: a kernel on another stream would read garbage
            start = time.perf_counter()
            out = kforge.jagged_attention(q, k0, v0, cu, cu, max(LENGTHS), max(LENGTHS))
            took = time.perf_counter() - start
            busy = not side.query()
        self.assertTrue(busy, "the stream should still be sleeping")
        self.assertLess(took, 0.25, "the call waited for the device")
        side.synchronize()
        self.expect_matches(out, q0, k0, v0, LENGTHS, False)

    def test_offsets_on_the_gpu_work_and_warn_once(self):
        q, k, v = inputs(LENGTHS)
        cu = kftest.offsets(LENGTHS).cuda()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = kforge.jagged_attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
            kforge.jagged_attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
        self.assertLessEqual(len([x for x in w if "synchronisation" in str(x.message)]), 1)
        self.expect_matches(out, q, k, v, LENGTHS, True)

    def test_views_off_a_sixteen_byte_boundary_are_copied_not_faulted_on(self):
        # Slices of a flat buffer one element in: contiguous, but 2 bytes off
        # the 16-byte boundary the runtime takes tensors at.
        q0, k0, v0 = inputs(LENGTHS)
        views = []
        for t in (q0, k0, v0):
            flat = torch.empty(t.numel() + 1, device="cuda", dtype=t.dtype)
            view = flat[1:].view(t.shape)
            view.copy_(t)
            self.assertNotEqual(view.data_ptr() % 16, 0)
            views.append(view.requires_grad_())
        cu = kftest.offsets(LENGTHS)
        out = kforge.jagged_attention(*views, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
        self.expect_matches(out, q0, k0, v0, LENGTHS, True)
        out.float().square().sum().backward()  # dout is aligned; the saved inputs are the copies
        for t in views:
            self.assertTrue(torch.isfinite(t.grad).all())

    def test_cross_attention_with_gqa(self):
        lq, lk = [5, 0, 300, 1], [17, 9, 0, 1000]
        g = torch.Generator(device="cuda").manual_seed(3)
        q = torch.randn(sum(lq), 8, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(sum(lk), 2, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(sum(lk), 2, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        out = kforge.jagged_attention(q, k, v, kftest.offsets(lq), kftest.offsets(lk), max(lq), max(lk),
                                      causal=True)
        self.expect_matches(out, q, k, v, lq, True, lk)

    def test_falls_back_to_varlen_attn_where_kforge_has_no_kernel_or_raises_when_strict(self):
        cu = kftest.offsets(LENGTHS)
        for dtype, head_dim, why in ((torch.float16, 128, "dtype torch.float16"), (torch.bfloat16, 96, "head_dim 96")):
            q, k, v = inputs(LENGTHS, head_dim=head_dim, dtype=dtype)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                out = kforge.jagged_attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS))
            self.assertTrue(any(why in str(x.message) and "varlen_attn" in str(x.message) for x in w),
                            [str(x.message) for x in w])
            self.assertEqual(out.shape, q.shape)
            self.expect_matches(out, q, k, v, LENGTHS, False)
        kforge.configure(strict=True, cache_dir=None)
        try:
            q, k, v = inputs(LENGTHS, head_dim=96)
            with self.assertRaises(kforge.KforgeError) as e:
                kforge.jagged_attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS))
            self.assertEqual(e.exception.code, "KF_ERR_UNSUPPORTED")
            self.assertIn("head_dim 96", e.exception.message)
        finally:
            kforge.configure(strict=False, cache_dir=None)

    def test_prepare_names_the_kernel_and_a_pack_serves_with_no_server(self):
        cache = tempfile.mkdtemp(prefix="kforge_py_pack_")
        kforge.configure(cache_dir=cache)
        q, k, v = inputs(LENGTHS)
        cu = kftest.offsets(LENGTHS)
        info = kforge.prepare(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
        self.assertEqual(info["source"], "seed")
        self.assertEqual(info["entry_point"], "kf_attn_fwd")
        # The compiled seed sits in the disk cache as a one-kernel pack: load it as a pack.
        packs = [os.path.join(cache, "seeds", f) for f in os.listdir(os.path.join(cache, "seeds"))]
        self.assertEqual(len(packs), 1, packs)
        kforge.configure(packs=packs, cache_dir=None, server=None)
        again = kforge.prepare(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
        self.assertEqual(again["source"], "pack")
        self.assertEqual(again["variant_id"], info["variant_id"])
        out = kforge.jagged_attention(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), causal=True)
        self.expect_matches(out, q, k, v, LENGTHS, True)
        self.assertGreaterEqual(kforge.stats()["pack_hits"], 1)

    def test_the_readme_example_runs(self):
        readme = open(os.path.join(kftest.repo(), "README.md")).read()
        blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
        self.assertTrue(blocks, "no ```python block in README.md")
        example = blocks[0]
        self.assertLessEqual(len(example.strip().splitlines()), 10, example)
        env = dict(os.environ, KFORGE_CACHE_DIR="none")
        p = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, env=env,
                           timeout=300)
        print(p.stdout, p.stderr[-2000:])
        self.assertEqual(p.returncode, 0, p.stderr[-4000:])


if __name__ == "__main__":
    kftest.main()

"""kforge.jagged_attention against a float32 PyTorch reference, on the H200:
outputs, LSE and gradients within the tolerance policy
(worker/eval/TOLERANCE.md), on the public shapes (bench/shapes.json, drawn as
the benchmarks draw them) and on random jagged batches with lengths 0, 1 and
odd, GQA, cross attention and both masks. Exit 77 (skipped) without a GPU.

usage: gpu_correctness_test.py   (KFORGE_RUNTIME_LIB, PYTHONPATH=python/)
       ONLY=hstu_prod_causal,... limits the public shapes
"""
import math
import os
import random
import unittest

import kftest

torch = kftest.need_gpu()
import kforge  # noqa: E402


class Correctness(unittest.TestCase):
    def check(self, name, lq, lk, heads, kv_heads, head_dim, causal, seed=0):
        cross = lk is not None
        lk = lk if cross else lq
        gen = torch.Generator(device="cuda").manual_seed(seed)
        rand = lambda n, h: torch.randn(n, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        q, k, v = rand(sum(lq), heads), rand(sum(lk), kv_heads), rand(sum(lk), kv_heads)
        dout = rand(sum(lq), heads)
        cu_q = kftest.offsets(lq)
        cu_k = kftest.offsets(lk) if cross else cu_q
        scale = 1.0 / math.sqrt(head_dim)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = kforge.jagged_attention(qg, kg, vg, cu_q, cu_k, max(lq), max(lk), causal=causal)
        out.backward(dout)
        _, lse, _, _ = torch.ops.kforge.attention_fwd(q, k, v, None, None, cu_q,
                                                      cu_k if cross else None, len(lq), max(lq),
                                                      max(lk), causal, scale, False, False)
        torch.cuda.synchronize()
        ro, rlse, rdq, rdk, rdv = kftest.reference(q, k, v, dout, lq, lk, causal, scale)
        problems = [p for p in (kftest.judge_bf16("O", out, ro), kftest.judge_lse(lse, rlse),
                                kftest.judge_bf16("dQ", qg.grad, rdq), kftest.judge_bf16("dK", kg.grad, rdk),
                                kftest.judge_bf16("dV", vg.grad, rdv)) if p]
        what = (f"{name}: B={len(lq)} H={heads} KV={kv_heads} D={head_dim} "
                f"{'causal' if causal else 'full'} {'cross' if cross else 'self'}")
        print(what, "ok" if not problems else problems, flush=True)
        self.assertEqual(problems, [], what)

    def test_public_shapes(self):
        only = os.environ.get("ONLY")
        for name, lq, lk, heads, head_dim, causal in kftest.public_shapes(only.split(",") if only else None):
            with self.subTest(name):
                self.check(name, lq, lk, heads, heads, head_dim, causal)
                torch.cuda.empty_cache()

    def test_random_jagged_batches(self):
        rng = random.Random(7)
        special = [0, 1, 2, 63, 64, 65, 127, 129, 255, 257]
        for i in range(16):
            batch = rng.choice([1, 3, 17, 64])
            lq = [rng.choice(special + [rng.randint(1, 700)]) for _ in range(batch)]
            lq[rng.randrange(batch)] = max(1, lq[0])  # at least one query row
            cross = i % 3 == 2
            lk = [rng.choice(special + [rng.randint(0, 700)]) for _ in range(batch)] if cross else None
            if cross and sum(lk) == 0:
                lk[0] = 5
            heads, kv_heads = rng.choice([(4, 4), (8, 2), (6, 3), (8, 1)])
            with self.subTest(i):
                self.check(f"random {i}", lq, lk, heads, kv_heads, rng.choice([64, 128]), i % 2 == 1, seed=i)

    def test_deterministic_backward_repeats_bit_for_bit(self):
        """deterministic=True: the same dQ, dK and dV bits in every run (and
        within the tolerance of the reference); sm_90a only, elsewhere it
        raises KF_ERR_UNSUPPORTED rather than fall back."""
        if torch.cuda.get_device_capability() != (9, 0):
            with self.assertRaises(kforge.KforgeError):
                q = torch.randn(8, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                cu = kftest.offsets([8])
                kforge.jagged_attention(q, q, q, cu, cu, 8, 8, deterministic=True).sum().backward()
            return
        rng = random.Random(11)
        for i, (heads, kv_heads, head_dim, causal, cross) in enumerate(
                [(4, 4, 128, True, False), (8, 2, 128, False, True), (4, 1, 64, True, True),
                 (4, 4, 64, False, False)]):
            lq = [rng.choice([1, 65, 300, 1500, 2100]) for _ in range(9)]
            lk = [rng.choice([0, 129, 700, 1800]) for _ in range(9)] if cross else lq
            gen = torch.Generator(device="cuda").manual_seed(100 + i)
            rand = lambda n, h: torch.randn(n, h, head_dim, device="cuda", dtype=torch.bfloat16,
                                            generator=gen)
            q, k, v, dout = rand(sum(lq), heads), rand(sum(lk), kv_heads), rand(sum(lk), kv_heads), rand(sum(lq), heads)
            cu_q, cu_k = kftest.offsets(lq), kftest.offsets(lk) if cross else None
            grads = []
            for _ in range(3):
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                out = kforge.jagged_attention(qg, kg, vg, cu_q, cu_k if cross else cu_q, max(lq),
                                              max(lk), causal=causal, deterministic=True)
                out.backward(dout)
                grads.append((qg.grad, kg.grad, vg.grad))
            torch.cuda.synchronize()
            what = f"deterministic {i}: H={heads} KV={kv_heads} D={head_dim} causal={causal} cross={cross}"
            for run in grads[1:]:
                for name, a, b in zip(("dQ", "dK", "dV"), grads[0], run):
                    self.assertTrue(torch.equal(a, b), f"{what}: {name} differs between runs")
            scale = 1.0 / math.sqrt(head_dim)
            _, _, rdq, rdk, rdv = kftest.reference(q, k, v, dout, lq, lk, causal, scale)
            problems = [p for p in (kftest.judge_bf16("dQ", grads[0][0], rdq),
                                    kftest.judge_bf16("dK", grads[0][1], rdk),
                                    kftest.judge_bf16("dV", grads[0][2], rdv)) if p]
            print(what, "ok" if not problems else problems, flush=True)
            self.assertEqual(problems, [], what)


if __name__ == "__main__":
    kftest.main()

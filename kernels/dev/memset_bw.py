# Times the driver's memsets of a backward's scratch range (cuMemsetD8Async
# against cuMemsetD32Async, and torch's zero_ for scale) on the GPU machine:
# the host zeroes dq_accum (total_q x heads x D fp32) before every launch.
#   python3 kernels/dev/memset_bw.py [MB ...]
import ctypes, sys, torch
cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
cu.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
torch.cuda.init()
sizes = [int(a) for a in sys.argv[1:]] or [1032, 1082, 64]
for mb in sizes:
    n = mb * (1 << 20)
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    st = torch.cuda.current_stream().cuda_stream
    def t(f, reps=20):
        f(); torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps): f()
        e1.record(); torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps * 1000
    d8 = t(lambda: cu.cuMemsetD8Async(x.data_ptr(), 0, n, st))
    d32 = t(lambda: cu.cuMemsetD32Async(x.data_ptr(), 0, n // 4, st))
    tz = t(lambda: x.zero_())
    print(f"{mb:6d} MB  D8 {d8:8.1f} us ({n / d8 / 1e6:5.2f} TB/s)  D32 {d32:8.1f} us ({n / d32 / 1e6:5.2f} TB/s)  torch zero_ {tz:8.1f} us")

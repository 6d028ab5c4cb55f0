# Compile-check fwd_sm90 (its parts + fwd_sm90.cuh, sm90_source.py) with NVRTC (no GPU
# needed). Prints the ptxas report. KF_SRC=file compiles that file instead (a whole kernel).
# usage: python3 nvrtc_check.py [KEY=VAL ...]   (knobs without the KF_ prefix)
import ctypes, sys, os, glob, time
from sm90_source import fwd_sm90_text
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
def find_nvrtc():
    for pat in ["/usr/local/cuda/lib64/libnvrtc.so*", "/usr/local/cuda/targets/*/lib/libnvrtc.so*"]:
        for f in sorted(glob.glob(pat)):
            if "builtins" not in f and "alt" not in f:
                return f
    raise SystemExit("libnvrtc not found")
nv = ctypes.CDLL(find_nvrtc())

def compile_src(knobs, arch="sm_90a", extra=()):
    src = "".join(f"#define KF_{k} {v}\n" for k, v in knobs.items())
    src += open(os.environ["KF_SRC"]).read() if os.environ.get("KF_SRC") else fwd_sm90_text()
    hdr = open(os.path.join(ROOT, "include", "kforge", "attn_params.h")).read()
    prog = ctypes.c_void_p()
    hdrs = (ctypes.c_char_p * 1)(hdr.encode())
    names = (ctypes.c_char_p * 1)(b"kforge/attn_params.h")
    r = nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"fwd_sm90.cu", 1, hdrs, names)
    assert r == 0, r
    opts = [f"--gpu-architecture={arch}", "-default-device", "--std=c++17",
            "--ptxas-options=-v", "--ptxas-options=--warn-on-spills", "-lineinfo"] + list(extra)
    copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t0 = time.time()
    r = nv.nvrtcCompileProgram(prog, len(opts), copts)
    dt = time.time() - t0
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    cubin = None
    if r == 0:
        nv.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        nv.nvrtcGetCUBIN(prog, buf)
        cubin = buf.raw
    return r, log.value.decode(errors="replace"), cubin, dt

if __name__ == "__main__":
    knobs = {"HEAD_DIM": 128, "BLOCK_N": 128, "STAGES": 2, "PERSISTENT": 1}
    for a in sys.argv[1:]:
        k, v = a.split("="); knobs[k] = int(v)
    r, log, cubin, dt = compile_src(knobs)
    print(knobs, "rc", r, f"{dt:.2f}s", "cubin", len(cubin) if cubin else None)
    print(log)

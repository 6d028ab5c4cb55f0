// Device-side helpers of the evaluator, compiled with NVRTC next to the
// reference. They exist for speed only: on a 500k-token batch, generating the
// inputs on the host, uploading them, downloading the fp32 reference and
// comparing on one CPU core took most of an evaluation. Each kernel mirrors a
// host function that stays the definition (named below), and the GPU tests
// hold the two to the same answers.
//
// No toolkit header is included: bf16 values are raw 16-bit patterns.

typedef unsigned long long kf_u64;

// Mirrors eval::DeviceTally (device_tools.h); the field order keeps the
// layout free of padding on both sides, and both sides assert its size.
struct KfTally {
  double num, den, max_abs, ref_max, worst;
  long long unwritten, nonfinite, first_bad, worst_at;
  unsigned int first_bad_bits, worst_bits;
  float first_bad_ref, worst_ref;
};
static_assert(sizeof(KfTally) == 88, "KfTally layout must match the host's");

#define KF_TALLY_THREADS 256

__device__ __forceinline__ unsigned short kf_to_bf16(float f) {
  // reference::FloatToBf16: round to nearest even, NaN stays NaN.
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

// eval::RandomBf16 with its state already drawn: element i uses the
// splitmix64 step state0 + (i + 1) * golden, and the same float operations in
// the same order (the _rn intrinsics stop any contraction into an FMA), so
// the values are bit-identical to the host's.
extern "C" __global__ void kf_fill_bf16(unsigned short* out, long long n, kf_u64 state0) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    kf_u64 z = state0 + (kf_u64)(i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float sum = __fadd_rn(__fadd_rn(__fadd_rn((float)(z & 0xffff), (float)((z >> 16) & 0xffff)),
                                    (float)((z >> 32) & 0xffff)),
                          (float)(z >> 48));
    float x = __fmul_rn(__fsub_rn(__fmul_rn(sum, 1.0f / 65536.0f), 2.0f), 1.7320508f);
    out[i] = kf_to_bf16(x);
  }
}

// fp32 -> bf16 (round to nearest even), e.g. the reference's O as the
// backward's input.
extern "C" __global__ void kf_to_bf16_kernel(unsigned short* out, const float* in, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = kf_to_bf16(in[i]);
  }
}

__device__ void kf_tally_init(KfTally& t) {
  t.num = t.den = t.max_abs = t.ref_max = 0.0;
  t.worst = -1.0;
  t.unwritten = t.nonfinite = 0;
  t.first_bad = -1;
  t.worst_at = 0;
  t.first_bad_bits = t.worst_bits = 0;
  t.first_bad_ref = t.worst_ref = 0.0f;
}

// Folds `b` into `a`: sums add, the first bad element is the one of lowest
// index, the worst is the largest error (lowest index on ties), as the host's
// single left-to-right pass finds them.
__device__ void kf_tally_merge(KfTally& a, const KfTally& b) {
  a.num += b.num;
  a.den += b.den;
  a.max_abs = fmax(a.max_abs, b.max_abs);
  a.ref_max = fmax(a.ref_max, b.ref_max);
  a.unwritten += b.unwritten;
  a.nonfinite += b.nonfinite;
  if (b.first_bad >= 0 && (a.first_bad < 0 || b.first_bad < a.first_bad)) {
    a.first_bad = b.first_bad;
    a.first_bad_bits = b.first_bad_bits;
    a.first_bad_ref = b.first_bad_ref;
  }
  if (b.worst > a.worst || (b.worst == a.worst && b.worst_at < a.worst_at)) {
    a.worst = b.worst;
    a.worst_at = b.worst_at;
    a.worst_bits = b.worst_bits;
    a.worst_ref = b.worst_ref;
  }
}

__device__ __forceinline__ void kf_tally_bad(KfTally& t, long long i, unsigned int bits, float r) {
  if (t.first_bad < 0) {  // a thread visits its indices in increasing order
    t.first_bad = i;
    t.first_bad_bits = bits;
    t.first_bad_ref = r;
  }
}

__device__ __forceinline__ void kf_tally_value(KfTally& t, long long i, unsigned int bits, float g,
                                               float r) {
  const double d = fabs((double)g - (double)r);
  t.num += d * d;
  t.den += (double)r * (double)r;
  if (d > t.max_abs) t.max_abs = d;
  if (d > t.worst) {
    t.worst = d;
    t.worst_at = i;
    t.worst_bits = bits;
    t.worst_ref = r;
  }
}

// Reduces the block's tallies and writes partials[blockIdx.x].
__device__ void kf_tally_finish(KfTally& mine, KfTally* partials) {
  __shared__ KfTally shared[KF_TALLY_THREADS];
  shared[threadIdx.x] = mine;
  __syncthreads();
  for (int half = KF_TALLY_THREADS / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) kf_tally_merge(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// eval::TallyBf16: a bf16 output against the fp32 reference.
extern "C" __global__ void __launch_bounds__(KF_TALLY_THREADS)
    kf_tally_bf16(const unsigned short* got, const float* ref, long long n, KfTally* partials) {
  KfTally t;
  kf_tally_init(t);
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float r = ref[i];
    t.ref_max = fmax(t.ref_max, fabs((double)r));
    const unsigned int bits = got[i];
    if (bits == 0x7fc0u) {  // kPoisonBf16: never written
      ++t.unwritten;
      kf_tally_bad(t, i, bits, r);
      continue;
    }
    const float g = __uint_as_float(bits << 16);
    if (!isfinite(g)) {
      ++t.nonfinite;
      kf_tally_bad(t, i, bits, r);
      continue;
    }
    kf_tally_value(t, i, bits, g, r);
  }
  kf_tally_finish(t, partials);
}

// eval::TallyLse: the fp32 LSE; a row whose reference is -inf (it sees no
// key) must be exactly -inf.
extern "C" __global__ void __launch_bounds__(KF_TALLY_THREADS)
    kf_tally_lse(const unsigned int* got, const float* ref, long long n, KfTally* partials) {
  KfTally t;
  kf_tally_init(t);
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float r = ref[i];
    if (isfinite(r)) t.ref_max = fmax(t.ref_max, fabs((double)r));  // rows with no key are -inf
    const unsigned int bits = got[i];
    const float g = __uint_as_float(bits);
    if (bits == 0x7fc00000u) {  // kPoisonF32
      ++t.unwritten;
      kf_tally_bad(t, i, bits, r);
    } else if (isinf(r) && r < 0.0f) {
      if (!(isinf(g) && g < 0.0f)) {
        ++t.nonfinite;
        kf_tally_bad(t, i, bits, r);
      }
    } else if (!isfinite(g)) {
      ++t.nonfinite;
      kf_tally_bad(t, i, bits, r);
    } else {
      kf_tally_value(t, i, bits, g, r);
    }
  }
  kf_tally_finish(t, partials);
}

// eval::Fingerprint: a 64-bit digest of `bytes` bytes, read as 16-bit
// words (an odd last byte on its own). Each word is mixed with its index and
// the mixes are summed, so the order in which threads add them does not
// matter (wrapping addition commutes) and the result is exact. Lanes sum
// within their warp first: one atomic per warp, not per thread.
__device__ __forceinline__ kf_u64 kf_mix(kf_u64 word, long long i) {
  kf_u64 z = (word << 48) ^ (kf_u64)i;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

extern "C" __global__ void kf_fingerprint(const unsigned short* words, long long bytes, kf_u64* out) {
  kf_u64 sum = 0;
  const long long n = bytes / 2;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long i = first; i < n; i += stride) sum += kf_mix(words[i], i);
  if ((bytes & 1) && first == 0) {
    sum += kf_mix(0x10000ull | ((const unsigned char*)words)[bytes - 1], n);
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(out, sum);
}

// The number of 32-bit words of `words` (n of them) that are not zero:
// whether a variant that restores its dq_accum (manifest restores_dq_accum)
// left every element zero. One atomic per warp.
extern "C" __global__ void kf_count_nonzero32(const unsigned* words, long long n, kf_u64* out) {
  kf_u64 count = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    count += words[i] != 0u;
  }
  for (int offset = 16; offset > 0; offset >>= 1) count += __shfl_xor_sync(0xffffffffu, count, offset);
  if (threadIdx.x % 32 == 0 && count > 0) atomicAdd(out, count);
}

// eval::StyleBf16: scales bf16 values in place and replaces about one in
// `period` by an outlier, with the host's float operations one by one.
extern "C" __global__ void kf_style_bf16(unsigned short* x, long long n, float scale, kf_u64 seed,
                                         unsigned period, float magnitude) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = __fmul_rn(__uint_as_float(((unsigned)x[i]) << 16), scale);
    if (period > 0) {
      kf_u64 z = seed ^ ((kf_u64)i * 0xd1b54a32d192ed03ull);
      z += 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      if (z % period == 0) {
        const float u = __fmul_rn((float)((z >> 32) & 0xffff), 1.0f / 65536.0f);
        const float m = __fmul_rn(magnitude, __fadd_rn(0.5f, __fmul_rn(0.5f, u)));
        v = (z >> 63) ? -m : m;
      }
    }
    x[i] = kf_to_bf16(v);
  }
}

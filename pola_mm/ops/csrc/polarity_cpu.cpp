// The fused CPU loop of the polarity attention kernel's inference
// (float32).
//
// Built on first use by pola_mm/ops/cpu_ext.py with
// torch.utils.cpp_extension.load; the Python kernel (polarity_kernel.py)
// falls back to plain torch operations when the build is unavailable. One
// pass over a run of tokens that the torch version does in six
// elementwise operations:
//
//   features:    f = [relu(t), relu(-t)], t = sign(xs) |xs|^p,
//                xs = x * inv + kbs; optional sums of f
//                over the tokens.
//
// |xs|^p is exp2(p log2|xs|) with the polynomial log2/exp2 below, written
// so that GCC vectorises the loops over channels without -ffast-math
// (accuracy: a few float32 ulps, the same as torch's exp(p * log|xs|)).
#include <torch/extension.h>

#include <cstdint>
#include <vector>

namespace {

constexpr float kTiny = 1.17549435e-38f;  // smallest normal float
constexpr int64_t kRows = 64;             // tokens per parallel block

inline float bits_to_float(int32_t i) { return __builtin_bit_cast(float, i); }
inline int32_t float_to_bits(float f) {
  return __builtin_bit_cast(int32_t, f);
}

// log2 of a positive normal float.
inline float log2_pos(float x) {
  const int32_t i = float_to_bits(x);
  int32_t e = ((i >> 23) & 0xff) - 127;
  float m = bits_to_float((i & 0x007fffff) | 0x3f800000);  // [1, 2)
  const bool big = m > 1.41421356f;                        // -> [0.71, 1.41)
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  // ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172
  const float s = (m - 1.f) / (m + 1.f);
  const float s2 = s * s;
  const float ln_m =
      2.f * s *
      (1.f + s2 * (0.33333334f +
                   s2 * (0.2f + s2 * (0.14285715f + s2 * 0.11111111f))));
  return ln_m * 1.44269504f + static_cast<float>(e);
}

// 2^x; 0 below the normal range (like torch's exp underflowing).
inline float exp2_(float x) {
  const bool under = x < -126.f;
  x = x < -126.f ? -126.f : x;
  x = x > 127.f ? 127.f : x;
  const float n = (x + 12582912.f) - 12582912.f;  // round to nearest
  const float y = (x - n) * 0.69314718f;          // |y| <= 0.35
  const float poly =
      1.f +
      y * (1.f +
           y * (0.5f +
                y * (0.16666667f +
                     y * (0.041666668f +
                          y * (0.008333334f +
                               y * (0.0013888889f + y * 0.0001984127f))))));
  const float r = poly * bits_to_float((static_cast<int32_t>(n) + 127) << 23);
  return under ? 0.f : r;
}

struct Seq {  // strides of a (B, h, n, c) tensor with unit channel stride
  float* ptr;
  int64_t sb, sh, sn;
  explicit Seq(const torch::Tensor& t)
      : ptr(t.data_ptr<float>()),
        sb(t.stride(0)),
        sh(t.stride(1)),
        sn(t.stride(2)) {}
  float* row(int64_t b, int64_t h, int64_t i) const {
    return ptr + b * sb + h * sh + i * sn;
  }
};

void check(const torch::Tensor& t, int64_t dim, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32,
              name, ": expected a float32 CPU tensor");
  TORCH_CHECK(t.dim() == dim, name, ": expected ", dim, " dims, got ",
              t.dim());
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name,
              ": channels must be contiguous");
}

// xs = x * inv (+ kb) of one row, into xs.
inline void scaled_row(const float* __restrict x, const float* __restrict kb,
                       const float* __restrict inv, int64_t d,
                       float* __restrict xs) {
  if (kb) {
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) xs[c] = x[c] * inv[c] + kb[c];
  } else {
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) xs[c] = x[c] * inv[c];
  }
}

// |xs| clamped to the smallest normal float, like the torch kernel's
// clamp_min: log2 stays finite and the features underflow to 0 at xs = 0.
inline float safe_abs(float xs) {
  const float a = __builtin_fabsf(xs);
  return a < kTiny ? kTiny : a;
}

// |xs|^p from a = safe_abs(xs) and l2 = log2_pos(a); a non-finite a (NaN or
// Inf) is returned as it is (exp2_ would clamp it to a finite 2^127), so
// non-finite inputs give non-finite features like the torch kernel's.
inline float abs_pow(float a, float l2, float p) {
  const float t = exp2_(p * l2);
  return a <= 3.40282347e38f ? t : a;
}

// One row of features: t = sign(xs)|xs|^p, split by sign.
inline void feature_row(const float* __restrict xsr,
                        const float* __restrict p, int64_t d,
                        float* __restrict fpos, float* __restrict fneg) {
#pragma omp simd
  for (int64_t c = 0; c < d; ++c) {
    const float xs = xsr[c];
    const float a = safe_abs(xs);
    const float t = abs_pow(a, log2_pos(a), p[c]);
    const bool pos = xs > 0.f;
    fpos[c] = pos ? t : 0.f;
    fneg[c] = pos ? 0.f : t;
  }
}

// The inputs of a feature computation: x (B, h, n, d); inv, p (h, d);
// kbs (1, h, n, d) or empty.
struct FeatureInputs {
  Seq x, kb;
  bool has_kb;
  const float* inv;
  const float* p;
  int64_t B, H, n, d, nblk;

  FeatureInputs(const torch::Tensor& x_, const torch::Tensor& inv_,
                const torch::Tensor& p_, const torch::Tensor& kbs)
      : x((check(x_, 4, "x"), x_)),
        kb(kbs.defined() && kbs.numel() > 0 ? (check(kbs, 4, "kbs"), kbs)
                                             : x_),
        has_kb(kbs.defined() && kbs.numel() > 0),
        inv(inv_.data_ptr<float>()),
        p(p_.data_ptr<float>()),
        B(x_.size(0)),
        H(x_.size(1)),
        n(x_.size(2)),
        d(x_.size(3)),
        nblk((x_.size(2) + kRows - 1) / kRows) {
    TORCH_CHECK(inv_.is_contiguous() && p_.is_contiguous() &&
                    inv_.numel() == H * d && p_.numel() == H * d,
                "inv, p: expected contiguous (h, d)");
  }

  void check_sums(const torch::Tensor& t, const char* name) const {
    TORCH_CHECK(t.is_contiguous() && t.numel() == B * H * nblk * 2 * d, name,
                ": expected contiguous (B, h, nblk, 2d)");
  }

  // Calls fn(b, h, slot, i0, i1, scaled) for every block of kRows tokens
  // [i0, i1) of every sequence, in parallel; slot = (b * H + h) * nblk +
  // blk indexes per-block outputs; scaled(i) returns xs of token i.
  template <class F>
  void for_each_block(F&& fn) const {
    at::parallel_for(0, B * H * nblk, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> buf(d);
      for (int64_t slot = lo; slot < hi; ++slot) {
        const int64_t blk = slot % nblk, bh = slot / nblk;
        const int64_t b = bh / H, h = bh % H;
        auto scaled = [&](int64_t i) -> const float* {
          scaled_row(x.row(b, h, i), has_kb ? kb.row(0, h, i) : nullptr,
                     inv + h * d, d, buf.data());
          return buf.data();
        };
        fn(b, h, slot, blk * kRows, std::min(n, (blk + 1) * kRows), scaled);
      }
    });
  }
};

}  // namespace

// Features of x (see FeatureInputs): f (B, h, n, 2d) output; fsum
// (B, h, nblk, 2d) output of per-block sums over tokens (blocks of kRows
// tokens) or empty.
void features(const torch::Tensor& x, const torch::Tensor& inv,
              const torch::Tensor& p, const torch::Tensor& kbs,
              torch::Tensor& f, torch::Tensor& fsum) {
  const FeatureInputs in(x, inv, p, kbs);
  const int64_t d = in.d;
  check(f, 4, "f");
  TORCH_CHECK(f.size(0) == in.B && f.size(1) == in.H && f.size(2) == in.n &&
                  f.size(3) == 2 * d,
              "f: expected (B, h, n, 2d)");
  const bool has_sum = fsum.defined() && fsum.numel() > 0;
  if (has_sum) in.check_sums(fsum, "fsum");
  const Seq fs(f);
  float* sp = has_sum ? fsum.data_ptr<float>() : nullptr;
  in.for_each_block([&](int64_t b, int64_t h, int64_t slot, int64_t i0,
                        int64_t i1, auto&& scaled) {
    const float* pw = in.p + h * d;
    float* acc = sp ? sp + slot * 2 * d : nullptr;
    if (acc)
      for (int64_t c = 0; c < 2 * d; ++c) acc[c] = 0.f;
    for (int64_t i = i0; i < i1; ++i) {
      float* fr = fs.row(b, h, i);
      feature_row(scaled(i), pw, d, fr, fr + d);
      if (acc) {
#pragma omp simd
        for (int64_t c = 0; c < 2 * d; ++c) acc[c] += fr[c];
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("features", &features, "polarity features (see polarity_cpu.cpp)");
}

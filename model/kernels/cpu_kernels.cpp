#include "model/kernels/cpu_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/kernels/dtype_dispatch.h"
#include "model/kernels/fused_function.h"

// The kernels are built on ATen's AVX2 vector types whatever flags the rest of the project is
// compiled with (x86-64 baseline, where at::vec falls back to scalar loops and scalar expf, slower
// than the ATen composition it should beat). Only the kernel templates between push_options and
// pop_options are compiled for AVX2, FMA and F16C, and they run only where ATen itself dispatches
// to AVX2 or AVX-512 (see kernels_run_here); anywhere else the layers run the composition.
// A template takes the target of the place it is defined, not of where it is instantiated, so the
// headers at::vec includes are included first, outside the region: nothing of theirs is compiled
// for AVX2, and only at::vec's own code (namespace at::vec::AVX2) and this file's kernels are.
// SLEEF's header stays inside: it only declares functions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLTRAIN_AVX2_KERNELS 1
#include <ATen/AccumulateType.h>
#include <ATen/NumericUtils.h>
#include <ATen/native/Math.h>
#include <ATen/native/cpu/zmath.h>
#include <ATen/native/quantized/AffineQuantizerBase.h>
#include <c10/util/BFloat16-math.h>
#include <c10/util/copysign.h>

#include <cfloat>
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
// The pragma changes the code generated, not the macros that headers test (SLEEF's declares its
// AVX2 functions only under __AVX__); set them as -mavx2 -mfma -mf16c would.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif
#include <ATen/cpu/vec/vec.h>

// Inside the region too: its templates take their target from here (see glue_math.h).
#include "model/kernels/glue_math.h"

namespace mltrain {
namespace {

#if MLTRAIN_AVX2_KERNELS
static_assert(std::is_same_v<at::vec::Vectorized<float>, at::vec::AVX2::Vectorized<float>>,
              "at::vec was included before the AVX2 region: its kernels would be scalar");
#endif

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

// Work per task of at::parallel_for: ATen's own grain for elementwise loops, so that small
// tensors stay on one thread.
constexpr int64_t kGrainElements = 32768;

// Rows summed into one partial of RMSNorm's weight gradient. Fixed, so that the order of the sum
// depends on the shape only, never on how many threads share the blocks.
constexpr int64_t kRowsPerBlock = 32;

int64_t row_grain(int64_t row_length) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, row_length));
}

// n <= kLanes values as fp32; the lanes past n are zero, so they add nothing to a sum.
inline Vec load(const float* p, int64_t n) {
  return n == kLanes ? Vec::loadu(p) : Vec::loadu(p, n);
}

inline Vec load(const c10::BFloat16* p, int64_t n) {
  if (n == kLanes) {
    Vec v;
    at::vec::load_fp32_from_bf16(p, v);
    return v;
  }
  __at_align__ float values[kLanes] = {};
  std::copy(p, p + n, values);
  return Vec::loadu(values);
}

inline void store(const Vec& v, float* p, int64_t n) { v.store(p, static_cast<int>(n)); }

#if MLTRAIN_AVX2_KERNELS
// at::vec converts bf16 16 lanes at a time; a row of 8 floats goes straight to 8 bf16 and back.
inline void store(const Vec& v, c10::BFloat16* p, int64_t n) {
  const __m128i packed = at::vec::cvtfp32_bf16(v);
  if (n == kLanes) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
    return;
  }
  __at_align__ c10::BFloat16 values[kLanes];
  _mm_store_si128(reinterpret_cast<__m128i*>(values), packed);
  std::copy(values, values + n, p);
}

inline Vec round_to_bf16(const Vec& v) {
  __m256 rounded;
  at::vec::cvtbf16_fp32(at::vec::cvtfp32_bf16(v), rounded);
  return rounded;
}
#else
inline void store(const Vec& v, c10::BFloat16* p, int64_t n) {
  at::vec::convert_float_bfloat16(v, v).store(p, static_cast<int>(n));
}

inline Vec round_to_bf16(const Vec& v) {
  return std::get<0>(at::vec::convert_bfloat16_float(at::vec::convert_float_bfloat16(v, v)));
}
#endif

// What the composition's .to(T) does to fp32 values that go on in fp32.
template <typename T>
Vec round_to(const Vec& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return round_to_bf16(v);
  }
}

// glue_math.h's device-dependent parts, on at::vec lanes.
struct LaneMath {
  // The exp ATen's softmax takes: a third faster than SLEEF's, whose cost dominates SwiGLU, and as
  // exact in its results (a few 1e-8).
  static Vec exp(const Vec& x) { return x.exp_u20(); }
  static float sqrt(float x) { return std::sqrt(x); }
  template <typename T>
  static Vec round(const Vec& v) {
    return round_to<T>(v);
  }
};

// Lane by lane in a fixed order: the same sum on every thread.
inline float sum_lanes(const Vec& v) {
  __at_align__ float lanes[kLanes];
  v.store(lanes);
  float sum = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) sum += lanes[k];
  return sum;
}

// ---- the kernels: raw rows in, raw rows out ----

// Each row of x normalised into out, its rstd into rstd. With delta (otherwise null), x + delta is
// written to sum, in x's dtype, and normalised instead: the residual add folded into the norm.
template <typename T, typename D, typename Out>
void rms_norm_rows(const T* x, const D* delta, const float* weight, float eps, int64_t rows,
                   int64_t dim, T* sum, Out* out, float* rstd) {
  at::parallel_for(0, rows, row_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * dim;
      const T* norm_input = delta == nullptr ? xr : sum + r * dim;
      Vec squares(0.0f);
      for (int64_t i = 0; i < dim; i += kLanes) {
        const int64_t n = std::min(kLanes, dim - i);
        Vec v = load(xr + i, n);
        if (delta != nullptr) {
          v = glue::residual_add<LaneMath, T>(v, load(delta + r * dim + i, n));
          store(v, sum + r * dim + i, n);
        }
        squares = squares + v * v;
      }
      const float inv = glue::rms_norm_rstd<LaneMath>(sum_lanes(squares), dim, eps);
      rstd[r] = inv;
      for (int64_t i = 0; i < dim; i += kLanes) {
        const int64_t n = std::min(kLanes, dim - i);
        store(glue::rms_norm_output<LaneMath, T>(load(norm_input + i, n), Vec(inv),
                                                 load(weight + i, n)),
              out + r * dim + i, n);
      }
    }
  });
}

// The weight's gradient, sum(grad * normed) over rows, goes through partials [blocks, dim], one per
// block of kRowsPerBlock rows, zeroed by the caller, then summed column by column in block order.
// grad_residual (otherwise null) is added to x's: the gradient of the sum's other use.
template <typename T, typename G>
void rms_norm_backward_rows(const G* grad, const T* grad_residual, const T* x, const float* weight,
                            const float* rstd, int64_t rows, int64_t dim, T* grad_x,
                            float* partials, float* grad_weight) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  at::parallel_for(0, blocks, row_grain(kRowsPerBlock * dim), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* partial = partials + b * dim;
      for (int64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) {
        const G* gr = grad + r * dim;
        const T* xr = x + r * dim;
        const Vec inv(rstd[r]);
        Vec dot(0.0f);
        for (int64_t i = 0; i < dim; i += kLanes) {
          const int64_t n = std::min(kLanes, dim - i);
          dot = dot + load(gr + i, n) * load(weight + i, n) * load(xr + i, n);
        }
        const Vec scale(glue::rms_norm_backward_scale<LaneMath>(rstd[r], sum_lanes(dot), dim));
        for (int64_t i = 0; i < dim; i += kLanes) {
          const int64_t n = std::min(kLanes, dim - i);
          const Vec g = load(gr + i, n);
          const Vec xv = load(xr + i, n);
          const Vec residual =
              grad_residual == nullptr ? Vec(0.0f) : load(grad_residual + r * dim + i, n);
          store(
              glue::rms_norm_grad_input<LaneMath>(g, xv, load(weight + i, n), inv, scale, residual),
              grad_x + r * dim + i, n);
          store(load(partial + i, n) + glue::rms_norm_grad_weight_term<LaneMath, T>(g, xv, inv),
                partial + i, n);
        }
      }
    }
  });
  at::parallel_for(0, dim, row_grain(blocks), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += kLanes) {
      const int64_t n = std::min(kLanes, end - i);
      Vec sum(0.0f);
      for (int64_t b = 0; b < blocks; ++b) sum = sum + load(partials + b * dim + i, n);
      store(sum, grad_weight + i, n);
    }
  });
}

// Rotates each row of D values (pairs i, i + D/2) by its position's angle, or with inverse by
// the transpose, which is backward's map from the output's gradient to the input's. Rows are
// [B, T, H] flattened, so row r is token r / heads and head r % heads; heads from rotated_heads on
// are copied as they are. The tables hold table_rows rows, T shared by the batch or B x T of each
// token's own position, and token i takes row i % table_rows.
template <typename T>
void rotate_rows(const T* x, const float* cos, const float* sin, int64_t rows, int64_t heads,
                 int64_t rotated_heads, int64_t table_rows, int64_t dim, bool inverse, T* out) {
  const int64_t half = dim / 2;
  at::parallel_for(0, rows, row_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (r % heads >= rotated_heads) {
        std::copy_n(x + r * dim, dim, out + r * dim);
        continue;
      }
      const int64_t t = (r / heads) % table_rows;
      const float* c = cos + t * dim;
      const float* s = sin + t * dim;
      const T* x1 = x + r * dim;
      const T* x2 = x1 + half;
      T* o1 = out + r * dim;
      T* o2 = o1 + half;
      for (int64_t i = 0; i < half; i += kLanes) {
        const int64_t n = std::min(kLanes, half - i);
        Vec first;
        Vec second;
        glue::rotate_pair<LaneMath>(load(x1 + i, n), load(x2 + i, n), load(c + i, n),
                                    load(s + i, n), load(c + half + i, n), load(s + half + i, n),
                                    inverse, first, second);
        store(first, o1 + i, n);
        store(second, o2 + i, n);
      }
    }
  });
}

// silu(gate) * up of each row of gate_up, [gate (width values), up (width values)], into out.
template <typename T>
void swiglu_rows(const T* gate_up, int64_t rows, int64_t width, T* out) {
  at::parallel_for(0, rows, row_grain(2 * width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = gate_up + r * 2 * width;
      const T* up = gate + width;
      T* o = out + r * width;
      for (int64_t i = 0; i < width; i += kLanes) {
        const int64_t n = std::min(kLanes, width - i);
        store(glue::swiglu_output<LaneMath>(load(gate + i, n), load(up + i, n)), o + i, n);
      }
    }
  });
}

// The gradient of swiglu_rows' input, rows of [gate's, up's], from its output's.
template <typename T>
void swiglu_backward_rows(const T* grad, const T* gate_up, int64_t rows, int64_t width,
                          T* grad_gate_up) {
  at::parallel_for(0, rows, row_grain(2 * width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* dy_row = grad + r * width;
      const T* gate = gate_up + r * 2 * width;
      const T* up = gate + width;
      T* grad_gate = grad_gate_up + r * 2 * width;
      T* grad_up = grad_gate + width;
      for (int64_t i = 0; i < width; i += kLanes) {
        const int64_t n = std::min(kLanes, width - i);
        Vec dgate;
        Vec dup;
        glue::swiglu_backward<LaneMath>(load(dy_row + i, n), load(gate + i, n), load(up + i, n),
                                        dgate, dup);
        store(dgate, grad_gate + i, n);
        store(dup, grad_up + i, n);
      }
    }
  });
}

}  // namespace
}  // namespace mltrain

#if MLTRAIN_AVX2_KERNELS
#pragma GCC pop_options
#undef __AVX__
#undef __AVX2__
#undef __FMA__
#undef __F16C__
#undef CPU_CAPABILITY
#undef CPU_CAPABILITY_AVX2
#endif

namespace mltrain {
namespace {

using fused_function::rows_of;

// Where ATen runs its own AVX2 or AVX-512 kernels (so not under ATEN_CPU_CAPABILITY=default).
bool kernels_run_here() {
#if MLTRAIN_AVX2_KERNELS
  static const bool avx2 = [] {
    const std::string capability = at::get_cpu_capability();
    return capability == "AVX2" || capability == "AVX512";
  }();
  return avx2;
#else
  return true;
#endif
}

// The kernels on tensors, for fused_function's entry points and autograd functions.
struct CpuDevice {
  static void check_input(const char* kernel, const char* name, const at::Tensor& t) {
    TORCH_CHECK(t.defined() && t.device().is_cpu(), kernel, ": ", name,
                " must be a CPU tensor; other devices run the ATen composition");
    TORCH_CHECK(fused_kernels_support(t.scalar_type()), kernel, ": ", name, " is ", t.scalar_type(),
                " on a CPU of capability ", at::get_cpu_capability(),
                ": the fused kernels take Float and BFloat16 where ATen runs AVX2 or better");
  }

  static fused_function::NormForward rms_norm_forward(const at::Tensor& x, const at::Tensor& delta,
                                                      const at::Tensor& weight, double eps,
                                                      at::ScalarType out_dtype) {
    const at::Tensor xc = x.contiguous();
    const at::Tensor dc = fused_function::contiguous_if_defined(delta);
    const at::Tensor wc = weight.contiguous();
    fused_function::NormForward result =
        fused_function::NormForward::empty_for(x, delta, out_dtype);
    for_activation_dtype(x.scalar_type(), [&](auto x_tag) {
      using T = decltype(x_tag);
      for_delta_dtype<T>(delta, [&](auto delta_tag) {
        using D = decltype(delta_tag);
        for_activation_dtype(out_dtype, [&](auto out_tag) {
          using Out = decltype(out_tag);
          rms_norm_rows(xc.const_data_ptr<T>(), dc.defined() ? dc.const_data_ptr<D>() : nullptr,
                        wc.const_data_ptr<float>(), static_cast<float>(eps), rows_of(x), x.size(-1),
                        result.sum.defined() ? result.sum.data_ptr<T>() : nullptr,
                        result.output.data_ptr<Out>(), result.rstd.data_ptr<float>());
        });
      });
    });
    return result;
  }

  static std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad,
                                                             const at::Tensor& grad_residual,
                                                             const at::Tensor& x_in,
                                                             const at::Tensor& weight_in,
                                                             const at::Tensor& rstd) {
    const at::Tensor x = x_in.contiguous();
    const at::Tensor weight = weight_in.contiguous();
    const at::Tensor g = grad.contiguous();
    const at::Tensor residual =
        fused_function::contiguous_if_defined(grad_residual, x.scalar_type());
    const int64_t dim = x.size(-1);
    const int64_t rows = rows_of(x);
    at::Tensor grad_x = at::empty_like(x);
    at::Tensor grad_weight = at::zeros_like(weight);
    if (rows == 0 || dim == 0) return {grad_x, grad_weight};
    at::Tensor partials = at::zeros({(rows + kRowsPerBlock - 1) / kRowsPerBlock, dim}, at::kFloat);
    for_activation_dtype(x.scalar_type(), [&](auto x_tag) {
      for_activation_dtype(g.scalar_type(), [&](auto grad_tag) {
        using T = decltype(x_tag);
        using G = decltype(grad_tag);
        rms_norm_backward_rows(g.const_data_ptr<G>(),
                               residual.defined() ? residual.const_data_ptr<T>() : nullptr,
                               x.const_data_ptr<T>(), weight.const_data_ptr<float>(),
                               rstd.const_data_ptr<float>(), rows, dim, grad_x.data_ptr<T>(),
                               partials.data_ptr<float>(), grad_weight.data_ptr<float>());
      });
    });
    return {grad_x, grad_weight};
  }

  static at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t rotated_heads, bool inverse) {
    const at::Tensor xc = x.contiguous();
    const at::Tensor cc = cos.contiguous();
    const at::Tensor sc = sin.contiguous();
    at::Tensor out = at::empty(x.sizes(), x.options());
    for_activation_dtype(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      rotate_rows(xc.const_data_ptr<T>(), cc.const_data_ptr<float>(), sc.const_data_ptr<float>(),
                  rows_of(x), x.size(2), rotated_heads, cos.numel() / x.size(3), x.size(3), inverse,
                  out.data_ptr<T>());
    });
    return out;
  }

  static at::Tensor swiglu_forward(const at::Tensor& gate_up) {
    const at::Tensor input = gate_up.contiguous();
    const int64_t width = gate_up.size(-1) / 2;
    std::vector<int64_t> sizes = gate_up.sizes().vec();
    sizes.back() = width;
    at::Tensor out = at::empty(sizes, gate_up.options());
    for_activation_dtype(gate_up.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      swiglu_rows(input.const_data_ptr<T>(), rows_of(gate_up), width, out.data_ptr<T>());
    });
    return out;
  }

  static at::Tensor swiglu_backward(const at::Tensor& grad, const at::Tensor& gate_up_in) {
    const at::Tensor gate_up = gate_up_in.contiguous();
    // The output's gradient comes in the output's dtype, gate_up's.
    const at::Tensor g = grad.to(gate_up.scalar_type()).contiguous();
    at::Tensor grad_gate_up = at::empty_like(gate_up);
    for_activation_dtype(gate_up.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      swiglu_backward_rows(g.const_data_ptr<T>(), gate_up.const_data_ptr<T>(), rows_of(gate_up),
                           gate_up.size(-1) / 2, grad_gate_up.data_ptr<T>());
    });
    return grad_gate_up;
  }
};

}  // namespace

bool fused_kernels_support(at::ScalarType dtype) {
  return (dtype == at::kFloat || dtype == at::kBFloat16) && kernels_run_here();
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return fused_function::rms_norm<CpuDevice>("fused_rms_norm", x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                     const at::Tensor& weight, double eps) {
  return fused_function::add_rms_norm<CpuDevice>("fused_add_rms_norm", x, delta, weight, eps);
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        std::optional<int64_t> rotated_heads) {
  return fused_function::rotary<CpuDevice>("fused_rotary", x, cos, sin,
                                           rotated_heads.value_or(x.dim() == 4 ? x.size(2) : 0));
}

at::Tensor fused_swiglu(const at::Tensor& gate_up) {
  return fused_function::swiglu<CpuDevice>("fused_swiglu", gate_up);
}

}  // namespace mltrain

#include "model/cpu_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

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

// Lane by lane in a fixed order: the same sum on every thread.
inline float sum_lanes(const Vec& v) {
  __at_align__ float lanes[kLanes];
  v.store(lanes);
  float sum = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) sum += lanes[k];
  return sum;
}

// ---- the kernels: raw rows in, raw rows out ----

template <typename T>
void rms_norm_rows(const T* x, const float* weight, float eps, int64_t rows, int64_t dim,
                   float* out, float* rstd) {
  at::parallel_for(0, rows, row_grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * dim;
      Vec squares(0.0f);
      for (int64_t i = 0; i < dim; i += kLanes) {
        const Vec v = load(xr + i, std::min(kLanes, dim - i));
        squares = squares + v * v;
      }
      // As the composition: mean, + eps in fp32, then 1 / sqrt.
      const float inv = 1.0f / std::sqrt(sum_lanes(squares) / static_cast<float>(dim) + eps);
      rstd[r] = inv;
      for (int64_t i = 0; i < dim; i += kLanes) {
        const int64_t n = std::min(kLanes, dim - i);
        store(round_to<T>(load(xr + i, n) * Vec(inv)) * load(weight + i, n), out + r * dim + i, n);
      }
    }
  });
}

// grad_x = rstd * gn - rstd^3 * mean(gn * x) * x with gn = grad * weight, in fp32. The weight's
// gradient, sum(grad * normed) over rows, goes through partials [blocks, dim], one per block of
// kRowsPerBlock rows, zeroed by the caller, then summed column by column in block order.
template <typename T>
void rms_norm_backward_rows(const float* grad, const T* x, const float* weight, const float* rstd,
                            int64_t rows, int64_t dim, T* grad_x, float* partials,
                            float* grad_weight) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  at::parallel_for(0, blocks, row_grain(kRowsPerBlock * dim), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* partial = partials + b * dim;
      for (int64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) {
        const float* gr = grad + r * dim;
        const T* xr = x + r * dim;
        const Vec inv(rstd[r]);
        Vec dot(0.0f);
        for (int64_t i = 0; i < dim; i += kLanes) {
          const int64_t n = std::min(kLanes, dim - i);
          dot = dot + load(gr + i, n) * load(weight + i, n) * load(xr + i, n);
        }
        const Vec scale(rstd[r] * rstd[r] * rstd[r] * sum_lanes(dot) / static_cast<float>(dim));
        for (int64_t i = 0; i < dim; i += kLanes) {
          const int64_t n = std::min(kLanes, dim - i);
          const Vec g = load(gr + i, n);
          const Vec xv = load(xr + i, n);
          store(inv * (g * load(weight + i, n)) - scale * xv, grad_x + r * dim + i, n);
          store(load(partial + i, n) + g * round_to<T>(xv * inv), partial + i, n);
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
        const Vec a = load(x1 + i, n);
        const Vec b = load(x2 + i, n);
        const Vec c1 = load(c + i, n);
        const Vec c2 = load(c + half + i, n);
        const Vec s1 = load(s + i, n);
        const Vec s2 = load(s + half + i, n);
        if (inverse) {
          store(a * c1 + b * s2, o1 + i, n);
          store(b * c2 - a * s1, o2 + i, n);
        } else {
          store(a * c1 - b * s1, o1 + i, n);
          store(b * c2 + a * s2, o2 + i, n);
        }
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
        const Vec g = load(gate + i, n);
        // silu as ATen writes it, x / (1 + exp(-x)), with the exp ATen's softmax takes: a third
        // faster than SLEEF's, whose cost dominates here, and as exact in the result (a few 1e-8).
        store(g / (Vec(1.0f) + g.neg().exp_u20()) * load(up + i, n), o + i, n);
      }
    }
  });
}

// The gradient of swiglu_rows' input, rows of [gate's, up's], from its output's.
template <typename T>
void swiglu_backward_rows(const T* grad, const T* gate_up, int64_t rows, int64_t width,
                          T* grad_gate_up) {
  at::parallel_for(0, rows, row_grain(2 * width), [&](int64_t begin, int64_t end) {
    const Vec one(1.0f);
    for (int64_t r = begin; r < end; ++r) {
      const T* dy_row = grad + r * width;
      const T* gate = gate_up + r * 2 * width;
      const T* up = gate + width;
      T* grad_gate = grad_gate_up + r * 2 * width;
      T* grad_up = grad_gate + width;
      for (int64_t i = 0; i < width; i += kLanes) {
        const int64_t n = std::min(kLanes, width - i);
        const Vec dy = load(dy_row + i, n);
        const Vec g = load(gate + i, n);
        const Vec sigmoid = one / (one + g.neg().exp_u20());
        store(dy * load(up + i, n) * sigmoid * (one + g * (one - sigmoid)), grad_gate + i, n);
        store(dy * (g * sigmoid), grad_up + i, n);
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

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The backward passes below are written as kernels, not as differentiable ATen ops: a backward
// with create_graph would build no graph of them, and its second derivatives would be silently
// wrong.
void check_once_differentiable() {
  TORCH_CHECK(!at::GradMode::is_enabled(),
              "mltrain's fused kernels are differentiable once: backward with create_graph is not "
              "supported (train.kernels: aten is)");
}

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

// Calls f with a value of the C++ type of dtype, one of those fused_kernels_support takes.
template <typename F>
void for_dtype(at::ScalarType dtype, const F& f) {
  if (dtype == at::kFloat) {
    f(float{});
  } else {
    f(c10::BFloat16{});
  }
}

// Whether autograd records the call: otherwise the kernels run without a node and keep nothing.
bool records_graph(std::initializer_list<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const at::Tensor& t) { return t.requires_grad(); });
}

void check_input(const char* kernel, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined() && t.device().is_cpu(), kernel, ": ", name,
              " must be a CPU tensor; other devices run the ATen composition");
  TORCH_CHECK(fused_kernels_support(t.scalar_type()), kernel, ": ", name, " is ", t.scalar_type(),
              " on a CPU of capability ", at::get_cpu_capability(),
              ": the fused kernels take Float and BFloat16 where ATen runs AVX2 or better");
}

int64_t rows_of(const at::Tensor& t) { return t.numel() == 0 ? 0 : t.numel() / t.size(-1); }

// ---- RMSNorm ----

// -> (output, rstd [rows])
std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                   double eps) {
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({rows_of(x)}, x.options().dtype(at::kFloat));
  for_dtype(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    rms_norm_rows(xc.const_data_ptr<T>(), wc.const_data_ptr<float>(), static_cast<float>(eps),
                  rows_of(x), x.size(-1), out.data_ptr<float>(), rstd.data_ptr<float>());
  });
  return {out, rstd};
}

class RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    auto [out, rstd] = rms_norm_forward(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor x = saved[0].contiguous();
    const at::Tensor weight = saved[1].contiguous();
    const at::Tensor& rstd = saved[2];
    const at::Tensor grad = grads[0].contiguous();
    const int64_t dim = x.size(-1);
    const int64_t rows = rows_of(x);
    at::Tensor grad_x = at::empty_like(x);
    at::Tensor grad_weight = at::zeros_like(weight);
    if (rows == 0 || dim == 0) return {grad_x, grad_weight, at::Tensor()};
    at::Tensor partials = at::zeros({(rows + kRowsPerBlock - 1) / kRowsPerBlock, dim}, at::kFloat);
    for_dtype(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      rms_norm_backward_rows(grad.const_data_ptr<float>(), x.const_data_ptr<T>(),
                             weight.const_data_ptr<float>(), rstd.const_data_ptr<float>(), rows,
                             dim, grad_x.data_ptr<T>(), partials.data_ptr<float>(),
                             grad_weight.data_ptr<float>());
    });
    return {grad_x, grad_weight, at::Tensor()};
  }
};

// ---- RoPE ----

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                  int64_t rotated_heads, bool inverse) {
  const at::Tensor xc = x.contiguous();
  const at::Tensor cc = cos.contiguous();
  const at::Tensor sc = sin.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  for_dtype(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    rotate_rows(xc.const_data_ptr<T>(), cc.const_data_ptr<float>(), sc.const_data_ptr<float>(),
                rows_of(x), x.size(2), rotated_heads, cos.numel() / x.size(3), x.size(3), inverse,
                out.data_ptr<T>());
  });
  return out;
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t rotated_heads) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["rotated_heads"] = rotated_heads;
    return rotate(x, cos, sin, rotated_heads, /*inverse=*/false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const variable_list tables = ctx->get_saved_variables();
    const int64_t rotated_heads = ctx->saved_data["rotated_heads"].toInt();
    return {rotate(grads[0], tables[0], tables[1], rotated_heads, /*inverse=*/true), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// ---- SwiGLU ----

at::Tensor swiglu_forward(const at::Tensor& gate_up) {
  const at::Tensor input = gate_up.contiguous();
  const int64_t width = gate_up.size(-1) / 2;
  std::vector<int64_t> sizes = gate_up.sizes().vec();
  sizes.back() = width;
  at::Tensor out = at::empty(sizes, gate_up.options());
  for_dtype(gate_up.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    swiglu_rows(input.const_data_ptr<T>(), rows_of(gate_up), width, out.data_ptr<T>());
  });
  return out;
}

class SwiGLUFunction : public torch::autograd::Function<SwiGLUFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    return swiglu_forward(gate_up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_once_differentiable();
    const at::Tensor gate_up = ctx->get_saved_variables()[0].contiguous();
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_gate_up = at::empty_like(gate_up);
    for_dtype(gate_up.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      swiglu_backward_rows(grad.const_data_ptr<T>(), gate_up.const_data_ptr<T>(), rows_of(gate_up),
                           gate_up.size(-1) / 2, grad_gate_up.data_ptr<T>());
    });
    return {grad_gate_up};
  }
};

}  // namespace

bool fused_kernels_support(at::ScalarType dtype) {
  return (dtype == at::kFloat || dtype == at::kBFloat16) && kernels_run_here();
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_input("fused_rms_norm", "x", x);
  check_input("fused_rms_norm", "weight", weight);
  TORCH_CHECK(weight.scalar_type() == at::kFloat, "fused_rms_norm: weight is ",
              weight.scalar_type(), ", it must be Float");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
              "fused_rms_norm: weight ", weight.sizes(), " does not match x ", x.sizes());
  if (records_graph({x, weight})) return RMSNormFunction::apply(x, weight, eps);
  return rms_norm_forward(x, weight, eps).first;
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        std::optional<int64_t> rotated_heads) {
  check_input("fused_rotary", "x", x);
  check_input("fused_rotary", "cos", cos);
  check_input("fused_rotary", "sin", sin);
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "fused_rotary: the tables must be Float");
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "fused_rotary: x is ", x.sizes(),
              ", it must be [B, T, H, D] with D even");
  const int64_t rotated = rotated_heads.value_or(x.size(2));
  TORCH_CHECK(rotated >= 0 && rotated <= x.size(2), "fused_rotary: ", rotated,
              " heads to rotate of x ", x.sizes());
  const bool shared_tables = cos.dim() == 2 && cos.size(0) == x.size(1);
  const bool tables_per_row =
      cos.dim() == 3 && cos.size(0) == x.size(0) && cos.size(1) == x.size(1);
  TORCH_CHECK(
      (shared_tables || tables_per_row) && cos.size(-1) == x.size(3) && sin.sizes() == cos.sizes(),
      "fused_rotary: tables cos ", cos.sizes(), " and sin ", sin.sizes(),
      " must both be [T, D] or [B, T, D] of x ", x.sizes());
  TORCH_CHECK(!(at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad())),
              "fused_rotary: the tables take no gradient");
  if (records_graph({x})) return RotaryFunction::apply(x, cos, sin, rotated);
  return rotate(x, cos, sin, rotated, /*inverse=*/false);
}

at::Tensor fused_swiglu(const at::Tensor& gate_up) {
  check_input("fused_swiglu", "gate_up", gate_up);
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "fused_swiglu: gate_up is ",
              gate_up.sizes(), ", its last dimension must hold gate and up, of one width");
  if (records_graph({gate_up})) return SwiGLUFunction::apply(gate_up);
  return swiglu_forward(gate_up);
}

}  // namespace mltrain

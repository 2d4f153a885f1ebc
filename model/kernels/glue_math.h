#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

// The arithmetic of the fused glue kernels, written once for every device: the CPU kernels
// (cpu_kernels.cpp) run it on at::vec lanes, the CUDA kernels (cuda_launch.cu) on one float per
// thread, and tests/model/glue_math_test.cpp runs the CUDA kernels' instantiation on the CPU
// against the ATen compositions. Only the loops, the loads and stores, and the reductions across a
// row differ between devices.
//
// Each function is a template over Math, what differs between devices, and V, what a kernel
// computes in (float, or a vector of floats). Math gives Math::exp(V), Math::sqrt(float),
// Math::log(float) and Math::template round<T>(V), which rounds fp32 values to T and back as the
// composition's .to(T) does to values that go on in fp32. Inputs of every dtype are loaded as fp32;
// every result is computed in fp32 and rounded once, on store.
//
// Every function takes Math, even where only V would do, so that each device's instantiations are
// its own: the CPU's are compiled for AVX2 (cpu_kernels.cpp, with a Math of internal linkage) and
// must never be the copy the linker keeps for another caller on a machine without it. For the same
// reason this header defines no function that is not a template over Math: the CUDA kernels' Math
// is scalar_math.h's, which cpu_kernels.cpp does not include.
namespace mltrain::glue {

// ---- RMSNorm: x / sqrt(mean(x^2) + eps), rounded to x's dtype, times the fp32 weight ----

// The residual add folded into the norm that follows it: x + delta rounded to x's dtype T, as the
// composition's x + delta is wherever the sum keeps x's dtype (fp32 + fp32 or bf16, bf16 + bf16).
// The norm's statistic is taken of the rounded sum, the value the composition normalises.
template <typename Math, typename T, typename V>
C10_HOST_DEVICE V residual_add(V x, V delta) {
  return Math::template round<T>(x + delta);
}

// 1 / sqrt(mean + eps) of a row's sum of squares: mean, + eps in fp32, then 1 / sqrt, as the
// composition's rsqrt(x32.pow(2).mean(-1) + eps).
template <typename Math>
C10_HOST_DEVICE float rms_norm_rstd(float sum_of_squares, int64_t dim, float eps) {
  return 1.0f / Math::sqrt(sum_of_squares / static_cast<float>(dim) + eps);
}

template <typename Math, typename T, typename V>
C10_HOST_DEVICE V rms_norm_output(V x, V rstd, V weight) {
  return Math::template round<T>(x * rstd) * weight;
}

// Backward, with g the output's gradient: grad_x = rstd * g * w - rstd^3 * mean(g * w * x) * x,
// plus grad_residual, the gradient x takes on the residual stream where the add is folded in (zero
// where it is not). The row's part, from its sum of g * w * x:
template <typename Math>
C10_HOST_DEVICE float rms_norm_backward_scale(float rstd, float dot, int64_t dim) {
  return rstd * rstd * rstd * dot / static_cast<float>(dim);
}

template <typename Math, typename V>
C10_HOST_DEVICE V rms_norm_grad_input(V grad, V x, V weight, V rstd, V scale, V grad_residual) {
  return rstd * (grad * weight) - scale * x + grad_residual;
}

// One row's term of the weight's gradient, sum over rows of g * normed.
template <typename Math, typename T, typename V>
C10_HOST_DEVICE V rms_norm_grad_weight_term(V grad, V x, V rstd) {
  return grad * Math::template round<T>(x * rstd);
}

// ---- RoPE, rotate-half: the pair (a, b) = (x[i], x[i + D/2]) by the tables at i and i + D/2 ----

// Forward rotates by the angle; inverse by its negative, which is the transpose of the rotation and
// so backward's map from the output's gradient to the input's.
template <typename Math, typename V>
C10_HOST_DEVICE void rotate_pair(V a, V b, V cos_first, V sin_first, V cos_second, V sin_second,
                                 bool inverse, V& first, V& second) {
  if (inverse) {
    first = a * cos_first + b * sin_second;
    second = b * cos_second - a * sin_first;
  } else {
    first = a * cos_first - b * sin_first;
    second = b * cos_second + a * sin_second;
  }
}

// ---- SwiGLU: silu(gate) * up ----

// silu as ATen writes it, x / (1 + exp(-x)).
template <typename Math, typename V>
C10_HOST_DEVICE V swiglu_output(V gate, V up) {
  return gate / (V(1.0f) + Math::exp(V(0.0f) - gate)) * up;
}

template <typename Math, typename V>
C10_HOST_DEVICE void swiglu_backward(V grad, V gate, V up, V& grad_gate, V& grad_up) {
  const V one(1.0f);
  const V sigmoid = one / (one + Math::exp(V(0.0f) - gate));
  grad_gate = grad * up * sigmoid * (one + gate * (one - sigmoid));
  grad_up = grad * (gate * sigmoid);
}

// ---- Cross-entropy of a row of logits against its target ----

// A row's softmax statistics, gathered online over its logits in any order and merged across
// threads: the largest logit seen and the sum of exp(logit - largest). A -inf logit adds nothing,
// as exp(-inf) is 0; a NaN makes the sum NaN, and merging keeps it so.
template <typename Math>
struct SoftmaxStatistics {
  float max = -INFINITY;
  float sum = 0.0f;

  C10_HOST_DEVICE void add(float logit) {
    if (logit == -INFINITY) return;
    if (logit > max) {
      sum = sum * Math::exp(max - logit) + 1.0f;
      max = logit;
    } else {
      sum += Math::exp(logit - max);
    }
  }

  // Statistics of nothing (no logit, or only -inf) have sum 0, which only they have.
  C10_HOST_DEVICE void merge(const SoftmaxStatistics& other) {
    if (other.sum == 0.0f) return;
    if (sum == 0.0f) {
      *this = other;
      return;
    }
    const float larger = max > other.max ? max : other.max;
    sum = sum * Math::exp(max - larger) + other.sum * Math::exp(other.max - larger);
    max = larger;
  }

  // log(sum(exp(logit - max))): a row's log-sum-exp less its max, kept apart from the max so that
  // neither loss nor gradient rounds a sum at the logits' magnitude (as ATen's log-softmax).
  C10_HOST_DEVICE float log_sum() const { return Math::log(sum); }
};

// A row's loss: -log(softmax at the target).
template <typename Math>
C10_HOST_DEVICE float cross_entropy_loss(float target_logit, float max, float log_sum) {
  return log_sum - (target_logit - max);
}

// The gradient of the mean loss at one logit: (softmax - one-hot) times `scale`, the loss's
// gradient over the number of rows.
template <typename Math>
C10_HOST_DEVICE float cross_entropy_grad(float logit, float max, float log_sum, bool is_target,
                                         float scale) {
  return (Math::exp((logit - max) - log_sum) - (is_target ? 1.0f : 0.0f)) * scale;
}

}  // namespace mltrain::glue

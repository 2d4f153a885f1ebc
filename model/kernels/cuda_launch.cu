#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

#include "model/kernels/cuda_launch.h"
#include "model/kernels/dtype_dispatch.h"
#include "model/kernels/glue_math.h"
#include "model/kernels/scalar_math.h"

// Plain CUDA: one block per row where a row is reduced (RMSNorm, cross-entropy), one thread per
// element or pair elsewhere, fp32 arithmetic from glue_math.h in every thread. Sums across a row
// go through warp shuffles and then across warps in a fixed order, so results repeat run to run.
namespace mltrain::cuda_launch {
namespace {

using glue::ScalarMath;

constexpr int kWarp = 32;
constexpr int kRowThreads = 256;           // a block per RMSNorm row
constexpr int kCrossEntropyThreads = 512;  // a block per row of logits
constexpr int kElementThreads = 256;
constexpr int kRotaryThreads = 32;  // a warp across a head's pairs
constexpr int kRotaryTokens = 8;    // tokens of a rotary block, one per warp
// Rows of one partial sum of RMSNorm's weight gradient: fixed, so the order of the sum depends on
// the shape alone.
constexpr int64_t kRowsPerPartial = 64;
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y and gridDim.z

__device__ float warp_sum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// The sum over the block, to every thread; blockDim.x is a multiple of kWarp.
__device__ float block_sum(float value) {
  __shared__ float warp_sums[kWarp];
  value = warp_sum(value);
  const unsigned lane = threadIdx.x % kWarp;
  if (lane == 0) warp_sums[threadIdx.x / kWarp] = value;
  __syncthreads();
  value = lane < blockDim.x / kWarp ? warp_sums[lane] : 0.0f;
  value = warp_sum(value);
  __syncthreads();  // before warp_sums is written again
  return value;
}

using Statistics = glue::SoftmaxStatistics<ScalarMath>;

__device__ Statistics warp_merge(Statistics statistics) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    Statistics other;
    other.max = __shfl_xor_sync(0xffffffffu, statistics.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, statistics.sum, offset);
    statistics.merge(other);
  }
  return statistics;
}

// The merged statistics of the block, valid in thread 0.
__device__ Statistics block_merge(Statistics statistics) {
  __shared__ float maxima[kWarp];
  __shared__ float sums[kWarp];
  statistics = warp_merge(statistics);
  const unsigned lane = threadIdx.x % kWarp;
  if (lane == 0) {
    maxima[threadIdx.x / kWarp] = statistics.max;
    sums[threadIdx.x / kWarp] = statistics.sum;
  }
  __syncthreads();
  Statistics merged;
  if (threadIdx.x < kWarp && lane < blockDim.x / kWarp) {
    merged.max = maxima[lane];
    merged.sum = sums[lane];
  }
  return threadIdx.x < kWarp ? warp_merge(merged) : merged;
}

// ---- RMSNorm ----

// With delta (otherwise null), x + delta goes to sum, in x's dtype, and is normalised instead.
template <typename T, typename D, typename Out>
__global__ void rms_norm_forward_kernel(const T* x, const D* delta, const float* weight, float eps,
                                        int64_t dim, T* sum, Out* out, float* rstd) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = static_cast<float>(xr[i]);
    if (delta != nullptr) {
      v = glue::residual_add<ScalarMath, T>(v, static_cast<float>(delta[row * dim + i]));
      sum[row * dim + i] = static_cast<T>(v);
    }
    squares += v * v;
  }
  // Each thread reads back only the sums it wrote: no barrier needed beyond block_sum's.
  const T* norm_input = delta == nullptr ? xr : sum + row * dim;
  const float inv = glue::rms_norm_rstd<ScalarMath>(block_sum(squares), dim, eps);
  if (threadIdx.x == 0) rstd[row] = inv;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    out[row * dim + i] = static_cast<Out>(
        glue::rms_norm_output<ScalarMath, T>(static_cast<float>(norm_input[i]), inv, weight[i]));
  }
}

// grad_residual (otherwise null): the sum's gradient from its other use, added to x's.
template <typename T, typename G>
__global__ void rms_norm_grad_input_kernel(const G* grad, const T* grad_residual, const T* x,
                                           const float* weight, const float* rstd, int64_t dim,
                                           T* grad_x) {
  const int64_t row = blockIdx.x;
  const G* gr = grad + row * dim;
  const T* xr = x + row * dim;
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    dot += static_cast<float>(gr[i]) * weight[i] * static_cast<float>(xr[i]);
  }
  const float inv = rstd[row];
  const float scale = glue::rms_norm_backward_scale<ScalarMath>(inv, block_sum(dot), dim);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float residual =
        grad_residual == nullptr ? 0.0f : static_cast<float>(grad_residual[row * dim + i]);
    grad_x[row * dim + i] = static_cast<T>(glue::rms_norm_grad_input<ScalarMath>(
        static_cast<float>(gr[i]), static_cast<float>(xr[i]), weight[i], inv, scale, residual));
  }
}

// partials [blocks, dim]: each the sum over kRowsPerPartial rows, a column per thread.
template <typename T, typename G>
__global__ void rms_norm_weight_partials_kernel(const G* grad, const T* x, const float* rstd,
                                                int64_t rows, int64_t dim, float* partials) {
  const int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (column >= dim) return;
  const int64_t blocks = (rows + kRowsPerPartial - 1) / kRowsPerPartial;
  for (int64_t block = blockIdx.y; block < blocks; block += gridDim.y) {
    const int64_t first = block * kRowsPerPartial;
    const int64_t last = first + kRowsPerPartial < rows ? first + kRowsPerPartial : rows;
    float sum = 0.0f;
    for (int64_t r = first; r < last; ++r) {
      sum += glue::rms_norm_grad_weight_term<ScalarMath, T>(
          static_cast<float>(grad[r * dim + column]), static_cast<float>(x[r * dim + column]),
          rstd[r]);
    }
    partials[block * dim + column] = sum;
  }
}

__global__ void sum_partials_kernel(const float* partials, int64_t blocks, int64_t dim,
                                    float* out) {
  const int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (column >= dim) return;
  float sum = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) sum += partials[b * dim + column];
  out[column] = sum;
}

// ---- RoPE ----

// A block of kRotaryThreads pairs of kRotaryTokens tokens of one head of one sequence: the grid is
// (tokens / kRotaryTokens, heads, sequences, which stride past kMaxGridY), so a thread finds its
// row and its tables' row with no division, and a head that is copied is copied by whole blocks.
// Each thread takes the pairs (i, i + D/2) of its token from threadIdx.x on, kRotaryThreads apart.
// The tables hold T rows shared by the batch, or B x T of each token's own position
// (per_row_tables).
template <typename T>
__global__ void rotary_kernel(const T* x, const float* cos, const float* sin, int64_t sequences,
                              int64_t tokens, int64_t heads, int64_t rotated_heads,
                              bool per_row_tables, int64_t dim, bool inverse, T* out) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (token >= tokens) return;
  const int64_t head = blockIdx.y;
  const int64_t half = dim / 2;
  for (int64_t sequence = blockIdx.z; sequence < sequences; sequence += gridDim.z) {
    const int64_t row = ((sequence * tokens + token) * heads + head) * dim;
    const int64_t table = (per_row_tables ? sequence * tokens + token : token) * dim;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const int64_t at = row + i;
      if (head >= rotated_heads) {
        out[at] = x[at];
        out[at + half] = x[at + half];
        continue;
      }
      float first;
      float second;
      glue::rotate_pair<ScalarMath>(static_cast<float>(x[at]), static_cast<float>(x[at + half]),
                                    cos[table + i], sin[table + i], cos[table + half + i],
                                    sin[table + half + i], inverse, first, second);
      out[at] = static_cast<T>(first);
      out[at + half] = static_cast<T>(second);
    }
  }
}

// ---- SwiGLU ----

// The grid is (width / kElementThreads, rows): a thread per column of a row, rows kMaxGridY apart
// beyond the grid, so that no thread divides to find its row.
template <typename T>
__global__ void swiglu_forward_kernel(const T* gate_up, int64_t rows, int64_t width, T* out) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= width) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t gate = row * 2 * width + column;
    out[row * width + column] = static_cast<T>(glue::swiglu_output<ScalarMath>(
        static_cast<float>(gate_up[gate]), static_cast<float>(gate_up[gate + width])));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* grad, const T* gate_up, int64_t rows, int64_t width,
                                       T* grad_gate_up) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= width) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t gate = row * 2 * width + column;
    float grad_gate;
    float grad_up;
    glue::swiglu_backward<ScalarMath>(
        static_cast<float>(grad[row * width + column]), static_cast<float>(gate_up[gate]),
        static_cast<float>(gate_up[gate + width]), grad_gate, grad_up);
    grad_gate_up[gate] = static_cast<T>(grad_gate);
    grad_gate_up[gate + width] = static_cast<T>(grad_up);
  }
}

// ---- Cross-entropy ----

// A block per row: the row's softmax statistics, then its loss.
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const int64_t* targets, int64_t vocab,
                                             float* loss, float* row_max, float* row_log_sum) {
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;
  Statistics statistics;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    statistics.add(static_cast<float>(lr[j]));
  }
  statistics = block_merge(statistics);
  if (threadIdx.x == 0) {
    const int64_t target = targets[row];
    CUDA_KERNEL_ASSERT(target >= 0 && target < vocab);
    const float log_sum = statistics.log_sum();
    row_max[row] = statistics.max;
    row_log_sum[row] = log_sum;
    loss[row] = glue::cross_entropy_loss<ScalarMath>(static_cast<float>(lr[target]), statistics.max,
                                                     log_sum);
  }
}

// A block per row again, its threads across the row: each row's statistics and target read once.
template <typename T>
__global__ void cross_entropy_backward_kernel(const float* grad_loss, const T* logits,
                                              const int64_t* targets, const float* row_max,
                                              const float* row_log_sum, int64_t rows, int64_t vocab,
                                              T* grad_logits) {
  const int64_t row = blockIdx.x;
  const float scale = *grad_loss / static_cast<float>(rows);
  const float max = row_max[row];
  const float log_sum = row_log_sum[row];
  const int64_t target = targets[row];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    grad_logits[row * vocab + j] = static_cast<T>(glue::cross_entropy_grad<ScalarMath>(
        static_cast<float>(logits[row * vocab + j]), max, log_sum, j == target, scale));
  }
}

// ---- launching ----

int64_t rows_of(const at::Tensor& t) { return t.numel() == 0 ? 0 : t.numel() / t.size(-1); }

unsigned column_blocks(int64_t dim) {
  return static_cast<unsigned>((dim + kElementThreads - 1) / kElementThreads);
}

// A grid's y or z extent for `rows`, past which its kernels stride.
unsigned grid_rows(int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxGridY)); }

// What every launch starts with: the tensor's device made current, and that device's current
// stream.
struct LaunchOn {
  explicit LaunchOn(const at::Tensor& t)
      : guard(t.device()), stream(c10::cuda::getCurrentCUDAStream()) {}
  const c10::cuda::CUDAGuard guard;
  const cudaStream_t stream;
};

}  // namespace

bool built() { return true; }

void rms_norm_forward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                      double eps, const at::Tensor& sum, const at::Tensor& out,
                      const at::Tensor& rstd) {
  const int64_t rows = rows_of(x);
  if (rows == 0) return;
  const LaunchOn launch(x);
  for_activation_dtype(x.scalar_type(), [&](auto x_tag) {
    using T = decltype(x_tag);
    for_delta_dtype<T>(delta, [&](auto delta_tag) {
      using D = decltype(delta_tag);
      for_activation_dtype(out.scalar_type(), [&](auto out_tag) {
        using Out = decltype(out_tag);
        rms_norm_forward_kernel<T, D, Out>
            <<<static_cast<unsigned>(rows), kRowThreads, 0, launch.stream>>>(
                x.const_data_ptr<T>(), delta.defined() ? delta.const_data_ptr<D>() : nullptr,
                weight.const_data_ptr<float>(), static_cast<float>(eps), x.size(-1),
                sum.defined() ? sum.mutable_data_ptr<T>() : nullptr, out.mutable_data_ptr<Out>(),
                rstd.mutable_data_ptr<float>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

void rms_norm_backward(const at::Tensor& grad, const at::Tensor& grad_residual, const at::Tensor& x,
                       const at::Tensor& weight, const at::Tensor& rstd, const at::Tensor& grad_x,
                       const at::Tensor& grad_weight) {
  const int64_t rows = rows_of(x);
  const int64_t dim = x.size(-1);
  if (rows == 0) {
    grad_weight.zero_();
    return;
  }
  const LaunchOn launch(x);
  const int64_t blocks = (rows + kRowsPerPartial - 1) / kRowsPerPartial;
  const at::Tensor partials = at::empty({blocks, dim}, weight.options());
  for_activation_dtype(x.scalar_type(), [&](auto x_tag) {
    using T = decltype(x_tag);
    for_activation_dtype(grad.scalar_type(), [&](auto grad_tag) {
      using G = decltype(grad_tag);
      rms_norm_grad_input_kernel<T, G>
          <<<static_cast<unsigned>(rows), kRowThreads, 0, launch.stream>>>(
              grad.const_data_ptr<G>(),
              grad_residual.defined() ? grad_residual.const_data_ptr<T>() : nullptr,
              x.const_data_ptr<T>(), weight.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
              dim, grad_x.mutable_data_ptr<T>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const dim3 grid(column_blocks(dim), grid_rows(blocks));
      rms_norm_weight_partials_kernel<T, G><<<grid, kElementThreads, 0, launch.stream>>>(
          grad.const_data_ptr<G>(), x.const_data_ptr<T>(), rstd.const_data_ptr<float>(), rows, dim,
          partials.mutable_data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  sum_partials_kernel<<<column_blocks(dim), kElementThreads, 0, launch.stream>>>(
      partials.const_data_ptr<float>(), blocks, dim, grad_weight.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
            int64_t rotated_heads, bool inverse, const at::Tensor& out) {
  if (x.numel() == 0) return;
  const int64_t sequences = x.size(0);
  const int64_t tokens = x.size(1);
  const int64_t heads = x.size(2);
  TORCH_CHECK(heads <= kMaxGridY, "rotary: ", heads, " heads: the CUDA kernel takes at most ",
              kMaxGridY);
  const LaunchOn launch(x);
  const dim3 grid(static_cast<unsigned>((tokens + kRotaryTokens - 1) / kRotaryTokens),
                  static_cast<unsigned>(heads), grid_rows(sequences));
  const dim3 block(kRotaryThreads, kRotaryTokens);
  for_activation_dtype(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<T><<<grid, block, 0, launch.stream>>>(
        x.const_data_ptr<T>(), cos.const_data_ptr<float>(), sin.const_data_ptr<float>(), sequences,
        tokens, heads, rotated_heads, /*per_row_tables=*/cos.dim() == 3, x.size(3), inverse,
        out.mutable_data_ptr<T>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void swiglu_forward(const at::Tensor& gate_up, const at::Tensor& out) {
  if (out.numel() == 0) return;
  const LaunchOn launch(gate_up);
  const int64_t width = out.size(-1);
  const int64_t rows = rows_of(out);
  for_activation_dtype(gate_up.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<T>
        <<<dim3(column_blocks(width), grid_rows(rows)), kElementThreads, 0, launch.stream>>>(
            gate_up.const_data_ptr<T>(), rows, width, out.mutable_data_ptr<T>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void swiglu_backward(const at::Tensor& grad, const at::Tensor& gate_up,
                     const at::Tensor& grad_gate_up) {
  if (grad.numel() == 0) return;
  const LaunchOn launch(gate_up);
  const int64_t width = grad.size(-1);
  const int64_t rows = rows_of(grad);
  for_activation_dtype(gate_up.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T>
        <<<dim3(column_blocks(width), grid_rows(rows)), kElementThreads, 0, launch.stream>>>(
            grad.const_data_ptr<T>(), gate_up.const_data_ptr<T>(), rows, width,
            grad_gate_up.mutable_data_ptr<T>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cross_entropy_forward(const at::Tensor& logits, const at::Tensor& targets,
                           const at::Tensor& loss, const at::Tensor& row_max,
                           const at::Tensor& row_log_sum) {
  const int64_t rows = rows_of(logits);
  if (rows == 0) return;
  const LaunchOn launch(logits);
  for_activation_dtype(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_forward_kernel<T>
        <<<static_cast<unsigned>(rows), kCrossEntropyThreads, 0, launch.stream>>>(
            logits.const_data_ptr<T>(), targets.const_data_ptr<int64_t>(), logits.size(-1),
            loss.mutable_data_ptr<float>(), row_max.mutable_data_ptr<float>(),
            row_log_sum.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cross_entropy_backward(const at::Tensor& grad_loss, const at::Tensor& logits,
                            const at::Tensor& targets, const at::Tensor& row_max,
                            const at::Tensor& row_log_sum, const at::Tensor& grad_logits) {
  const int64_t rows = rows_of(logits);
  if (rows == 0) return;
  const LaunchOn launch(logits);
  for_activation_dtype(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T>
        <<<static_cast<unsigned>(rows), kCrossEntropyThreads, 0, launch.stream>>>(
            grad_loss.const_data_ptr<float>(), logits.const_data_ptr<T>(),
            targets.const_data_ptr<int64_t>(), row_max.const_data_ptr<float>(),
            row_log_sum.const_data_ptr<float>(), rows, logits.size(-1),
            grad_logits.mutable_data_ptr<T>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace mltrain::cuda_launch

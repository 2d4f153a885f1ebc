#include "model/kernels/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>

namespace mltrain {
namespace {

// A chunk's fp32 logits take about this much: 256 rows of the 4096-token vocabulary, enough rows
// for each chunk's matmuls to run near full speed, while the chunk's logits, softmax and gradient
// (a few such buffers) stay negligible next to the [B, T, V] logits they replace.
constexpr int64_t kChunkLogitsBytes = int64_t{4} << 20;

// What one pass over the chunks produces. The gradients are undefined unless asked for.
struct ChunkedPass {
  at::Tensor row_losses;   // [N] fp32
  at::Tensor grad_hidden;  // [N, d], hidden's dtype
  at::Tensor grad_weight;  // [V, d], weight's dtype, summed over the chunks in fp32
};

// The dtype at::linear would multiply in: autocast's, when it is on for this device.
at::ScalarType compute_dtype(const at::Tensor& hidden) {
  const c10::DeviceType device = hidden.device().type();
  if (at::autocast::is_autocast_enabled(device)) return at::autocast::get_autocast_dtype(device);
  return hidden.scalar_type();
}

// out = a @ b, written straight into out when the dtypes allow (out is a row block of a buffer).
void matmul_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {
  if (out.scalar_type() == a.scalar_type()) {
    at::mm_out(out, a, b);
  } else {
    out.copy_(at::mm(a, b));
  }
}

// sum += a @ b, sum in fp32 whatever the dtype of a and b.
void accumulate_matmul(at::Tensor& sum, const at::Tensor& a, const at::Tensor& b) {
  if (sum.scalar_type() == a.scalar_type()) {
    sum.addmm_(a, b);
  } else {
    sum.add_(at::mm(a, b));
  }
}

// The loss of the rows' losses: their mean, or their sum weighted by row_weights.
at::Tensor combined(const at::Tensor& row_losses, const at::Tensor& row_weights) {
  return row_weights.defined() ? row_losses.mul(row_weights).sum() : row_losses.mean();
}

ChunkedPass run_chunks(const at::Tensor& hidden, const at::Tensor& weight,
                       const at::Tensor& targets, const at::Tensor& row_weights, int64_t chunk_rows,
                       bool want_grad_hidden, bool want_grad_weight) {
  const at::ScalarType dtype = compute_dtype(hidden);
  // The casts autocast would make are made here, once per call rather than once per chunk; below,
  // every op runs in the dtype it is written in (the softmax must stay fp32 in any case).
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor h = hidden.to(dtype);
  const at::Tensor w = weight.to(dtype);
  const int64_t rows = hidden.size(0);
  const bool want_grad = want_grad_hidden || want_grad_weight;
  const double inverse_rows = 1.0 / static_cast<double>(rows);

  ChunkedPass pass;
  pass.row_losses = at::empty({rows}, hidden.options().dtype(at::kFloat));
  if (want_grad_hidden) pass.grad_hidden = at::empty_like(hidden, at::MemoryFormat::Contiguous);
  if (want_grad_weight) {
    pass.grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
  }
  for (int64_t start = 0; start < rows; start += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - start);
    const at::Tensor h_chunk = h.narrow(0, start, count);
    const at::Tensor target = targets.narrow(0, start, count).unsqueeze(1);
    at::Tensor z = at::mm(h_chunk, w.t()).to(at::kFloat);  // this chunk's logits, ours to overwrite
    const at::Tensor lse = at::logsumexp(z, 1, /*keepdim=*/true);
    at::Tensor chunk_losses = pass.row_losses.narrow(0, start, count);
    at::sub_out(chunk_losses, lse.squeeze(1), z.gather(1, target).squeeze(1));
    if (!want_grad) continue;
    // d(mean loss)/d(logits) = (softmax - onehot(target)) / N, built in place of the logits; a
    // weighted sum's has each row's weight in place of 1 / N.
    z.sub_(lse).exp_();
    z.scatter_(1, target, z.gather(1, target).sub_(1.0));
    if (row_weights.defined()) {
      z.mul_(row_weights.narrow(0, start, count).unsqueeze(1));
    } else {
      z.mul_(inverse_rows);
    }
    const at::Tensor dz = z.to(dtype);
    if (want_grad_hidden) matmul_into(pass.grad_hidden.narrow(0, start, count), dz, w);
    if (want_grad_weight) accumulate_matmul(pass.grad_weight, dz.t(), h_chunk);
  }
  if (want_grad_weight) pass.grad_weight = pass.grad_weight.to(weight.scalar_type());
  return pass;
}

// The gradients are computed in the forward pass, chunk by chunk, while each chunk's logits exist;
// backward scales them by the incoming gradient. Saved as saved variables (not saved_data) so the
// autograd engine frees them once backward has run.
struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const std::optional<at::Tensor>& row_weights, int64_t chunk_rows) {
    const at::Tensor weights = row_weights.value_or(at::Tensor());
    ChunkedPass pass = run_chunks(hidden, weight, targets, weights, chunk_rows,
                                  hidden.requires_grad(), weight.requires_grad());
    ctx->save_for_backward({pass.grad_hidden, pass.grad_weight});
    return combined(pass.row_losses, weights);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // The saved gradients are constants: a graph of this backward would have no second derivative.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "linear_cross_entropy is differentiable once: backward with create_graph is not "
                "supported");
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& grad_loss = grad_outputs[0];
    const auto scaled = [&](const at::Tensor& grad) {
      return grad.defined() ? grad * grad_loss : at::Tensor();
    };
    return {scaled(saved[0]), scaled(saved[1]), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t linear_cross_entropy_chunk_rows(int64_t vocab_size) {
  return std::max<int64_t>(1, kChunkLogitsBytes / (int64_t{sizeof(float)} * vocab_size));
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& targets, const at::Tensor& row_weights) {
  return linear_cross_entropy(hidden, weight, targets,
                              linear_cross_entropy_chunk_rows(weight.size(0)), row_weights);
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& targets, int64_t chunk_rows,
                                const at::Tensor& row_weights) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "linear_cross_entropy takes hidden [N, d] and weight [V, d], not ", hidden.sizes(),
              " and ", weight.sizes());
  TORCH_CHECK(
      targets.dim() == 1 && targets.size(0) == hidden.size(0) && targets.scalar_type() == at::kLong,
      "linear_cross_entropy takes int64 targets [", hidden.size(0), "], not ",
      targets.scalar_type(), " ", targets.sizes());
  TORCH_CHECK(chunk_rows > 0, "linear_cross_entropy needs chunks of at least one row");
  TORCH_CHECK(!row_weights.defined() ||
                  (row_weights.dim() == 1 && row_weights.size(0) == hidden.size(0) &&
                   row_weights.scalar_type() == at::kFloat && !row_weights.requires_grad()),
              "linear_cross_entropy takes fp32 row weights [", hidden.size(0),
              "] without a gradient");
  const bool want_grad =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (!want_grad) {
    return combined(
        run_chunks(hidden, weight, targets, row_weights, chunk_rows, false, false).row_losses,
        row_weights);
  }
  // An undefined tensor is no input autograd takes; an absent optional is.
  const std::optional<at::Tensor> weights =
      row_weights.defined() ? std::optional<at::Tensor>(row_weights) : std::nullopt;
  return LinearCrossEntropyFunction::apply(hidden, weight, targets, weights, chunk_rows);
}

}  // namespace mltrain

#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace mltrain {

struct MuonOptions {
  double momentum = 0.95;
  int64_t ns_steps = 5;
  double weight_decay = 0.1;
};

// The Newton-Schulz iteration of Muon (Jordan et al., 2024), which takes a matrix to about the
// nearest semi-orthogonal one, U V^T of its SVD U S V^T, without an SVD: X is scaled to a
// Frobenius norm of at most 1, transposed to be wide, and iterated `steps` times as
//   A = X X^T,  X <- a X + (b A + c A A) X,   (a, b, c) = (3.4445, -4.7750, 2.0315),
// a quintic whose coefficients pull every singular value into about [0.68, 1.14] fast, rather than
// to exactly 1 slowly. Computed in `matrix`'s dtype (bf16 on CUDA, where its products run at the
// bf16 rate), and returned in it.
at::Tensor newton_schulz(const at::Tensor& matrix, int64_t steps);

// The scale of an orthogonalised update of a [rows, cols] matrix that gives it the RMS of a typical
// AdamW update, 0.2 sqrt(max(rows, cols)) (Liu et al., "Muon is Scalable for LLM Training", 2025),
// so that AdamW's learning rate and weight decay carry over.
double muon_update_scale(int64_t rows, int64_t cols);

// Muon's update of a set of matrices, each with its momentum buffer. One step of a matrix W with
// gradient G, momentum M, learning rate lr and weight decay wd:
//   M <- mu M + G
//   U  = G + mu M                                    (Nesterov)
//   O  = newton_schulz(U)                            (bf16 on CUDA, fp32 on the CPU)
//   W <- W - lr (muon_update_scale(W) O + wd W)
// unless the step is skipped: then neither W nor M changes. A parameter that stacks several
// matrices row after row (a fused projection: q, k and v) takes this step for each of them, as
// Muon defines it, with O and its scale of that matrix alone.
class MuonUpdate {
 public:
  explicit MuonUpdate(MuonOptions options) : options_(options) {}

  // A parameter and its momentum buffer (same shape); its gradient is read as weight.grad(). It
  // stacks matrices of `rows` rows each, in order, which sum to its rows.
  void add(const at::Tensor& weight, const at::Tensor& momentum, std::vector<int64_t> rows);

  // One step of every matrix with learning rate `lr`, unless `skip` (a float scalar on the
  // weights' device) is 1. The decision stays on the device.
  void step(double lr, const at::Tensor& skip);

 private:
  // The orthogonalised update of each matrix of `rows` in `nesterov`, scaled, stacked as they are.
  at::Tensor scaled_update(const at::Tensor& nesterov, const std::vector<int64_t>& rows) const;

  struct Entry {
    at::Tensor weight;
    at::Tensor momentum;
    std::vector<int64_t> rows;
  };
  MuonOptions options_;
  std::vector<Entry> entries_;
};

}  // namespace mltrain

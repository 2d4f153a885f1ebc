// Muon's arithmetic: the Newton-Schulz iteration and one step against the independent Python
// reference (tests/reference/muon.py, written from README.md's statement), the iteration against
// what it is for (singular values near 1), and a skipped step.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "model/interop/safetensors.h"
#include "tests/support/test_support.h"
#include "trainer/optim/muon.h"

namespace mltrain {
namespace {

using testing::relative_error;

constexpr double kTolerance = 1e-5;

// A matrix of `rows` x `cols` whose gradient is `grad`, a leaf as a parameter is.
at::Tensor matrix_with_grad(const at::Tensor& weight, const at::Tensor& grad) {
  at::Tensor matrix = weight.clone().requires_grad_(true);
  matrix.mutable_grad() = grad.clone();
  return matrix;
}

TEST(Muon, NewtonSchulzAndOneStepMatchThePythonReference) {
  testing::TemporaryDirectory dir;
  const MuonOptions options{.momentum = 0.95, .ns_steps = 5, .weight_decay = 0.1};
  const double lr = 0.02;
  at::manual_seed(3);
  // Square, wide and tall (the iteration runs on the transpose of a tall matrix).
  for (const auto& [rows, cols] : {std::pair{64, 64}, std::pair{48, 80}, std::pair{96, 40}}) {
    const std::string shape = fmt::format("{}x{}", rows, cols);
    const at::Tensor weight = at::randn({rows, cols}) * 0.05;
    const at::Tensor grad = at::randn({rows, cols}) * 0.01;
    const at::Tensor momentum = at::randn({rows, cols}) * 0.01;
    const auto in = dir / (shape + ".in.safetensors");
    const auto out = dir / (shape + ".out.safetensors");
    save_safetensors(
        in, {{"weight", weight},
             {"grad", grad},
             {"momentum", momentum},
             {"settings", at::tensor({lr, options.momentum, static_cast<double>(options.ns_steps),
                                      options.weight_decay},
                                     at::kDouble)}});
    const std::string command = fmt::format("{} {}/tests/reference/muon.py {} {}", MLTRAIN_PYTHON,
                                            MLTRAIN_SOURCE_DIR, in.string(), out.string());
    const testing::CommandResult run = testing::run_command(command);
    ASSERT_EQ(run.exit_code, 0) << command << "\n" << run.output;
    const NamedTensors reference = load_safetensors(out);

    EXPECT_LE(relative_error(newton_schulz(grad, options.ns_steps), reference.at("orthogonal")),
              kTolerance)
        << shape;
    const at::Tensor stepped = matrix_with_grad(weight, grad);
    const at::Tensor stepped_momentum = momentum.clone();
    MuonUpdate update(options);
    update.add(stepped, stepped_momentum, {rows});
    update.step(lr, at::zeros({}));
    EXPECT_LE(relative_error(stepped.detach(), reference.at("weight")), kTolerance) << shape;
    EXPECT_LE(relative_error(stepped_momentum, reference.at("momentum")), kTolerance) << shape;
  }
}

// A fused projection stacks matrices row after row (q, k and v): each takes the step it would take
// alone, orthogonalised and scaled by its own shape, not the stack's.
TEST(Muon, StackedMatricesEachStepAsAlone) {
  at::manual_seed(6);
  const std::vector<int64_t> rows = {48, 16, 16};
  const at::Tensor weight = at::randn({80, 40}) * 0.05;
  const at::Tensor grad = at::randn({80, 40}) * 0.01;
  const at::Tensor momentum = at::randn({80, 40}) * 0.01;
  const at::Tensor stacked = matrix_with_grad(weight, grad);
  const at::Tensor stacked_momentum = momentum.clone();
  MuonUpdate together({});
  together.add(stacked, stacked_momentum, rows);
  together.step(0.02, at::zeros({}));

  int64_t first_row = 0;
  for (const int64_t matrix_rows : rows) {
    const auto part = [&](const at::Tensor& t) { return t.narrow(0, first_row, matrix_rows); };
    const at::Tensor alone = matrix_with_grad(part(weight), part(grad));
    const at::Tensor alone_momentum = part(momentum).clone();
    MuonUpdate update({});
    update.add(alone, alone_momentum, {matrix_rows});
    update.step(0.02, at::zeros({}));
    EXPECT_LE(relative_error(part(stacked.detach()), alone.detach()), 1e-6) << first_row;
    EXPECT_LE(relative_error(part(stacked_momentum), alone_momentum), 1e-6) << first_row;
    first_row += matrix_rows;
  }
  // The stack orthogonalised whole would give another update.
  const at::Tensor whole = matrix_with_grad(weight, grad);
  const at::Tensor whole_momentum = momentum.clone();
  MuonUpdate as_one({});
  EXPECT_THROW(as_one.add(whole, whole_momentum, {48, 16}), std::logic_error);
  as_one.add(whole, whole_momentum, {80});
  as_one.step(0.02, at::zeros({}));
  EXPECT_GT(relative_error(whole.detach() - weight, stacked.detach() - weight), 0.1);
}

// What the iteration is for: every singular value of its result is near 1 (the quintic's
// coefficients leave them within about [0.68, 1.14]; asserted with a margin), for inputs whose
// singular values spread over a factor of 30.
TEST(Muon, NewtonSchulzTakesEverySingularValueNearOne) {
  at::manual_seed(4);
  for (const auto& [rows, cols] : {std::pair{64, 64}, std::pair{32, 96}, std::pair{96, 32}}) {
    const auto [u, s, vh] = at::linalg_svd(at::randn({rows, cols}), /*full_matrices=*/false);
    const at::Tensor spread = at::logspace(0, 1.5, s.size(0));
    const at::Tensor matrix = at::matmul(u * spread, vh);
    const at::Tensor singular = at::linalg_svdvals(newton_schulz(matrix, 5));
    EXPECT_GT(singular.min().item<double>(), 0.65) << rows << "x" << cols;
    EXPECT_LT(singular.max().item<double>(), 1.2) << rows << "x" << cols;
  }
}

// A skipped step (skip = 1) changes nothing, whether its gradient is finite (a loss spike) or not;
// the same step with skip = 0 changes both.
TEST(Muon, ASkippedStepChangesNeitherTheWeightNorTheMomentum) {
  at::manual_seed(5);
  const at::Tensor weight = at::randn({16, 24});
  const at::Tensor momentum = at::randn({16, 24});
  for (const at::Tensor& grad : {at::randn({16, 24}), at::full({16, 24}, NAN)}) {
    for (const double skip : {1.0, 0.0}) {
      const at::Tensor stepped = matrix_with_grad(weight, grad);
      const at::Tensor stepped_momentum = momentum.clone();
      MuonUpdate update({});
      update.add(stepped, stepped_momentum, {16});
      update.step(0.02, at::full({}, skip));
      const bool finite = at::isfinite(grad).all().item<bool>();
      if (skip == 1.0) {
        EXPECT_TRUE(at::equal(stepped.detach(), weight)) << "finite gradient: " << finite;
        EXPECT_TRUE(at::equal(stepped_momentum, momentum)) << "finite gradient: " << finite;
      } else if (finite) {
        EXPECT_FALSE(at::equal(stepped.detach(), weight));
        EXPECT_FALSE(at::equal(stepped_momentum, momentum));
      }
    }
  }
}

}  // namespace
}  // namespace mltrain

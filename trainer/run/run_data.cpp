#include "trainer/run/run_data.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/error.h"
#include "common/input_file.h"
#include "data/tokenizer.h"

namespace mltrain {

TokenWindows open_windows(const std::string& pattern, const Config& config, const char* split) {
  const auto start = std::chrono::steady_clock::now();
  TokenWindows windows(pattern, config.data.seq_len, config.model.vocab_size);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  spdlog::info("{} data: {} shards, {} tokens, {} windows of {} (validated in {:.1f} s)", split,
               windows.shards().size(), windows.num_tokens(), windows.num_windows(),
               windows.window_length(), took.count());
  return windows;
}

void check_tokenizer(const Config& config) {
  const std::string& path = config.data.tokenizer;
  if (path.empty()) return;
  if (path == DataConfig{}.tokenizer && !std::filesystem::exists(path)) {
    spdlog::info(
        "{}: no tokenizer there (the default data.tokenizer); training reads token shards and "
        "needs none, but mlgen will",
        path);
    return;
  }
  const Tokenizer tokenizer(path);
  if (tokenizer.vocab_size() > config.model.vocab_size) {
    throw UserError(fmt::format("{}: the tokenizer has {} tokens, more than model.vocab_size = {}",
                                path, tokenizer.vocab_size(), config.model.vocab_size));
  }
}

std::string read_tokenizer_model(const Config& config) {
  // SentencePiece models of the largest vocabularies are a few MB.
  constexpr uint64_t kMostTokenizerBytes = uint64_t{1} << 30;
  const std::string& path = config.data.tokenizer;
  if (path.empty() || !std::filesystem::exists(path)) return "";
  return InputFile(path, "tokenizer").read_all(kMostTokenizerBytes);
}

void check_batch_fits(const BatchLayout& layout, const TokenWindows& train_windows) {
  // Counted in double: with enough ranks the product can pass what 64 bits hold.
  const double global_batch = static_cast<double>(layout.micro_batch) *
                              static_cast<double>(layout.grad_accum) *
                              static_cast<double>(layout.world_size);
  if (global_batch <= static_cast<double>(train_windows.num_windows())) return;
  throw UserError(
      fmt::format("a global batch of {} windows (data.micro_batch {} x data.grad_accum {} x {} "
                  "ranks) is more than the {} windows of the training data: lower "
                  "data.micro_batch or data.grad_accum, or add data",
                  global_batch, layout.micro_batch, layout.grad_accum, layout.world_size,
                  train_windows.num_windows()));
}

}  // namespace mltrain

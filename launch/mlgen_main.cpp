// mlgen: continues a prompt with a trained model (greedy decoding).
#include <fmt/core.h>

#include <string_view>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "model/hf_state_dict.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"

namespace {

const char* const kUsage = R"(usage: mlgen RUN_DIR [--prompt TEXT] [--tokens N]

Loads RUN_DIR/config.yaml, the weights of the run's newest checkpoint and the config's tokenizer,
and prints the prompt continued greedily by the model until the end of a document or N new
tokens (default 64).
)";

}  // namespace

int main(int argc, char** argv) {
  mltrain::setup_logging(/*rank=*/0);
  return mltrain::guarded_main([&] {
    std::string run_dir;
    std::string prompt;
    int64_t max_tokens = 64;
    for (int i = 1; i < argc; ++i) {
      const std::string_view argument = argv[i];
      if (argument == "--help" || argument == "-h") {
        fmt::print("{}", kUsage);
        return 0;
      }
      if ((argument == "--prompt" || argument == "--tokens") && i + 1 == argc) {
        throw mltrain::UserError(fmt::format("{} needs a value (see mlgen --help)", argument));
      }
      if (argument == "--prompt") {
        prompt = argv[++i];
      } else if (argument == "--tokens") {
        const std::string value = argv[++i];
        if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || value.size() > 9) {
          throw mltrain::UserError(fmt::format("--tokens expects a positive integer, got \"{}\"", value));
        }
        max_tokens = std::stoll(value);
      } else if (argument.starts_with("-") || !run_dir.empty()) {
        throw mltrain::UserError(fmt::format("unexpected argument {} (see mlgen --help)", argument));
      } else {
        run_dir = argument;
      }
    }
    if (run_dir.empty()) throw mltrain::UserError("no run directory given (see mlgen --help)");
    const mltrain::Config config = mltrain::load_config(std::filesystem::path(run_dir) / "config.yaml");
    const mltrain::Tokenizer tokenizer(config.data.tokenizer);
    mltrain::Llama model(config.model);
    mltrain::load_model_weights(model, mltrain::find_weights(run_dir));
    model->eval();

    std::vector<int64_t> ids;
    for (const uint32_t id : tokenizer.encode(prompt)) ids.push_back(id);
    if (ids.empty()) ids.push_back(tokenizer.end_of_document());  // no prompt: start a new document
    const std::vector<int64_t> generated =
        mltrain::generate_greedy(model, ids, max_tokens, tokenizer.end_of_document());
    std::vector<int> text_ids;
    for (const int64_t id : generated) {
      if (id != tokenizer.end_of_document()) text_ids.push_back(static_cast<int>(id));
    }
    fmt::print("{}{}\n", prompt, tokenizer.decode(text_ids));
    return 0;
  });
}

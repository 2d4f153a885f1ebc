// mlgen: continues a prompt with a trained model (greedy decoding).
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <charconv>
#include <optional>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "model/hf_state_dict.h"
#include "trainer/checkpoint_store.h"
#include "trainer/config.h"

namespace {

const char* const kDescription =
    R"(Loads RUN_DIR/config.yaml, the weights of the run's newest checkpoint and the config's tokenizer,
and prints the prompt continued greedily by the model until the end of a document or N new
tokens.
)";

struct GenerateArguments {
  std::string run_dir;
  std::string prompt;
  int64_t max_tokens = 64;
};

// The arguments of the command line; none (the help printed) for --help. A bad argument is a
// one-line UserError.
std::optional<GenerateArguments> parse_arguments(int argc, const char* const* argv) {
  GenerateArguments arguments;
  CLI::App app(kDescription, "mlgen");
  // Unknown arguments are kept, not thrown, so that the error about them is one line of ours.
  app.allow_extras();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("RUN_DIR", arguments.run_dir, "the run directory mltrain trained in")
      ->required()
      ->type_name("");
  app.add_option("--prompt", arguments.prompt,
                 "the text to continue; default: start a new document")
      ->type_name("TEXT");
  // Checked as text, before CLI11 converts it, so that the error says what is expected.
  app.add_option("--tokens", arguments.max_tokens, "most new tokens to generate; default 64")
      ->type_name("N")
      ->check(CLI::Validator(
          [](const std::string& value) {
            int64_t number = 0;
            const auto [end, error] =
                std::from_chars(value.data(), value.data() + value.size(), number);
            if (error == std::errc() && end == value.data() + value.size() && number > 0)
              return std::string();
            return fmt::format("expected a positive integer, got \"{}\"", value);
          },
          ""));
  bool run_dir_missing = false;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return std::nullopt;
  } catch (const CLI::RequiredError&) {  // the run directory is the one required argument
    run_dir_missing = true;
  } catch (const CLI::ParseError& error) {
    throw mltrain::UserError(fmt::format("{} (see mlgen --help)", error.what()));
  }
  // An unknown flag is reported before a missing run directory: in `mlgen --temp 1` it is the
  // mistake.
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) {
    throw mltrain::UserError(fmt::format(
        "{} {} (see mlgen --help)",
        extra.front().starts_with("-") ? "unknown option" : "unexpected argument", extra.front()));
  }
  if (run_dir_missing) throw mltrain::UserError("no run directory given (see mlgen --help)");
  return arguments;
}

}  // namespace

int main(int argc, char** argv) {
  mltrain::setup_logging(/*rank=*/0);
  return mltrain::guarded_main([&] {
    const std::optional<GenerateArguments> arguments = parse_arguments(argc, argv);
    if (!arguments) return 0;
    const mltrain::Config config =
        mltrain::load_config(std::filesystem::path(arguments->run_dir) / "config.yaml");
    // The checkpoint is verified first: damaged weights are the error to report, whatever else is.
    const std::filesystem::path weights = mltrain::find_weights(arguments->run_dir);
    const mltrain::Tokenizer tokenizer(config.data.tokenizer);
    mltrain::Llama model(config.model);
    mltrain::load_model_weights(model, weights);
    model->eval();

    std::vector<int64_t> ids;
    for (const uint32_t id : tokenizer.encode(arguments->prompt)) ids.push_back(id);
    if (ids.empty()) ids.push_back(tokenizer.end_of_document());  // no prompt: start a new document
    const std::vector<int64_t> generated =
        mltrain::generate_greedy(model, ids, arguments->max_tokens, tokenizer.end_of_document());
    std::vector<int> text_ids;
    for (const int64_t id : generated) {
      if (id != tokenizer.end_of_document()) text_ids.push_back(static_cast<int>(id));
    }
    fmt::print("{}{}\n", arguments->prompt, tokenizer.decode(text_ids));
    return 0;
  });
}

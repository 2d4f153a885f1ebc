// mlgen: continues prompts with a trained model, sampling or greedy, streaming or in batches.
#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "data/corpus_description.h"
#include "data/text_stream.h"
#include "data/tokenizer.h"
#include "launch/mlgen_chat.h"
#include "launch/number_arguments.h"
#include "model/generation/generate.h"
#include "model/interop/hf_state_dict.h"
#include "trainer/checkpoint/checkpoint_store.h"
#include "trainer/config/config.h"
#include "trainer/machine/device.h"

namespace {

using mltrain::parse_number;
using mltrain::text_check;

const char* const kDescription =
    R"(Loads the weights of a checkpoint (a run directory's newest one, verified against its
checksums), the config.yaml saved with them and that config's tokenizer, and continues the
prompt until the end of a document or N new tokens, printing the text as it is made. Rates of
prompt and generated tokens go to stderr; stdout has only the text.

Sampling by default: temperature 0.8, then the 50 most likely tokens (top-k), then the
smallest most likely set holding 95% of their probability (top-p), drawn with seed 1337. Each
prompt draws from its own generator, so a seed gives a prompt the same text alone or in a batch
(up to rounding, as on another device). --greedy or --temperature 0 takes
the most likely token every time, which a small model soon repeats in a loop.

Without --prompt and with text piped into stdin, every line of stdin is a prompt (an empty line
starts a new document): prompts are continued in batches, and each continuation is printed on
one line, in order, without its prompt; a newline the model writes is printed as \n and a
backslash as \\. Without --prompt on a terminal, mlgen starts a new document.

With --chat, a conversation: each line of stdin is a user turn, rendered with the chat template
of the run's corpus (or --chat-template) after the --system turn, if any, and answered until
the template's end-of-turn marker; piped, each answer is printed on one line as above.
)";

// Whether `text` is a positive number too small for a double (1e-400), which CLI11 reads as 0:
// a temperature below every one that samples, greedy as 0 is, and no mistake to refuse.
bool underflows(const std::string& text) {
  if (text.empty() || text.front() == '-') return false;
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(text.c_str(), &end);
  return errno == ERANGE && *end == '\0' && number < std::numeric_limits<double>::min();
}

struct GenerateArguments {
  std::string source;
  std::optional<std::string> prompt;
  bool chat = false;
  std::optional<std::string> system;
  std::optional<std::string> chat_template;
  mltrain::GenerationOptions generation;
  bool greedy = false;
  std::string device = "auto";
};

// The arguments of the command line; none (the help printed) for --help. A bad argument is a
// one-line UserError.
std::optional<GenerateArguments> parse_arguments(int argc, const char* const* argv) {
  GenerateArguments arguments;
  mltrain::GenerationOptions& generation = arguments.generation;
  mltrain::SamplingOptions& sampling = generation.sampling;
  CLI::App app(kDescription, "mlgen");
  // Unknown arguments are kept, not thrown, so that the error about them is one line of ours.
  app.allow_extras();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("RUN_DIR|CHECKPOINT_DIR", arguments.source,
                 "the run directory mltrain trained in (its newest checkpoint), or one "
                 "checkpoint directory (RUN_DIR/checkpoints/step_00001000)")
      ->required()
      ->type_name("");
  app.add_option("--prompt", arguments.prompt,
                 "the text to continue; default: the lines of stdin when it is not a terminal, "
                 "else a new document")
      ->type_name("TEXT");
  app.add_option("--max-new-tokens,--tokens", generation.max_new_tokens,
                 "most new tokens per prompt (also ended by model.max_seq_len); default 64")
      ->type_name("N")
      ->check(
          text_check([](const std::string& v) { return parse_number<int64_t>(v).value_or(0) > 0; },
                     "a positive integer"));
  app.add_option("--temperature", sampling.temperature,
                 "divides the logits before the softmax; 0, or one too small to sample at, is "
                 "greedy; default 0.8")
      ->type_name("T")
      ->check(text_check(
          [](const std::string& v) {
            return parse_number<double>(v).value_or(-1.0) >= 0.0 || underflows(v);
          },
          "a number >= 0"));
  app.add_option("--top-k", sampling.top_k,
                 "sample from the K most likely tokens; 0: all; default 50")
      ->type_name("K")
      ->check(text_check(
          [](const std::string& v) { return parse_number<int64_t>(v).value_or(-1) >= 0; },
          "an integer >= 0"));
  app.add_option("--top-p", sampling.top_p,
                 "then from the fewest most likely tokens holding P of the probability; 1: all; "
                 "default 0.95")
      ->type_name("P")
      ->check(text_check(
          [](const std::string& v) {
            const double p = parse_number<double>(v).value_or(0.0);
            return p > 0.0 && p <= 1.0;
          },
          "a number in (0, 1]"));
  app.add_option("--seed", generation.seed, "seeds each prompt's sampling; default 1337")
      ->type_name("S")
      ->check(text_check([](const std::string& v) { return parse_number<uint64_t>(v).has_value(); },
                         "an integer >= 0"));
  app.add_flag("--greedy", arguments.greedy, "take the most likely token every time");
  app.add_flag("--chat", arguments.chat,
               "a conversation: each line of stdin is a user turn, answered until the\n"
               "template's end-of-turn marker");
  app.add_option("--system", arguments.system, "the system turn of --chat")->type_name("TEXT");
  app.add_option("--chat-template", arguments.chat_template,
                 "chatml or llama2; default: the one the run's corpus was prepared with\n"
                 "(its corpus.json), else chatml")
      ->type_name("T")
      ->check(text_check(
          [](const std::string& v) { return mltrain::chat_template_named(v).has_value(); },
          "chatml or llama2"));
  app.add_option("--device", arguments.device, "auto (a GPU when one is visible), cpu or cuda")
      ->type_name("auto|cpu|cuda")
      ->check(
          text_check([](const std::string& v) { return v == "auto" || v == "cpu" || v == "cuda"; },
                     "auto, cpu or cuda"));
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
  if (arguments.chat && arguments.prompt) {
    throw mltrain::UserError(
        "--chat reads the user's turns from stdin, and --prompt gives none (see mlgen --help)");
  }
  if (!arguments.chat && (arguments.system || arguments.chat_template)) {
    throw mltrain::UserError(fmt::format("{} applies to --chat only (see mlgen --help)",
                                         arguments.system ? "--system" : "--chat-template"));
  }
  if (arguments.greedy) sampling.temperature = 0.0;
  return arguments;
}

c10::Device generation_device(const std::string& setting) {
  if (setting == "cuda" && !torch::cuda::is_available()) {
    throw mltrain::UserError("--device cuda but no CUDA device is visible: use --device cpu");
  }
  return mltrain::resolve_device(setting);
}

std::string continuation_text(const mltrain::Tokenizer& tokenizer,
                              const std::vector<int64_t>& tokens) {
  std::vector<int> ids;
  for (const int64_t id : tokens) {
    if (id != tokenizer.end_of_document()) ids.push_back(static_cast<int>(id));
  }
  return tokenizer.decode(ids);
}

// The model sees a prompt as the start of a document: after the end-of-document token, as
// documents follow each other in the training data. `where` names the prompt in an error.
std::vector<int64_t> prompt_tokens(const mltrain::Tokenizer& tokenizer, const std::string& text,
                                   int64_t max_seq_len, const std::string& where) {
  std::vector<int64_t> ids = {tokenizer.end_of_document()};
  for (const uint32_t id : tokenizer.encode(text)) ids.push_back(id);
  const auto length = static_cast<int64_t>(ids.size()) - 1;
  if (length >= max_seq_len) {
    throw mltrain::UserError(fmt::format(
        "{} is {} tokens, too long for model.max_seq_len = {}: at most {} fit (one position "
        "holds the start of the document)",
        where, length, max_seq_len, max_seq_len - 1));
  }
  return ids;
}

// Token counts and times of every generate() call, for the rates on stderr.
struct Throughput {
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;

  void add(const std::vector<std::vector<int64_t>>& prompts, const mltrain::Generation& result) {
    for (const auto& prompt : prompts) prompt_tokens += static_cast<int64_t>(prompt.size());
    for (const auto& tokens : result.tokens) new_tokens += static_cast<int64_t>(tokens.size());
    prefill_seconds += result.prefill_seconds;
    decode_seconds += result.decode_seconds;
  }
  void report() const {
    spdlog::info("prompt: {} tokens, {:.1f} tokens/s; generation: {} tokens, {:.1f} tokens/s",
                 prompt_tokens, prompt_tokens / std::max(prefill_seconds, 1e-9), new_tokens,
                 new_tokens / std::max(decode_seconds, 1e-9));
  }
};

// Prompts continued together, at most this many at a time: enough to keep a device busy, few
// enough that the padded batch's cache stays small.
constexpr size_t kBatchSize = 16;

void continue_lines(mltrain::Llama& model, const mltrain::Tokenizer& tokenizer,
                    const mltrain::GenerationOptions& options, std::istream& in) {
  std::vector<std::vector<int64_t>> prompts;
  size_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.ends_with('\r')) line.pop_back();
    prompts.push_back(prompt_tokens(tokenizer, line, model->config().max_seq_len,
                                    fmt::format("the prompt on line {}", line_number)));
  }
  Throughput throughput;
  for (size_t first = 0; first < prompts.size(); first += kBatchSize) {
    const std::vector<std::vector<int64_t>> batch(
        prompts.begin() + static_cast<std::ptrdiff_t>(first),
        prompts.begin() +
            static_cast<std::ptrdiff_t>(std::min(first + kBatchSize, prompts.size())));
    const mltrain::Generation result = mltrain::generate(model, batch, options);
    for (const auto& tokens : result.tokens)
      fmt::print("{}\n", mltrain::escaped_line(continuation_text(tokenizer, tokens)));
    std::fflush(stdout);
    throughput.add(batch, result);
  }
  if (!prompts.empty()) throughput.report();
}

void continue_prompt(mltrain::Llama& model, const mltrain::Tokenizer& tokenizer,
                     const mltrain::GenerationOptions& options, const std::string& prompt) {
  const std::vector<std::vector<int64_t>> prompts = {
      prompt_tokens(tokenizer, prompt, model->config().max_seq_len, "the prompt")};
  fmt::print("{}", prompt);
  std::fflush(stdout);
  mltrain::TextStream stream(tokenizer);
  const auto print = [](const std::string& text) {
    fmt::print("{}", text);
    std::fflush(stdout);
  };
  const mltrain::Generation result = mltrain::generate(
      model, prompts, options, [&](size_t, int64_t token) { print(stream.add(token)); });
  print(stream.finish());
  fmt::print("\n");
  std::fflush(stdout);
  Throughput throughput;
  throughput.add(prompts, result);
  throughput.report();
}

// The template a chat renders with: --chat-template, else the one the run's training corpora say
// they were prepared with (data.train's, or each of data.sources'), else chatml. Corpora prepared
// with different templates are a UserError: which one the model answers in is not clear.
mltrain::ChatTemplate template_of(const GenerateArguments& arguments,
                                  const mltrain::Config& config) {
  if (arguments.chat_template) return *mltrain::chat_template_named(*arguments.chat_template);
  std::vector<std::string> patterns = {config.data.train};
  if (!config.sources.empty()) {
    patterns.clear();
    for (const mltrain::DataSource& source : config.sources) patterns.push_back(source.train);
  }
  std::optional<mltrain::ChatTemplate> found;
  for (const std::string& pattern : patterns) {
    const std::optional<mltrain::ChatTemplate> chat_template =
        mltrain::read_corpus_description(std::filesystem::path(pattern).parent_path())
            .chat_template;
    if (chat_template && found && *chat_template != *found) {
      throw mltrain::UserError(fmt::format(
          "the run's corpora were prepared with the {} and the {} chat templates: give "
          "--chat-template",
          mltrain::chat_template_name(*found), mltrain::chat_template_name(*chat_template)));
    }
    if (chat_template) found = chat_template;
  }
  return found.value_or(mltrain::ChatTemplate::chatml);
}

}  // namespace

int main(int argc, char** argv) {
  mltrain::setup_logging(/*rank=*/0);
  return mltrain::guarded_main([&] {
    const std::optional<GenerateArguments> arguments = parse_arguments(argc, argv);
    if (!arguments) return 0;
    const c10::Device device = generation_device(arguments->device);
    // The checkpoint is verified first: damaged weights are the error to report, whatever else is.
    const std::filesystem::path weights = mltrain::find_weights(arguments->source);
    // The config saved with the weights is the one they fit, even where the run's own config
    // has changed since.
    const std::filesystem::path config_file = mltrain::saved_config_for(arguments->source, weights);
    const mltrain::Config config = mltrain::load_config(config_file);
    const std::string tokenizer_file = mltrain::tokenizer_for(weights, config);
    if (tokenizer_file.empty()) {
      throw mltrain::UserError(fmt::format(
          "{}: data.tokenizer is empty, and mlgen needs the tokenizer the corpus was prepared "
          "with",
          config_file.string()));
    }
    const mltrain::Tokenizer tokenizer(tokenizer_file);
    mltrain::check_weights_can_fill(config.model, config_file.string(), weights);
    mltrain::Llama model(config.model, mltrain::choose_kernels(config.train.kernels, device),
                         mltrain::LlamaImpl::Weights::drawn, c10::kCPU, config.lora);
    mltrain::load_model_weights(model, weights);
    model->merge_adapters();  // a LoRA run's adapters, once, rather than in every product
    model->to(device);
    model->eval();

    mltrain::GenerationOptions options = arguments->generation;
    options.stop = tokenizer.end_of_document();
    options.vocab_limit = tokenizer.vocab_size();
    if (arguments->chat) {
      mltrain::chat(model, tokenizer, template_of(*arguments, config), options, arguments->system,
                    std::cin, /*one_line=*/::isatty(STDIN_FILENO) == 0);
    } else if (arguments->prompt) {
      continue_prompt(model, tokenizer, options, *arguments->prompt);
    } else if (::isatty(STDIN_FILENO) == 0) {
      continue_lines(model, tokenizer, options, std::cin);
    } else {
      continue_prompt(model, tokenizer, options, "");
    }
    return 0;
  });
}

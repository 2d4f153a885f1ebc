// mlprep: turns text into token shards and a tokenizer that mltrain trains on.
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "data/corpus_prep.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "launch/number_arguments.h"

namespace {

const char* const kDescription =
    R"(Prepares a corpus for mltrain: trains a SentencePiece BPE tokenizer on a sample (unless one is
given), streams the documents through parallel encoders and writes DIR/train_000000.bin...,
DIR/val_000000.bin... (llm.c token shards) and DIR/tokenizer.model; a chat corpus also a loss
mask beside each shard (train_000000.mask...) and DIR/corpus.json. Memory stays bounded whatever
the corpus's size; the shards are the same for any --threads; each appears whole or not at all.
)";

// More threads than any machine has cores gain nothing, and thousands of them fail to start (the
// process's limit on threads) only once the tokenizer is trained, when encoding begins.
constexpr int kMostThreads = 1024;

CLI::Validator fraction() {
  return mltrain::text_check(
      [](const std::string& value) {
        const std::optional<double> number = mltrain::parse_number<double>(value);
        return number && *number >= 0.0 && *number < 1.0;
      },
      "a number in [0, 1)");
}

// mlprep's arguments, bound to `options`, `inputs`, `format` and `chat_template`: parsing and
// --help both come
// from here.
void define_arguments(CLI::App& app, mltrain::CorpusPrepOptions& options,
                      std::vector<std::string>& inputs, std::string& format,
                      std::string& chat_template) {
  app.name("mlprep");
  app.description(kDescription);
  // Unknown arguments are kept, not thrown, so that the error about them is one line of ours.
  app.allow_extras();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--input", inputs,
                 "input files, directories (their files, recursively) or quoted globs;\n"
                 "several may follow one --input")
      ->required()
      ->type_name("PATH");
  app.add_option("--out", options.out_dir, "output directory")->required()->type_name("DIR");
  app.add_option("--format", format,
                 "text (blank lines separate documents), jsonl (one object per line),\n"
                 "fortune (\"%\" lines separate documents) or chat (one conversation per\n"
                 "line: {\"messages\": [{\"role\", \"content\"}...]} or ShareGPT's\n"
                 "{\"conversations\": [{\"from\", \"value\"}...]}, with a loss mask that makes\n"
                 "the assistants' answers the only targets); default text")
      ->type_name("F");
  app.add_option("--text-field", options.reader.text_field,
                 "the jsonl field that holds a document; default text")
      ->type_name("NAME");
  app.add_option("--chat-template", chat_template,
                 "how --format chat renders a conversation: chatml (<|im_start|>ROLE ...\n"
                 "<|im_end|>, markers a trained tokenizer gets as pieces) or llama2\n"
                 "([INST] ... [/INST] ...</s>, for a Llama 2 or TinyLlama --tokenizer);\n"
                 "default chatml")
      ->type_name("T");
  app.add_flag("--skip-bad-lines", options.reader.skip_bad_lines,
               "count and pass over bad jsonl or chat lines (a missing text field, a\n"
               "conversation without an answer...) instead of stopping");
  // 256 byte pieces, 3 special ones and one more; the top is SentencePiece's, said now rather than
  // by SentencePiece after the sample is read.
  app.add_option("--vocab-size", options.vocab_size, "tokenizer vocabulary; default 4096")
      ->type_name("N")
      ->check(mltrain::integer_between(260, mltrain::kMostVocabularySize));
  app.add_option("--tokenizer", options.tokenizer,
                 "use this SentencePiece model instead of training one")
      ->type_name("MODEL");
  app.add_option("--tokenizer-sample-mb", options.tokenizer_sample_mb,
                 "the tokenizer trains on a seeded sample of this much text; default 100")
      ->type_name("MB")
      ->check(mltrain::integer_between(1, 1'000'000));
  app.add_option("--val-fraction", options.val_fraction,
                 "share of documents held out for validation, chosen by a seeded hash\n"
                 "of their text; default 0.05")
      ->type_name("F")
      ->check(fraction());
  app.add_option("--shard-tokens", options.shard_tokens, "tokens per shard file; default 100000000")
      ->type_name("N")
      ->check(mltrain::integer_between(1, mltrain::kMaxShardTokens));
  app.add_flag("--overwrite", options.overwrite,
               "replace the shards and tokenizer of a non-empty --out directory");
  app.add_option("--threads", options.threads, "encoding and training threads; default: all cores")
      ->type_name("N")
      ->check(mltrain::integer_between(1, kMostThreads));
  app.add_option("--seed", options.seed,
                 "seed of the validation split and the tokenizer's sample; default 1337")
      ->type_name("N")
      ->check(mltrain::integer_at_least(0));
}

// The options of the command line; none (the help printed) for --help. A bad argument is a
// one-line UserError.
std::optional<mltrain::CorpusPrepOptions> parse_arguments(int argc, const char* const* argv) {
  mltrain::CorpusPrepOptions options;
  options.threads =
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMostThreads);
  std::vector<std::string> inputs;
  std::string format = "text";
  std::string chat_template = "chatml";
  CLI::App app;
  define_arguments(app, options, inputs, format, chat_template);
  std::string missing;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return std::nullopt;
  } catch (const CLI::RequiredError& error) {
    missing = error.what();
  } catch (const CLI::ParseError& error) {
    throw mltrain::UserError(fmt::format("{} (see mlprep --help)", error.what()));
  }
  // An unknown flag is reported before a missing one: it is often the missing one misspelt.
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) {
    throw mltrain::UserError(fmt::format(
        "{} {} (see mlprep --help)",
        extra.front().starts_with("-") ? "unknown option" : "unexpected argument", extra.front()));
  }
  if (!missing.empty()) throw mltrain::UserError(fmt::format("{} (see mlprep --help)", missing));
  options.reader.format = mltrain::parse_document_format(format);
  options.chat_template = mltrain::parse_chat_template(chat_template);
  if (app.count("--chat-template") > 0 && options.reader.format != mltrain::DocumentFormat::kChat)
    throw mltrain::UserError("--chat-template applies to --format chat only (see mlprep --help)");
  options.inputs = mltrain::list_input_files(inputs);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  mltrain::setup_logging(/*rank=*/0);
  return mltrain::guarded_main([&] {
    const std::optional<mltrain::CorpusPrepOptions> options = parse_arguments(argc, argv);
    if (options) mltrain::prepare_corpus(*options);
    return 0;
  });
}

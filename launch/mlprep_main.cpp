// mlprep: turns text into token shards and a tokenizer that mltrain trains on.
#include <fmt/core.h>

#include <string_view>
#include <thread>

#include "common/error.h"
#include "common/guarded_main.h"
#include "common/logging.h"
#include "data/corpus_prep.h"

namespace {

const char* const kUsage = R"(usage: mlprep --input FILE... --out DIR [options]

Prepares a corpus for mltrain: trains a SentencePiece BPE tokenizer (unless one is given),
encodes the documents and writes DIR/train_000000.bin..., DIR/val_000000.bin... (llm.c token
shards) and DIR/tokenizer.model.

options:
  --input FILE...        input files (several may follow one --input)
  --out DIR              output directory
  --format F             text (blank lines separate documents), jsonl ("text" field) or
                         fortune ("%" lines separate documents); default text
  --vocab-size N         tokenizer vocabulary; default 4096
  --tokenizer MODEL      use this SentencePiece model instead of training one
  --val-fraction F       share of documents held out for validation; default 0.05
  --shard-tokens N       tokens per shard file; default 100000000
  --threads N            encoding and training threads; default: all cores
  --seed N               seed of the validation choice; default 1337
)";

int64_t parse_integer(std::string_view flag, const std::string& value, int64_t min) {
  try {
    size_t used = 0;
    const int64_t number = std::stoll(value, &used);
    if (used == value.size() && number >= min) return number;
  } catch (const std::exception&) {
  }
  throw mltrain::UserError(fmt::format("{} expects an integer of at least {}, got \"{}\"", flag, min, value));
}

double parse_fraction(const std::string& value) {
  try {
    size_t used = 0;
    const double number = std::stod(value, &used);
    if (used == value.size() && number >= 0.0 && number < 1.0) return number;
  } catch (const std::exception&) {
  }
  throw mltrain::UserError(fmt::format("--val-fraction expects a number in [0, 1), got \"{}\"", value));
}

}  // namespace

int main(int argc, char** argv) {
  mltrain::setup_logging(/*rank=*/0);
  return mltrain::guarded_main([&] {
    mltrain::CorpusPrepOptions options;
    options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < argc; ++i) {
      const std::string_view flag = argv[i];
      if (flag == "--help" || flag == "-h") {
        fmt::print("{}", kUsage);
        return 0;
      }
      if (flag == "--input") {
        while (i + 1 < argc && std::string_view(argv[i + 1]).substr(0, 2) != "--") options.inputs.emplace_back(argv[++i]);
        continue;
      }
      if (!flag.starts_with("--")) throw mltrain::UserError(fmt::format("unexpected argument {} (see mlprep --help)", flag));
      if (i + 1 == argc) throw mltrain::UserError(fmt::format("{} needs a value (see mlprep --help)", flag));
      const std::string value = argv[++i];
      if (flag == "--out") options.out_dir = value;
      else if (flag == "--format") options.format = mltrain::parse_document_format(value);
      else if (flag == "--vocab-size") options.vocab_size = parse_integer(flag, value, 260);
      else if (flag == "--tokenizer") options.tokenizer = value;
      else if (flag == "--val-fraction") options.val_fraction = parse_fraction(value);
      else if (flag == "--shard-tokens") options.shard_tokens = parse_integer(flag, value, 1);
      else if (flag == "--threads") options.threads = static_cast<int>(parse_integer(flag, value, 1));
      else if (flag == "--seed") options.seed = static_cast<uint64_t>(parse_integer(flag, value, 0));
      else throw mltrain::UserError(fmt::format("unknown option {} (see mlprep --help)", flag));
    }
    if (options.inputs.empty()) throw mltrain::UserError("no --input files given (see mlprep --help)");
    if (options.out_dir.empty()) throw mltrain::UserError("no --out directory given (see mlprep --help)");
    mltrain::prepare_corpus(options);
    return 0;
  });
}

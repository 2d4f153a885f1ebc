#include "data/corpus_prep.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "common/directory_lock.h"
#include "common/error.h"
#include "data/corpus_output.h"
#include "data/shard.h"
#include "data/token_windows.h"
#include "data/tokenizer.h"
#include "data/tokenizer_sample.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

// Real text from Debian packages that setup.sh installs: English and Chinese fortunes.
const std::vector<std::filesystem::path> kFortunes = {"/usr/share/games/fortunes/computers",
                                                      "/usr/share/games/fortunes/tang300"};

// The documents of a split: its shards' tokens cut at each end-of-document token and decoded.
std::vector<std::string> decode_split(const std::filesystem::path& dir, const std::string& split,
                                      const Tokenizer& tokenizer) {
  std::vector<std::string> documents;
  std::vector<int> current;
  for (const std::string& path : expand_glob((dir / (split + "_*.bin")).string())) {
    const ShardReader shard(path, tokenizer.vocab_size());
    std::vector<int64_t> tokens(shard.num_tokens());
    shard.read(0, tokens);
    for (const int64_t token : tokens) {
      if (token == tokenizer.end_of_document()) {
        documents.push_back(tokenizer.decode(current));
        current.clear();
      } else {
        current.push_back(static_cast<int>(token));
      }
    }
  }
  EXPECT_TRUE(current.empty()) << "every document ends with the end-of-document token";
  return documents;
}

// The standard deviation of a count of successes in n draws of probability p.
double binomial_sigma(size_t n, double p) { return std::sqrt(n * p * (1 - p)); }

TEST(CorpusPrep, ShardsDecodeToTheInputDocuments) {
  TemporaryDirectory dir;
  CorpusPrepOptions options;
  options.inputs = kFortunes;
  options.reader.format = DocumentFormat::kFortune;
  options.out_dir = dir / "out";
  options.vocab_size = 1500;
  options.val_fraction = 0.1;
  options.shard_tokens = 20000;  // several shards, documents cut across them
  options.threads = 2;
  const CorpusPrepReport report = prepare_corpus(options);

  const std::vector<std::string> documents = read_documents(kFortunes, DocumentFormat::kFortune);
  ASSERT_GT(documents.size(), 500u);
  EXPECT_NEAR(report.val_documents, 0.1 * documents.size(),
              5 * binomial_sigma(documents.size(), 0.1));
  EXPECT_EQ(report.train_documents + report.val_documents, static_cast<int64_t>(documents.size()));
  EXPECT_EQ(report.train_shards, (report.train_tokens + 19999) / 20000);
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "train_000002.bin"));

  const Tokenizer tokenizer(dir / "out" / "tokenizer.model");
  EXPECT_EQ(tokenizer.vocab_size(), 1500);
  std::vector<std::string> decoded = decode_split(dir / "out", "train", tokenizer);
  const std::vector<std::string> val = decode_split(dir / "out", "val", tokenizer);
  EXPECT_EQ(static_cast<int64_t>(val.size()), report.val_documents);
  decoded.insert(decoded.end(), val.begin(), val.end());
  std::vector<std::string> expected = documents;
  std::sort(decoded.begin(), decoded.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(decoded, expected);
}

TEST(CorpusPrep, BadInputsAreNamed) {
  TemporaryDirectory dir;
  testing::write_text(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  try {
    read_documents({dir / "bad.jsonl"}, DocumentFormat::kJsonl);
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "bad.jsonl:2: expected a JSON object with a \"text\" string");
  }
  try {
    read_documents({dir / "missing.txt"}, DocumentFormat::kText);
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "missing.txt: cannot read the input file");
  }
  try {
    Tokenizer tokenizer(dir / "absent.model");
    FAIL();
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "absent.model: tokenizer model not found");
  }
  testing::write_text(dir / "garbage.model", "not a model");
  EXPECT_THROW(Tokenizer(dir / "garbage.model"), UserError);
}

// The token shards of a prepared directory, by file name, as bytes.
std::map<std::string, std::string> shard_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> shards;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".bin")
      shards[entry.path().filename().string()] = testing::read_text(entry.path());
  }
  return shards;
}

// An overwrite, done or failed, leaves no staging directory behind.
void expect_no_staging_left(const std::filesystem::path& out) {
  for (const auto& entry : std::filesystem::directory_iterator(out))
    EXPECT_FALSE(entry.path().filename().string().starts_with(".mlprep-staging")) << "left over";
}

CorpusPrepOptions fortune_options(const std::filesystem::path& out, int threads) {
  CorpusPrepOptions options;
  options.inputs = kFortunes;
  options.reader.format = DocumentFormat::kFortune;
  options.out_dir = out;
  options.vocab_size = 1500;
  options.shard_tokens = 20000;
  options.threads = threads;
  return options;
}

TEST(CorpusPrep, ShardsAreTheSameBytesForAnyThreadCount) {
  TemporaryDirectory dir;
  prepare_corpus(fortune_options(dir / "one", 1));
  prepare_corpus(fortune_options(dir / "three", 3));
  const auto one = shard_bytes(dir / "one");
  ASSERT_GT(one.size(), 3u);
  EXPECT_EQ(shard_bytes(dir / "three"), one);
  // The model files differ only in the thread count SentencePiece records; the vocabulary is one.
  const auto one_pieces = Tokenizer(dir / "one" / "tokenizer.model").pieces();
  const auto three_pieces = Tokenizer(dir / "three" / "tokenizer.model").pieces();
  ASSERT_EQ(three_pieces.size(), one_pieces.size());
  for (size_t i = 0; i < one_pieces.size(); ++i) {
    EXPECT_EQ(three_pieces[i].text, one_pieces[i].text) << i;
    EXPECT_EQ(three_pieces[i].score, one_pieces[i].score) << i;
  }
}

TEST(CorpusPrep, TheValidationSplitHoldsWhateverTheOrderAndFiles) {
  TemporaryDirectory dir;
  std::vector<std::string> documents = read_documents(kFortunes, DocumentFormat::kFortune);
  const auto write_documents = [](const std::filesystem::path& file, auto first, auto last) {
    std::string text;
    for (auto it = first; it != last; ++it) text += *it + "\n%\n";
    testing::write_text(file, text);
  };
  const auto middle = documents.begin() + static_cast<std::ptrdiff_t>(documents.size() / 2);
  write_documents(dir / "first_half", documents.begin(), middle);
  write_documents(dir / "second_half", middle, documents.end());
  write_documents(dir / "reversed", documents.rbegin(), documents.rend());

  CorpusPrepOptions two_files = fortune_options(dir / "two_files", 2);
  two_files.inputs = {dir / "first_half", dir / "second_half"};
  prepare_corpus(two_files);
  CorpusPrepOptions reversed = two_files;
  reversed.inputs = {dir / "reversed"};
  reversed.out_dir = dir / "reversed_out";
  reversed.tokenizer = dir / "two_files" / "tokenizer.model";
  prepare_corpus(reversed);

  const Tokenizer tokenizer(dir / "two_files" / "tokenizer.model");
  std::vector<std::string> val_of_two = decode_split(dir / "two_files", "val", tokenizer);
  std::vector<std::string> val_of_reversed = decode_split(dir / "reversed_out", "val", tokenizer);
  ASSERT_FALSE(val_of_two.empty());
  std::sort(val_of_two.begin(), val_of_two.end());
  std::sort(val_of_reversed.begin(), val_of_reversed.end());
  EXPECT_EQ(val_of_reversed, val_of_two);
}

TEST(CorpusPrep, TheValidationHashTakesTheAskedShare) {
  constexpr size_t kDocuments = 100'000;
  size_t chosen = 0;
  size_t chosen_by_both_seeds = 0;
  for (size_t i = 0; i < kDocuments; ++i) {
    const std::string text = fmt::format("document number {}", i);
    const bool first = is_validation_document(text, 1337, 0.2);
    chosen += first ? 1 : 0;
    chosen_by_both_seeds += first && is_validation_document(text, 7, 0.2) ? 1 : 0;
    EXPECT_EQ(is_validation_document(text, 1337, 0.2), first);  // the text decides
    EXPECT_FALSE(is_validation_document(text, 1337, 0.0));
  }
  EXPECT_NEAR(chosen, 0.2 * kDocuments, 5 * binomial_sigma(kDocuments, 0.2));
  // Another seed draws independently: both choose 4% of the documents, not the same 20%.
  EXPECT_NEAR(chosen_by_both_seeds, 0.04 * kDocuments, 5 * binomial_sigma(kDocuments, 0.04));
}

TEST(CorpusPrep, TheTokenizerSampleIsBoundedSeededAndFreeOfTheOrder) {
  TemporaryDirectory dir;
  std::string forward;
  std::string backward;
  for (int i = 0; i < 2000; ++i) {
    const std::string document = fmt::format("sample document {} {}", i, std::string(i % 97, 'x'));
    forward += document + "\n\n";
    backward = document + "\n\n" + backward;
  }
  testing::write_text(dir / "forward.txt", forward);
  testing::write_text(dir / "backward.txt", backward);
  constexpr int64_t kMaxBytes = 20'000;
  const DocumentReaderOptions text{.format = DocumentFormat::kText};
  const auto sample = tokenizer_sample({dir / "forward.txt"}, text, kMaxBytes, 1);
  int64_t bytes = 0;
  for (const std::string& document : sample) bytes += static_cast<int64_t>(document.size());
  EXPECT_LE(bytes, kMaxBytes);
  EXPECT_GT(bytes, kMaxBytes - 200);  // full but for less than one document
  EXPECT_EQ(tokenizer_sample({dir / "backward.txt"}, text, kMaxBytes, 1), sample);
  EXPECT_NE(tokenizer_sample({dir / "forward.txt"}, text, kMaxBytes, 2), sample);
  // A corpus smaller than the bound is taken whole.
  EXPECT_EQ(tokenizer_sample({dir / "forward.txt"}, text, 1 << 30, 1).size(), 2000u);
}

TEST(CorpusPrep, ANonEmptyOutputDirectoryIsRefusedUnlessOverwriting) {
  TemporaryDirectory dir;
  CorpusPrepOptions options = fortune_options(dir / "out", 2);
  std::filesystem::create_directories(dir / "out");
  testing::write_text(dir / "out" / "notes.txt", "mine");
  try {
    prepare_corpus(options);
    FAIL() << "a non-empty directory was written into";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "the directory is not empty");
    EXPECT_CONTAINS(std::string(error.what()), "--overwrite");
  }
  EXPECT_EQ(std::filesystem::directory_iterator(dir / "out")->path().filename(), "notes.txt");

  // Overwriting replaces mlprep's files, a shard the new run has no use for and a temporary left
  // by a killed run too, and nothing else, whatever its name. The tokenizer given is read first.
  prepare_corpus(fortune_options(dir / "first", 2));
  std::filesystem::copy_file(dir / "first" / "tokenizer.model", dir / "out" / "tokenizer.model");
  testing::write_text(dir / "out" / "train_000099.bin", "an old shard");
  testing::write_text(dir / "out" / "val_000000.bin.tmp.123", "a killed run's");
  testing::write_text(dir / "out" / "corpus.tmp.1.jsonl", "mine");
  std::filesystem::create_directories(dir / "out" / "train_000098.bin");
  testing::write_text(dir / "out" / "train_000098.bin" / "inside", "mine");
  options.overwrite = true;
  options.tokenizer = dir / "out" / "tokenizer.model";
  prepare_corpus(options);
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "train_000099.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "val_000000.bin.tmp.123"));
  EXPECT_EQ(shard_bytes(dir / "out").count("train_000000.bin"), 1u);
  EXPECT_EQ(testing::read_text(dir / "out" / "tokenizer.model"),
            testing::read_text(dir / "first" / "tokenizer.model"));
  EXPECT_EQ(testing::read_text(dir / "out" / "notes.txt"), "mine");
  EXPECT_EQ(testing::read_text(dir / "out" / "corpus.tmp.1.jsonl"), "mine");
  EXPECT_EQ(testing::read_text(dir / "out" / "train_000098.bin" / "inside"), "mine");
  expect_no_staging_left(dir / "out");
}

// A run with --overwrite that fails keeps the earlier corpus as it was, and no staging behind.
TEST(CorpusPrep, AFailedOverwriteLeavesTheEarlierCorpus) {
  TemporaryDirectory dir;
  CorpusPrepOptions options = fortune_options(dir / "out", 2);
  prepare_corpus(options);
  const auto earlier = shard_bytes(dir / "out");
  const std::string earlier_tokenizer = testing::read_text(dir / "out" / "tokenizer.model");
  testing::write_text(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"not text\"}\n");
  options.inputs = {dir / "bad.jsonl"};
  options.reader.format = DocumentFormat::kJsonl;
  options.tokenizer = dir / "out" / "tokenizer.model";
  options.overwrite = true;
  EXPECT_THROW(prepare_corpus(options), UserError);
  EXPECT_EQ(shard_bytes(dir / "out"), earlier);
  EXPECT_EQ(testing::read_text(dir / "out" / "tokenizer.model"), earlier_tokenizer);
  expect_no_staging_left(dir / "out");
}

// An overwrite killed between two of its moves left a corpus half old and half new, which mltrain
// trained on. Until the next mlprep of the directory finishes the moves, mltrain refuses to read
// it; then the directory holds the new corpus alone, with no marker or staging left.
TEST(CorpusPrep, AnOverwriteKilledWhileMovingIsFinishedByTheNextRun) {
  TemporaryDirectory dir;
  CorpusPrepOptions options = fortune_options(dir / "out", 2);
  prepare_corpus(options);
  options.out_dir = dir / "new";
  options.vocab_size = 1200;  // another tokenizer, other shards
  prepare_corpus(options);
  const auto new_shards = shard_bytes(dir / "new");
  ASSERT_NE(shard_bytes(dir / "out"), new_shards);
  ASSERT_GT(new_shards.size(), 3u);

  struct Killed {};
  {
    CorpusOutput output(dir / "out", /*overwrite=*/true);
    for (const auto& entry : std::filesystem::directory_iterator(dir / "new"))
      std::filesystem::copy_file(entry.path(), output.write_directory() / entry.path().filename());
    int moves = 0;
    EXPECT_THROW(output.publish([&] {
      if (++moves == 2) throw Killed{};
    }),
                 Killed);
  }
  try {
    TokenWindows((dir / "out" / "train_*.bin").string(), 64, 1500);
    FAIL() << "a half-replaced corpus was read";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "an mlprep --overwrite was killed while it replaced the corpus here");
  }

  { const CorpusOutput next(dir / "out", /*overwrite=*/true); }
  EXPECT_EQ(shard_bytes(dir / "out"), new_shards);
  EXPECT_EQ(testing::read_text(dir / "out" / "tokenizer.model"),
            testing::read_text(dir / "new" / "tokenizer.model"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / ".mlprep-publishing"));
  expect_no_staging_left(dir / "out");
  EXPECT_NO_THROW(TokenWindows((dir / "out" / "train_*.bin").string(), 64, 1200));
}

// A marker the next run cannot finish from, one that lists no file (which would have every
// earlier file removed) or one whose staged files are gone, stops it before it removes anything.
TEST(CorpusPrep, AMarkerThatCannotBeFinishedRemovesNothing) {
  TemporaryDirectory dir;
  prepare_corpus(fortune_options(dir / "out", 2));
  const auto earlier = shard_bytes(dir / "out");
  const auto marker = dir / "out" / ".mlprep-publishing";
  const auto refusal = [&](const std::string& text) {
    testing::write_text(marker, text);
    try {
      const CorpusOutput output(dir / "out", /*overwrite=*/true);
    } catch (const UserError& error) {
      return std::string(error.what());
    }
    return std::string("finished");
  };
  EXPECT_CONTAINS(refusal(".mlprep-staging-999\nmoving\n"), "not the marker mlprep writes");
  EXPECT_CONTAINS(refusal(".mlprep-staging-999\nmoving\ntrain_000000.bin\n"),
                  "cannot be finished: the new files not moved yet were in");
  EXPECT_EQ(shard_bytes(dir / "out"), earlier);
  EXPECT_TRUE(std::filesystem::exists(marker));
}

// A directory where the new corpus puts a file stops the overwrite before anything moves.
TEST(CorpusPrep, ADirectoryInTheWayStopsTheOverwriteBeforeAnythingMoves) {
  TemporaryDirectory dir;
  CorpusPrepOptions options = fortune_options(dir / "out", 2);
  options.shard_tokens = 10'000'000;  // one train shard
  prepare_corpus(options);
  const auto earlier = shard_bytes(dir / "out");
  std::filesystem::create_directories(dir / "out" / "train_000001.bin");
  options.shard_tokens = 20000;  // several
  options.tokenizer = dir / "out" / "tokenizer.model";
  options.overwrite = true;
  try {
    prepare_corpus(options);
    FAIL() << "the overwrite went through a directory";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "train_000001.bin is in the way");
  }
  std::filesystem::remove(dir / "out" / "train_000001.bin");
  EXPECT_EQ(shard_bytes(dir / "out"), earlier);
  expect_no_staging_left(dir / "out");
}

// Two runs into one directory: the second is refused, naming the first, and changes nothing.
TEST(CorpusPrep, ADirectoryAnotherMlprepWritesIsRefused) {
  TemporaryDirectory dir;
  const DirectoryLock held(dir / "out", {.lock_file = ".mlprep.lock",
                                         .owner = "mlprep",
                                         .setting = "--out",
                                         .keep_lock_file = false});
  try {
    prepare_corpus(fortune_options(dir / "out", 2));
    FAIL() << "two runs wrote one directory";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "out is in use by another mlprep (pid ");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "train_000000.bin"));
}

// A run that fails leaves no directory of its making: a second one needs no --overwrite.
TEST(CorpusPrep, AFailedFirstRunLeavesNothingBehind) {
  TemporaryDirectory dir;
  std::string one;
  for (std::string document : read_documents(kFortunes, DocumentFormat::kFortune)) {
    std::replace(document.begin(), document.end(), '\n', ' ');
    one += document + "\n";
  }
  testing::write_text(dir / "one.txt", one);  // no blank line: one document
  CorpusPrepOptions options = fortune_options(dir / "new" / "out", 2);
  options.inputs = {dir / "one.txt"};
  options.reader.format = DocumentFormat::kText;
  try {
    prepare_corpus(options);
    FAIL() << "one document made a corpus";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "at least 2 are needed");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "new" / "out"));
  options.inputs = kFortunes;
  options.reader.format = DocumentFormat::kFortune;
  prepare_corpus(options);
  EXPECT_TRUE(std::filesystem::exists(dir / "new" / "out" / "train_000000.bin"));
}

// SentencePiece passes over lines longer than its limit: documents that are one long line each (a
// book on one line) would leave it nothing to learn from; and its BPE trainer crashes on a long
// run without a space. They are cut into pieces it takes, quickly whatever the bytes.
TEST(CorpusPrep, DocumentsOfLongUnbrokenLinesTrainATokenizer) {
  TemporaryDirectory dir;
  std::string line;
  for (std::string document : read_documents(kFortunes, DocumentFormat::kFortune)) {
    std::replace(document.begin(), document.end(), '\n', ' ');
    line += document + " ";
  }
  ASSERT_GT(line.size(), 200'000u);
  std::string letters(200'000, 'a');
  for (size_t i = 0; i < letters.size(); ++i) letters[i] = static_cast<char>('a' + i * 7919 % 10);
  const std::string not_utf8(200'000, '\x80');
  testing::write_text(dir / "two.txt",
                      line + "\n\n" + letters + "\n\n" + not_utf8 + "\n\n" + line + "\n");
  CorpusPrepOptions options = fortune_options(dir / "out", 2);
  options.inputs = {dir / "two.txt"};
  options.reader.format = DocumentFormat::kText;
  options.val_fraction = 0.5;
  const CorpusPrepReport report = prepare_corpus(options);
  EXPECT_EQ(report.train_documents + report.val_documents, 4);
  const Tokenizer tokenizer(dir / "out" / "tokenizer.model");
  EXPECT_EQ(tokenizer.vocab_size(), 1500);
  // Trained on the text: common words are single pieces, not bytes.
  EXPECT_LT(tokenizer.encode(" the computer").size(), 4u);
}

// A pipe gives its bytes once, and training a tokenizer reads the inputs twice: refused at once,
// not after the first pass has emptied it (nor while waiting for its writer).
TEST(CorpusPrep, APipeNeedsATokenizerGiven) {
  TemporaryDirectory dir;
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  CorpusPrepOptions options = fortune_options(dir / "out", 2);
  options.inputs = {dir / "pipe"};
  try {
    prepare_corpus(options);
    FAIL() << "a pipe was taken for two passes";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()), "pipe: not a regular file");
    EXPECT_CONTAINS(std::string(error.what()), "--tokenizer");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(CorpusPrep, CompressedInputsGiveTheShardsOfThePlainOnes) {
  TemporaryDirectory dir;
  std::string jsonl;
  for (const std::string& document : read_documents(kFortunes, DocumentFormat::kFortune))
    jsonl += nlohmann::json{{"text", document}}.dump() + "\n";
  testing::write_text(dir / "corpus.jsonl", jsonl);
  for (const char* tool : {"gzip", "zstd"}) {
    const auto result = testing::run_command(
        fmt::format("{0} -c {1}/corpus.jsonl > {1}/corpus.jsonl.{0}", tool, dir.path().string()));
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  CorpusPrepOptions plain = fortune_options(dir / "plain", 2);
  plain.inputs = {dir / "corpus.jsonl"};
  plain.reader.format = DocumentFormat::kJsonl;
  prepare_corpus(plain);
  const auto expected = shard_bytes(dir / "plain");
  ASSERT_FALSE(expected.empty());
  for (const char* tool : {"gzip", "zstd"}) {
    CorpusPrepOptions compressed = plain;
    compressed.inputs = {dir / (std::string("corpus.jsonl.") + tool)};
    compressed.out_dir = dir / tool;
    compressed.tokenizer = dir / "plain" / "tokenizer.model";
    prepare_corpus(compressed);
    EXPECT_EQ(shard_bytes(dir / tool), expected) << tool;
  }
}

}  // namespace
}  // namespace mltrain

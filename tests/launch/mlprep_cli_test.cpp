// mlprep as a user runs it: what it prints and how it exits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <thread>

#include "common/error.h"
#include "data/document_reader.h"
#include "data/shard.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::CommandResult;

CommandResult mlprep(const std::string& arguments) {
  return testing::run_tool("mlprep", arguments);
}

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

TEST(MlprepCli, PreparesAFortuneCorpus) {
  testing::TemporaryDirectory dir;
  const CommandResult run = mlprep(
      "--input /usr/share/games/fortunes/computers --format fortune --vocab-size 400 --out " +
      (dir / "out").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "bytes per token");
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "train_000000.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "val_000000.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "tokenizer.model"));

  // Encoding with the tokenizer just made, instead of training another, gives the same shards.
  const CommandResult again =
      mlprep("--input /usr/share/games/fortunes/computers --format fortune --tokenizer " +
             (dir / "out" / "tokenizer.model").string() + " --out " + (dir / "again").string());
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(testing::read_text(dir / "again" / "train_000000.bin"),
            testing::read_text(dir / "out" / "train_000000.bin"));
}

TEST(MlprepCli, BadInputExitsTwoWithOneLine) {
  testing::TemporaryDirectory dir;
  const std::string out = " --out " + (dir / "out").string();
  const CommandResult unreadable = mlprep("--input " + (dir / "nope.txt").string() + out);
  EXPECT_EQ(unreadable.exit_code, kExitUserError);
  EXPECT_CONTAINS(unreadable.output, "nope.txt: cannot read the input file");
  const CommandResult tokenizer =
      mlprep("--input /usr/share/games/fortunes/computers --format fortune --tokenizer " +
             (dir / "no.model").string() + out);
  EXPECT_EQ(tokenizer.exit_code, kExitUserError);
  EXPECT_CONTAINS(tokenizer.output, "no.model: tokenizer model not found");
  const CommandResult format = mlprep("--input x --format csv" + out);
  EXPECT_EQ(format.exit_code, kExitUserError);
  EXPECT_CONTAINS(format.output, "--format csv: expected text, jsonl, fortune or chat");
  const CommandResult vocab = mlprep("--input x --vocab-size lots" + out);
  EXPECT_EQ(vocab.exit_code, kExitUserError);
  EXPECT_CONTAINS(
      vocab.output,
      "--vocab-size: expected an integer from 260 to 2147483647, got \"lots\" (see mlprep "
      "--help)");
  EXPECT_EQ(mlprep(out).exit_code, kExitUserError);
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "train_000000.bin"));
}

// A vocabulary smaller than the corpus's characters need is refused with the size that is enough,
// and that size is enough.
TEST(MlprepCli, AVocabularyTooSmallForTheCharactersSaysWhatSizeIsEnough) {
  testing::TemporaryDirectory dir;
  // 1,000 distinct CJK characters in a seeded random order, about 60 of each.
  std::string text;
  uint32_t state = 12345;
  for (int document = 0; document < 300; ++document) {
    for (int i = 0; i < 200; ++i) {
      state = state * 1664525u + 1013904223u;
      const uint32_t code = 0x4E00 + (state >> 8) % 1000;
      text += static_cast<char>(0xE0 | code >> 12);
      text += static_cast<char>(0x80 | (code >> 6 & 0x3F));
      text += static_cast<char>(0x80 | (code & 0x3F));
    }
    text += "\n\n";
  }
  testing::write_text(dir / "cjk.txt", text);
  const std::string input = "--input " + (dir / "cjk.txt").string();
  const CommandResult refused = mlprep(input + " --vocab-size 400 --out " + (dir / "a").string());
  EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
  const std::string said =
      "--vocab-size 400 is too small for this corpus: its tokenizer needs at least ";
  const size_t at = refused.output.find(said);
  ASSERT_NE(at, std::string::npos) << refused.output;
  const int64_t needed = std::stoll(refused.output.substr(at + said.size()));
  EXPECT_GT(needed, 900 + 259);  // 98% of the text takes more than 900 of the 1,000 characters
  EXPECT_CONTAINS(refused.output, fmt::format("give --vocab-size {} or more", needed));
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));

  const CommandResult enough =
      mlprep(input + fmt::format(" --vocab-size {} --out ", needed) + (dir / "b").string());
  EXPECT_EQ(enough.exit_code, 0) << enough.output;
}

// A vocabulary within SentencePiece's range but larger than the corpus's sample can fill is
// refused, once the tokenizer is trained, with the size it can fill, in mlprep's terms.
TEST(MlprepCli, AVocabularyTooLargeForTheCorpusSaysWhatSizeItCanFill) {
  testing::TemporaryDirectory dir;
  const CommandResult refused = mlprep(
      "--input /usr/share/games/fortunes/computers --format fortune --vocab-size 1000000 "
      "--out " +
      (dir / "out").string());
  EXPECT_EQ(refused.exit_code, kExitUserError) << refused.output;
  const std::string said =
      "--vocab-size 1000000 is too large for this corpus: its sample makes at most ";
  const size_t at = refused.output.find(said);
  ASSERT_NE(at, std::string::npos) << refused.output;
  const int64_t most = std::stoll(refused.output.substr(at + said.size()));
  EXPECT_CONTAINS(refused.output, fmt::format("give --vocab-size {} or less", most));
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(MlprepCli, ANonEmptyOutputDirectoryExitsTwoAndStaysAsItWas) {
  testing::TemporaryDirectory dir;
  std::filesystem::create_directories(dir / "out");
  testing::write_text(dir / "out" / "train_000000.bin", "an earlier shard");
  const std::string arguments =
      "--input /usr/share/games/fortunes/computers --format fortune "
      "--vocab-size 400 --out " +
      (dir / "out").string();
  const CommandResult refused = mlprep(arguments);
  EXPECT_EQ(refused.exit_code, kExitUserError);
  EXPECT_EQ(lines(refused.output), 1u) << refused.output;
  EXPECT_CONTAINS(refused.output, "the directory is not empty");
  EXPECT_EQ(testing::read_text(dir / "out" / "train_000000.bin"), "an earlier shard");
  const CommandResult overwritten = mlprep(arguments + " --overwrite");
  EXPECT_EQ(overwritten.exit_code, 0) << overwritten.output;
  EXPECT_NE(testing::read_text(dir / "out" / "train_000000.bin"), "an earlier shard");
}

TEST(MlprepCli, SkippedBadLinesAreCountedInTheSummary) {
  testing::TemporaryDirectory dir;
  std::string jsonl;
  for (int i = 0; i < 300; ++i) jsonl += fmt::format("{{\"text\": \"document {} of many\"}}\n", i);
  jsonl += "{\"title\": \"no text\"}\n{broken\n";
  testing::write_text(dir / "in.jsonl", jsonl);
  const std::string arguments = "--input " + (dir / "in.jsonl").string() +
                                " --format jsonl --vocab-size 300 --out " + (dir / "out").string();
  const CommandResult stopped = mlprep(arguments);
  EXPECT_EQ(stopped.exit_code, kExitUserError);
  EXPECT_CONTAINS(stopped.output, "in.jsonl:301: expected a JSON object with a \"text\" string");
  const CommandResult skipped = mlprep(arguments + " --skip-bad-lines --overwrite");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_CONTAINS(skipped.output, "bad lines passed over: 2");
  EXPECT_CONTAINS(skipped.output, "encoded 300 documents");
}

// 300 conversations about fortunes, in the "messages" shape or ShareGPT's.
std::string chat_lines(bool sharegpt) {
  const std::vector<std::string> fortunes =
      read_documents({"/usr/share/games/fortunes/computers"}, DocumentFormat::kFortune);
  std::string lines;
  for (size_t i = 0; i < 300; ++i) {
    const std::string question = fmt::format("Tell me fortune {}.", i);
    nlohmann::json line;
    if (sharegpt) {
      line["conversations"] = {{{"from", "human"}, {"value", question}},
                               {{"from", "gpt"}, {"value", fortunes[i]}}};
    } else {
      line["messages"] = {{{"role", "user"}, {"content", question}},
                          {{"role", "assistant"}, {"content", fortunes[i]}}};
    }
    lines += line.dump() + "\n";
  }
  return lines;
}

// Both shapes of the same conversations make the same corpus: the shards, their loss masks, the
// tokenizer and the description that says it is a chat corpus.
TEST(MlprepCli, PreparesAChatCorpusWithLossMasksTheSameFromEitherShape) {
  testing::TemporaryDirectory dir;
  std::map<std::string, std::string> corpora[2];
  for (const bool sharegpt : {false, true}) {
    const std::filesystem::path input = dir / fmt::format("chat{}.jsonl", int(sharegpt));
    testing::write_text(input, chat_lines(sharegpt));
    const std::filesystem::path out = dir / fmt::format("out{}", int(sharegpt));
    const CommandResult run = mlprep(fmt::format(
        "--input {} --format chat --vocab-size 600 --out {}", input.string(), out.string()));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_CONTAINS(run.output, "loss masks: ");
    corpora[sharegpt] = testing::file_contents(out);
  }
  EXPECT_EQ(corpora[0], corpora[1]);

  // A plain corpus prepared over it with --overwrite leaves none of the chat corpus's files.
  const CommandResult plain = mlprep(fmt::format(
      "--input /usr/share/games/fortunes/computers --format fortune --vocab-size 400 --out {} "
      "--overwrite",
      (dir / "out0").string()));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  for (const char* file : {"train_000000.mask", "val_000000.mask", "corpus.json"})
    EXPECT_FALSE(std::filesystem::exists(dir / "out0" / file)) << file;
  for (const char* file : {"train_000000.bin", "train_000000.mask", "val_000000.bin",
                           "val_000000.mask", "tokenizer.model", "corpus.json"})
    EXPECT_TRUE(corpora[0].contains(file)) << file;
  const nlohmann::json description = nlohmann::json::parse(corpora[0]["corpus.json"]);
  EXPECT_EQ(description["chat_template"], "chatml");
  EXPECT_EQ(description["loss_masks"], true);
}

// A tokenizer given without the template's markers is one line naming the marker, before
// anything is written; a bad conversation names its file and line, or is counted when skipped.
TEST(MlprepCli, AChatCorpusWithoutItsMarkersOrWithABadConversationExitsTwo) {
  testing::TemporaryDirectory dir;
  testing::write_text(dir / "chat.jsonl", chat_lines(false));
  const CommandResult plain = mlprep(
      "--input /usr/share/games/fortunes/computers --format fortune --vocab-size 400 "
      "--out " +
      (dir / "plain").string());
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const std::map<std::string, std::string> before = testing::file_contents(dir / "plain");
  const CommandResult no_marker = mlprep(fmt::format(
      "--input {} --format chat --tokenizer {} --out {} --overwrite", (dir / "chat.jsonl").string(),
      (dir / "plain" / "tokenizer.model").string(), (dir / "plain").string()));
  EXPECT_EQ(no_marker.exit_code, kExitUserError);
  EXPECT_EQ(lines(no_marker.output), 1u) << no_marker.output;
  EXPECT_CONTAINS(no_marker.output,
                  "the tokenizer has no piece <|im_start|> of its own, which the chatml chat "
                  "template needs");
  EXPECT_EQ(testing::file_contents(dir / "plain"), before);
  // llama2's markers are <s> and </s>, which the same tokenizer has.
  const CommandResult llama2 =
      mlprep(fmt::format("--input {} --format chat --chat-template llama2 --tokenizer {} --out {}",
                         (dir / "chat.jsonl").string(),
                         (dir / "plain" / "tokenizer.model").string(), (dir / "llama2").string()));
  EXPECT_EQ(llama2.exit_code, 0) << llama2.output;
  EXPECT_CONTAINS(testing::read_text(dir / "llama2" / "corpus.json"), "\"llama2\"");

  testing::write_text(
      dir / "bad.jsonl",
      chat_lines(false) + R"({"messages": [{"role": "user", "content": "no answer"}]})" + "\n");
  const std::string arguments = fmt::format("--input {} --format chat --vocab-size 600 --out {}",
                                            (dir / "bad.jsonl").string(), (dir / "bad").string());
  const CommandResult stopped = mlprep(arguments);
  EXPECT_EQ(stopped.exit_code, kExitUserError);
  EXPECT_EQ(lines(stopped.output), 1u) << stopped.output;
  EXPECT_CONTAINS(stopped.output, "bad.jsonl:301: no assistant turn");
  EXPECT_FALSE(std::filesystem::exists(dir / "bad"));
  const CommandResult skipped = mlprep(arguments + " --skip-bad-lines");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_CONTAINS(skipped.output, "bad lines passed over: 1");
  const CommandResult template_name = mlprep(arguments + " --chat-template alpaca");
  EXPECT_EQ(template_name.exit_code, kExitUserError);
  EXPECT_CONTAINS(template_name.output, "--chat-template alpaca: expected chatml or llama2");
  const CommandResult not_chat =
      mlprep(fmt::format("--input {} --format jsonl --chat-template llama2 --out {}",
                         (dir / "bad.jsonl").string(), (dir / "plain_text").string()));
  EXPECT_EQ(not_chat.exit_code, kExitUserError);
  EXPECT_CONTAINS(not_chat.output, "--chat-template applies to --format chat only");
}

// The token ids are Python sentencepiece's for the same model and documents:
// bench/reference_prep.py (llm.c's way of preparing a corpus) writes the same shard bytes as mlprep
// without a validation split, for English and Chinese text, across shards, from a zstd-compressed
// input.
TEST(MlprepCli, TokenIdsArePythonSentencePiecesAndShardsLlmcs) {
  testing::TemporaryDirectory dir;
  std::string jsonl;
  for (const std::string& document :
       read_documents({"/usr/share/games/fortunes/computers", "/usr/share/games/fortunes/tang300"},
                      DocumentFormat::kFortune))
    jsonl += nlohmann::json{{"text", document}}.dump() + "\n";
  testing::write_text(dir / "corpus.jsonl", jsonl);
  const auto compressed = testing::run_command(
      fmt::format("zstd -q -c {0}/corpus.jsonl > {0}/corpus.jsonl.zst", dir.path().string()));
  ASSERT_EQ(compressed.exit_code, 0) << compressed.output;
  const std::string input = (dir / "corpus.jsonl.zst").string();
  const CommandResult ours = mlprep("--input " + input +
                                    " --format jsonl --vocab-size 1500 --val-fraction 0 "
                                    "--shard-tokens 30000 --threads 2 --out " +
                                    (dir / "mlprep").string());
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  const CommandResult reference = testing::run_command(fmt::format(
      "{} {}/bench/reference_prep.py --input {} --tokenizer {} --shard-tokens 30000 --threads 2 "
      "--out {}",
      MLTRAIN_PYTHON, MLTRAIN_SOURCE_DIR, input, (dir / "mlprep" / "tokenizer.model").string(),
      (dir / "reference").string()));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  int64_t shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "reference")) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(testing::read_text(dir / "mlprep" / name), testing::read_text(entry.path())) << name;
    ++shards;
  }
  EXPECT_GE(shards, 3);
  EXPECT_FALSE(std::filesystem::exists(dir / "mlprep" / fmt::format("train_{:06d}.bin", shards)));
}

// Killed mid-way, mlprep leaves --out as it was: its shards are in its staging directory, which
// the next run removes, without --overwrite (the directory holds nothing of a corpus).
TEST(MlprepCli, AKilledRunLeavesTheOutputDirectoryAsItWas) {
  testing::TemporaryDirectory dir;
  const CommandResult tokenizer = mlprep(
      "--input /usr/share/games/fortunes/computers --format fortune --vocab-size 400 "
      "--out " +
      (dir / "tokenizer").string());
  ASSERT_EQ(tokenizer.exit_code, 0) << tokenizer.output;
  // About 40 MB of text: several seconds of encoding on two threads.
  std::string text;
  for (int copy = 0; text.size() < 40'000'000; ++copy)
    text += fmt::format("Copy {} of a line that the corpus repeats with its number.\n\n", copy);
  testing::write_text(dir / "big.txt", text);
  const std::string command = std::string(MLTRAIN_BIN_DIR) + "/mlprep --input " +
                              (dir / "big.txt").string() + " --tokenizer " +
                              (dir / "tokenizer" / "tokenizer.model").string() +
                              " --shard-tokens 100000 --threads 2 --out " + (dir / "out").string();
  testing::BackgroundProcess run(command, dir / "run.log");
  const auto written = [&] {
    std::error_code error;
    for (std::filesystem::recursive_directory_iterator entry(dir / "out", error), end;
         !error && entry != end; entry.increment(error)) {
      if (entry->path().filename() == "train_000003.bin") return true;
    }
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!written() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  run.signal(SIGKILL);
  ASSERT_EQ(run.wait(), 128 + SIGKILL) << "the run ended before it was killed";
  // Only mlprep's hidden staging directory and lock file are left, no corpus file.
  for (const auto& entry : std::filesystem::directory_iterator(dir / "out"))
    EXPECT_TRUE(entry.path().filename().string().starts_with(".mlprep")) << entry.path();
  const CommandResult again = mlprep("--input " + (dir / "big.txt").string() + " --tokenizer " +
                                     (dir / "tokenizer" / "tokenizer.model").string() +
                                     " --shard-tokens 5000000 --out " + (dir / "out").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "out")) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name == "tokenizer.model" || name.ends_with(".bin")) << name << " was left";
  }
}

TEST(MlprepCli, UnknownFlagIsOneLineAndExitTwo) {
  const CommandResult run = mlprep("--input x --out y --vocab 400");
  EXPECT_EQ(run.exit_code, kExitUserError);
  EXPECT_CONTAINS(run.output, "unknown option --vocab (see mlprep --help)");
  EXPECT_EQ(lines(run.output), 1u) << run.output;
  // A misspelt required flag is reported as unknown rather than as missing.
  EXPECT_CONTAINS(mlprep("--inptu x --out y").output, "unknown option --inptu (see mlprep --help)");
}

TEST(MlprepCli, BadNumbersAreOneLineAndExitTwo) {
  const std::string files = "--input x --out y ";
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"--vocab-size 259",
            "--vocab-size: expected an integer from 260 to 2147483647, got \"259\""},
           // SentencePiece's vocab_size is an int32: beyond it, SentencePiece said so only once the
           // sample was read, in its own words.
           {"--vocab-size 99999999999",
            "--vocab-size: expected an integer from 260 to 2147483647, got \"99999999999\""},
           {"--vocab-size 2147483648",
            "--vocab-size: expected an integer from 260 to 2147483647, got \"2147483648\""},
           {"--shard-tokens 0",
            "--shard-tokens: expected an integer from 1 to 2147483647, got \"0\""},
           {"--shard-tokens 2147483648",
            "--shard-tokens: expected an integer from 1 to 2147483647, got \"2147483648\""},
           {"--tokenizer-sample-mb 0",
            "--tokenizer-sample-mb: expected an integer from 1 to 1000000, got \"0\""},
           {"--threads 2x", "--threads: expected an integer from 1 to 1024, got \"2x\""},
           {"--threads 0", "--threads: expected an integer from 1 to 1024, got \"0\""},
           // Past int, CLI11 said it could not convert; thousands of threads failed to start only
           // once the tokenizer was trained.
           {"--threads 99999999999",
            "--threads: expected an integer from 1 to 1024, got \"99999999999\""},
           {"--threads 5000", "--threads: expected an integer from 1 to 1024, got \"5000\""},
           {"--seed -1", "--seed: expected an integer of at least 0, got \"-1\""},
           {"--val-fraction 1", "--val-fraction: expected a number in [0, 1), got \"1\""},
           {"--val-fraction half", "--val-fraction: expected a number in [0, 1), got \"half\""}}) {
    const CommandResult run = mlprep(files + arguments);
    EXPECT_EQ(run.exit_code, kExitUserError) << arguments;
    EXPECT_CONTAINS(run.output, message);
    EXPECT_EQ(lines(run.output), 1u) << run.output;
  }
  const CommandResult missing = mlprep("--out y");
  EXPECT_EQ(missing.exit_code, kExitUserError);
  EXPECT_CONTAINS(missing.output, "--input is required (see mlprep --help)");
  const CommandResult dangling = mlprep("--input x --out");
  EXPECT_EQ(dangling.exit_code, kExitUserError);
  EXPECT_CONTAINS(dangling.output, "--out: 1 required DIR missing (see mlprep --help)");
}

TEST(MlprepCli, HelpListsEveryFlagAndExitsZero) {
  const CommandResult run = mlprep("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_CONTAINS(run.output, "Usage: mlprep [OPTIONS]");
  for (const char* flag :
       {"-h,--help", "--input PATH", "--out DIR", "--format F", "--text-field NAME",
        "--skip-bad-lines", "--vocab-size N", "--tokenizer MODEL", "--tokenizer-sample-mb MB",
        "--val-fraction F", "--shard-tokens N", "--overwrite", "--threads N", "--seed N",
        "--chat-template T"}) {
    EXPECT_CONTAINS(run.output, flag);
  }
  EXPECT_CONTAINS(run.output, "trains a SentencePiece BPE tokenizer");
}

}  // namespace
}  // namespace mltrain

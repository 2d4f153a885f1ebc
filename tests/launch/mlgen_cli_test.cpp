// mlgen's command line as a user meets it: what it prints and how it exits, on a tiny model made
// here. (Generating from a trained run is in smoke_run_test.cpp.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "data/corpus_description.h"
#include "data/corpus_prep.h"
#include "data/tokenizer.h"
#include "model/interop/hf_state_dict.h"
#include "tests/support/test_support.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/config/config.h"

namespace mltrain {
namespace {

using testing::CommandResult;

CommandResult mlgen(const std::string& arguments) { return testing::run_tool("mlgen", arguments); }

size_t lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// The arguments are checked before the run directory is read, so none of these needs a run.
TEST(MlgenCli, BadArgumentsAreOneLineAndExitTwo) {
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "no run directory given (see mlgen --help)"},
           {"runs/x --temp 0.7", "unknown option --temp (see mlgen --help)"},
           {"--temp 0.7", "unknown option --temp (see mlgen --help)"},
           {"runs/x runs/y", "unexpected argument runs/y (see mlgen --help)"},
           {"runs/x --tokens lots",
            "--max-new-tokens: expected a positive integer, got \"lots\" (see mlgen --help)"},
           {"runs/x --tokens 0", "--max-new-tokens: expected a positive integer, got \"0\""},
           {"runs/x --max-new-tokens 1.5",
            "--max-new-tokens: expected a positive integer, got \"1.5\""},
           {"runs/x --temperature -0.5", "--temperature: expected a number >= 0, got \"-0.5\""},
           {"runs/x --temperature warm", "--temperature: expected a number >= 0, got \"warm\""},
           {"runs/x --temperature inf", "--temperature: expected a number >= 0, got \"inf\""},
           {"runs/x --temperature nan", "--temperature: expected a number >= 0, got \"nan\""},
           {"runs/x --temperature -inf", "--temperature: expected a number >= 0, got \"-inf\""},
           {"runs/x --temperature 1e400", "--temperature: expected a number >= 0, got \"1e400\""},
           {"runs/x --temperature -1e-400",
            "--temperature: expected a number >= 0, got \"-1e-400\""},
           {"runs/x --top-k -1", "--top-k: expected an integer >= 0, got \"-1\""},
           {"runs/x --top-k 2.5", "--top-k: expected an integer >= 0, got \"2.5\""},
           {"runs/x --top-p 0", "--top-p: expected a number in (0, 1], got \"0\""},
           {"runs/x --top-p 1.01", "--top-p: expected a number in (0, 1], got \"1.01\""},
           {"runs/x --seed -3", "--seed: expected an integer >= 0, got \"-3\""},
           {"runs/x --seed 1e3", "--seed: expected an integer >= 0, got \"1e3\""},
           {"runs/x --device gpu", "--device: expected auto, cpu or cuda, got \"gpu\""},
           {"runs/x --prompt", "--prompt: 1 required TEXT missing (see mlgen --help)"},
           {"runs/x --chat --prompt hi", "--chat reads the user's turns from stdin"},
           {"runs/x --system hi", "--system applies to --chat only"},
           {"runs/x --chat --chat-template alpaca",
            "--chat-template: expected chatml or llama2, got \"alpaca\""}}) {
    const CommandResult run = mlgen(arguments);
    EXPECT_EQ(run.exit_code, kExitUserError) << arguments;
    EXPECT_CONTAINS(run.output, message);
    EXPECT_EQ(lines(run.output), 1u) << run.output;
  }
}

TEST(MlgenCli, HelpListsEveryFlagAndExitsZero) {
  const CommandResult run = mlgen("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_CONTAINS(run.output, "Usage: mlgen [OPTIONS] RUN_DIR|CHECKPOINT_DIR");
  for (const char* flag :
       {"-h,--help", "--prompt TEXT", "--max-new-tokens,--tokens N", "--temperature T", "--top-k K",
        "--top-p P", "--seed S", "--greedy", "--device auto|cpu|cuda", "--chat", "--system TEXT",
        "--chat-template T"})
    EXPECT_CONTAINS(run.output, flag);
  for (const char* documented : {"newest checkpoint", "temperature 0.8", "50 most likely", "95%",
                                 "seed 1337", "printed as \\n"})
    EXPECT_CONTAINS(run.output, documented);
}

// A directory as mlgen reads it: config.yaml, model.safetensors and the tokenizer the config
// names, with a random model small enough to start in a moment. Its output projection strongly
// favours or disfavours a newline at each step, so that continuations hold newlines. Made for
// each test (each runs in a process of its own anyway), so that a failure to make it fails the
// test.
class MlgenOnATinyModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::filesystem::path tokenizer_file = directory_ / "tokenizer.model";
    train_tokenizer(
        read_documents({"/usr/share/games/fortunes/computers", "/usr/share/games/fortunes/tang300"},
                       DocumentFormat::kFortune),
        /*vocab_size=*/1024, /*threads=*/2, tokenizer_file);
    const Tokenizer tokenizer(tokenizer_file);
    Config config;
    config.model.vocab_size = tokenizer.vocab_size();
    config.model.d_model = 32;
    config.model.n_layers = 2;
    config.model.n_q_heads = 2;
    config.model.n_kv_heads = 1;
    config.model.head_dim = 16;
    config.model.d_ffn = 64;
    config.model.max_seq_len = 32;
    config.model.tie_word_embeddings = false;
    config.data.seq_len = 32;
    config.data.tokenizer = tokenizer_file.string();
    testing::write_text(directory_ / "config.yaml", config_to_yaml(config));
    at::manual_seed(3);
    Llama model(config.model, Kernels::fused_cpu);
    const std::vector<uint32_t> newline = tokenizer.encode("\n");
    ASSERT_EQ(newline.size(), 1u);
    {
      at::NoGradGuard no_grad;
      model->lm_head->weight[newline[0]].mul_(100.0);
    }
    save_model_weights(model, directory_ / "model.safetensors");

    // The same without its tokenizer.
    std::filesystem::create_directory(directory_ / "no_tokenizer");
    config.data.tokenizer = (directory_ / "missing" / "tokenizer.model").string();
    testing::write_text(directory_ / "no_tokenizer" / "config.yaml", config_to_yaml(config));
    std::filesystem::copy_file(directory_ / "model.safetensors",
                               directory_ / "no_tokenizer" / "model.safetensors");
  }
  // mlgen on the tiny model; stderr too unless `stdout_only`.
  CommandResult run(const std::string& arguments, bool stdout_only = false) {
    const std::string command = directory_.path().string() + " " + arguments;
    // In a subshell, so that the 2>&1 run_command adds does not undo the 2>/dev/null.
    if (stdout_only)
      return testing::run_command("(" MLTRAIN_BIN_DIR "/mlgen " + command + " 2>/dev/null)");
    return mlgen(command);
  }

  testing::TemporaryDirectory directory_;
};

TEST_F(MlgenOnATinyModel, APromptLongerThanMaxSeqLenExitsTwoWithBothNumbers) {
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "computer ";
  const CommandResult single = run("--prompt '" + prompt + "'");
  EXPECT_EQ(single.exit_code, kExitUserError);
  EXPECT_CONTAINS(single.output, "the prompt is ");
  EXPECT_CONTAINS(single.output, " tokens, too long for model.max_seq_len = 32: at most 31 fit");
  EXPECT_EQ(lines(single.output), 1u) << single.output;

  testing::write_text(directory_ / "prompts.txt", "short\n" + prompt + "\n");
  const CommandResult piped = run("< " + (directory_ / "prompts.txt").string());
  EXPECT_EQ(piped.exit_code, kExitUserError);
  EXPECT_CONTAINS(piped.output, "the prompt on line 2 is ");
  EXPECT_EQ(lines(piped.output), 1u) << piped.output;
}

TEST_F(MlgenOnATinyModel, AMissingTokenizerExitsTwoNamingIt) {
  const CommandResult result = mlgen((directory_ / "no_tokenizer").string() + " --prompt hi");
  EXPECT_EQ(result.exit_code, kExitUserError);
  EXPECT_CONTAINS(result.output, "missing/tokenizer.model: tokenizer model not found");
  EXPECT_EQ(lines(result.output), 1u) << result.output;
}

TEST_F(MlgenOnATinyModel, ASeedReproducesItsTextAndGreedyIsTemperatureZero) {
  const auto text = [&](const std::string& arguments) {
    const CommandResult result = run("--prompt 'The ' --tokens 20 " + arguments, true);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_EQ(result.output.rfind("The ", 0), 0u) << result.output;
    return result.output;
  };
  EXPECT_EQ(text("--seed 5"), text("--seed 5"));
  EXPECT_NE(text("--seed 5"), text("--seed 6"));
  EXPECT_EQ(text("--greedy"), text("--temperature 0 --seed 9"));
  EXPECT_NE(text("--greedy"), text("--seed 5"));
}

// Temperatures so small that the logits divided by them overflowed fp32 (1e-38, as the fixture's
// newline logit is large) gave a repeated junk token; any of them, and one too small for a double
// (1e-400), gives the greedy text. A huge one samples from all tokens alike.
TEST_F(MlgenOnATinyModel, TinyTemperaturesGiveTheGreedyTextAndHugeOnesSample) {
  const auto text = [&](const std::string& arguments) {
    const CommandResult result = run("--prompt 'The ' --tokens 20 " + arguments, true);
    EXPECT_EQ(result.exit_code, 0) << arguments << ": " << result.output;
    return result.output;
  };
  const std::string greedy = text("--greedy");
  for (const char* temperature : {"1e-30", "1e-38", "1e-45", "1e-300", "5e-324", "1e-400"})
    EXPECT_EQ(text(std::string("--temperature ") + temperature), greedy) << temperature;
  EXPECT_NE(text("--temperature 1e300 --top-k 0 --top-p 1"), greedy);
}

TEST_F(MlgenOnATinyModel, RatesGoToStderrAndOnlyTheTextToStdout) {
  const CommandResult both = run("--prompt 'The ' --tokens 4");
  EXPECT_EQ(both.exit_code, 0) << both.output;
  EXPECT_CONTAINS(both.output, "prompt: ");
  EXPECT_CONTAINS(both.output, " tokens/s; generation: 4 tokens, ");
  const CommandResult text = run("--prompt 'The ' --tokens 4", true);
  EXPECT_EQ(text.output.find("tokens/s"), std::string::npos) << text.output;
}

// A newline or backslash in a continuation, escaped as batch mode prints it.
std::string escaped(const std::string& text) {
  std::string line;
  for (const char c : text) line += c == '\n' ? "\\n" : c == '\\' ? "\\\\" : std::string(1, c);
  return line;
}

TEST_F(MlgenOnATinyModel, PipedPromptsGiveOneLineEachWithTheTextOfEachAlone) {
  const std::vector<std::string> prompts = {"The ", "", "a longer prompt of some words",
                                            "\xE6\x98\xA5\xE9\xA3\x8E"};
  std::string input;
  for (const std::string& prompt : prompts) input += prompt + "\n";
  testing::write_text(directory_ / "prompts.txt", input);
  const std::string options = " --tokens 12 --seed 4";
  const CommandResult batch = run(options + " < " + (directory_ / "prompts.txt").string(), true);
  ASSERT_EQ(batch.exit_code, 0) << batch.output;
  ASSERT_EQ(lines(batch.output), prompts.size()) << batch.output;
  EXPECT_CONTAINS(batch.output, "\\n");  // the fixture's newlines, escaped

  size_t line_start = 0;
  for (const std::string& prompt : prompts) {
    const size_t line_end = batch.output.find('\n', line_start);
    const std::string line = batch.output.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    const CommandResult alone = run("--prompt '" + prompt + "'" + options, true);
    ASSERT_EQ(alone.exit_code, 0) << alone.output;
    ASSERT_EQ(alone.output.rfind(prompt, 0), 0u) << alone.output;
    ASSERT_TRUE(alone.output.ends_with("\n")) << alone.output;
    const std::string continuation =
        alone.output.substr(prompt.size(), alone.output.size() - prompt.size() - 1);
    EXPECT_EQ(line, escaped(continuation)) << "prompt \"" << prompt << "\"";
  }
}

// A tiny model taught one answer on a chat corpus (the loss on the answers only) answers each
// turn of a scripted conversation with it and stops there, at the end-of-turn marker, well before
// --max-new-tokens.
TEST(MlgenChat, AnswersAScriptedTwoTurnConversationAndStopsAtTheEndOfTurnMarker) {
  testing::TemporaryDirectory dir;
  std::string lines_of_chat;
  for (int i = 0; i < 400; ++i) {
    lines_of_chat +=
        fmt::format(R"({{"messages": [{{"role": "user", "content": "Is {} a number?"}}, )"
                    R"({{"role": "assistant", "content": "Yes, of course."}}]}})"
                    "\n",
                    i);
  }
  testing::write_text(dir / "chat.jsonl", lines_of_chat);
  const CommandResult prep = testing::run_tool(
      "mlprep", fmt::format("--input {} --format chat --vocab-size 300 --out {}",
                            (dir / "chat.jsonl").string(), (dir / "chat").string()));
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  Config config = testing::tiny_run(dir.path());
  config.model.vocab_size = Tokenizer(dir / "chat" / "tokenizer.model").vocab_size();
  config.model.max_seq_len = 64;  // a conversation of two turns, most words spelt in bytes
  config.data.seq_len = 64;
  config.data.train = (dir / "chat" / "train_*.bin").string();
  config.data.val = (dir / "chat" / "val_*.bin").string();
  config.data.tokenizer = (dir / "chat" / "tokenizer.model").string();
  config.data.document_masking = true;
  config.train.max_steps = 100;
  config.train.ckpt_every = 100;
  testing::write_text(dir / "chat.yaml", config_to_yaml(config));
  const CommandResult train = testing::run_tool("mltrain", (dir / "chat.yaml").string());
  ASSERT_EQ(train.exit_code, 0) << train.output;

  testing::write_text(dir / "turns.txt", "Is it raining?\nAnd is seven a number?\n");
  const CommandResult answers = testing::run_command(
      fmt::format("({}/mlgen {} --chat --greedy --max-new-tokens 40 < {} 2>/dev/null)",
                  MLTRAIN_BIN_DIR, (dir / "run").string(), (dir / "turns.txt").string()));
  ASSERT_EQ(answers.exit_code, 0) << answers.output;
  EXPECT_EQ(answers.output, "Yes, of course.\nYes, of course.\n");

  // Eight turns outgrow model.max_seq_len: the oldest exchanges go, and every turn is answered.
  std::string turns;
  for (int i = 0; i < 8; ++i) turns += fmt::format("Is {} a number?\n", i * 11);
  testing::write_text(dir / "many.txt", turns);
  const CommandResult many = testing::run_command(
      fmt::format("({}/mlgen {} --chat --greedy < {} 2>/dev/null)", MLTRAIN_BIN_DIR,
                  (dir / "run").string(), (dir / "many.txt").string()));
  ASSERT_EQ(many.exit_code, 0) << many.output;
  std::string expected;
  for (int i = 0; i < 8; ++i) expected += "Yes, of course.\n";
  EXPECT_EQ(many.output, expected);
  // A turn that cannot fit alone is one line, exit 2.
  testing::write_text(dir / "long.txt", std::string(200, 'x') + "\n");
  const CommandResult too_long =
      mlgen(fmt::format("{} --chat < {}", (dir / "run").string(), (dir / "long.txt").string()));
  EXPECT_EQ(too_long.exit_code, kExitUserError);
  EXPECT_CONTAINS(too_long.output, "too long for model.max_seq_len = 64");
}

// --chat takes the template the run's corpora were prepared with, each of data.sources' too:
// corpora of two templates leave it unclear, and --chat-template settles it.
TEST_F(MlgenOnATinyModel, ChatRefusesCorporaOfTwoTemplatesUnlessOneIsGiven) {
  Config config = load_config(directory_ / "config.yaml");
  for (const auto& [name, chat_template] :
       {std::pair{"chatml", ChatTemplate::chatml}, std::pair{"llama2", ChatTemplate::llama2}}) {
    std::filesystem::create_directories(directory_ / name);
    write_corpus_description(directory_ / name,
                             {.chat_template = chat_template, .loss_masks = true});
    config.sources.push_back({.name = name,
                              .train = (directory_ / name / "train_*.bin").string(),
                              .val = (directory_ / name / "val_*.bin").string()});
  }
  testing::write_text(directory_ / "config.yaml", config_to_yaml(config));
  testing::write_text(directory_ / "turn.txt", "Hello?\n");
  const std::string turn = " < " + (directory_ / "turn.txt").string();
  const CommandResult unclear = run("--chat" + turn);
  EXPECT_EQ(unclear.exit_code, kExitUserError) << unclear.output;
  EXPECT_CONTAINS(unclear.output,
                  "the run's corpora were prepared with the chatml and the llama2 chat templates");
  // The fixture's tokenizer has <s> and </s>, llama2's markers.
  const CommandResult given = run("--chat --chat-template llama2 --max-new-tokens 3" + turn);
  EXPECT_EQ(given.exit_code, 0) << given.output;
}

TEST_F(MlgenOnATinyModel, EmptyPipedInputPrintsNothing) {
  const CommandResult result = run("< /dev/null", true);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.output, "");
}

}  // namespace
}  // namespace mltrain

// Chat corpora: conversations in both JSONL shapes, rendered by the chat templates with their
// targets, checked against SentencePiece's Python package rendering the templates' definition
// (tests/reference/chat_render.py).
#include "data/chat_template.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/conversation.h"
#include "data/document_reader.h"
#include "data/tokenizer.h"
#include "tests/support/test_support.h"

namespace mltrain {
namespace {

using testing::TemporaryDirectory;

const std::filesystem::path kFortunes = "/usr/share/games/fortunes/computers";

// Conversations in both shapes: a system turn, several exchanges, newlines, spaces at either end,
// digits, Chinese, an empty answer.
const char* const kConversations[] = {
    R"({"messages": [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is a bug?"}, {"role": "assistant", "content": "An error in a program."}]})",
    R"({"conversations": [{"from": "human", "value": "Count to 3."}, {"from": "gpt", "value": "1, 2, 3."}, {"from": "human", "value": "And back?"}, {"from": "gpt", "value": " 3, 2, 1. "}]})",
    R"({"messages": [{"role": "user", "content": "Two lines, please.\nThank you."}, {"role": "assistant", "content": "First line.\nSecond line."}]})",
    R"({"conversations": [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "白日依山尽"}, {"from": "gpt", "value": "黄河入海流"}]})",
    R"({"messages": [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""}]})",
};

std::filesystem::path chatml_tokenizer(const TemporaryDirectory& dir) {
  const std::filesystem::path model = dir / "chatml.model";
  train_tokenizer(read_documents({kFortunes}, DocumentFormat::kFortune), 800, 2, model,
                  chat_control_pieces(ChatTemplate::chatml));
  return model;
}

// A tokenizer made as Llama's are (a dummy prefix), by SentencePiece's Python trainer.
std::filesystem::path llama_like_tokenizer(const TemporaryDirectory& dir) {
  std::string text;
  for (const std::string& document : read_documents({kFortunes}, DocumentFormat::kFortune))
    text += document + "\n";
  testing::write_text(dir / "fortunes.txt", text);
  const std::string command =
      fmt::format("{} {}/tests/reference/chat_render.py train-llama-like {} 800 {}", MLTRAIN_PYTHON,
                  MLTRAIN_SOURCE_DIR, (dir / "fortunes.txt").string(), (dir / "llama").string());
  const testing::CommandResult run = testing::run_command(command);
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.output;
  return dir / "llama.model";
}

nlohmann::json python_rendering(const TemporaryDirectory& dir, const std::filesystem::path& model,
                                ChatTemplate chat_template) {
  std::string lines;
  for (const char* line : kConversations) lines += std::string(line) + "\n";
  testing::write_text(dir / "conversations.jsonl", lines);
  const std::string command =
      fmt::format("{} {}/tests/reference/chat_render.py render {} {} {} {}", MLTRAIN_PYTHON,
                  MLTRAIN_SOURCE_DIR, model.string(), chat_template_name(chat_template),
                  (dir / "conversations.jsonl").string(), (dir / "rendered.json").string());
  const testing::CommandResult run = testing::run_command(command);
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.output;
  return nlohmann::json::parse(testing::read_text(dir / "rendered.json"));
}

void expect_python_rendering(const std::filesystem::path& model, ChatTemplate chat_template,
                             const TemporaryDirectory& dir) {
  const Tokenizer tokenizer(model);
  const ChatRenderer renderer(tokenizer, chat_template);
  const nlohmann::json expected = python_rendering(dir, model, chat_template);
  ASSERT_EQ(expected.size(), std::size(kConversations));
  for (size_t i = 0; i < std::size(kConversations); ++i) {
    const MaskedTokens rendered = renderer.render(parse_conversation(kConversations[i]));
    EXPECT_EQ(rendered.tokens, expected[i]["tokens"].get<std::vector<uint32_t>>())
        << chat_template_name(chat_template) << " conversation " << i;
    EXPECT_EQ(rendered.targets, expected[i]["targets"].get<std::vector<uint8_t>>())
        << chat_template_name(chat_template) << " conversation " << i;
  }
}

TEST(ChatTemplate, RendersTheTokensAndTargetsThatSentencePiecesPythonPackageRenders) {
  TemporaryDirectory dir;
  expect_python_rendering(chatml_tokenizer(dir), ChatTemplate::chatml, dir);
  expect_python_rendering(llama_like_tokenizer(dir), ChatTemplate::llama2, dir);
}

// The targets, decoded, are the answers and nothing else, each followed by the end-of-turn marker.
TEST(ChatTemplate, TheTargetsAreTheAnswersEachWithItsEndOfTurnMarker) {
  TemporaryDirectory dir;
  const Tokenizer tokenizer(chatml_tokenizer(dir));
  const ChatRenderer renderer(tokenizer, ChatTemplate::chatml);
  for (const char* line : kConversations) {
    const Conversation conversation = parse_conversation(line);
    const MaskedTokens rendered = renderer.render(conversation);
    ASSERT_EQ(rendered.tokens.size(), rendered.targets.size());
    std::vector<std::string> answers;
    std::vector<int> answer;
    for (size_t i = 0; i < rendered.tokens.size(); ++i) {
      if (!rendered.targets[i]) continue;
      if (rendered.tokens[i] == renderer.end_of_turn()) {
        answers.push_back(tokenizer.decode(answer));
        answer.clear();
      } else {
        answer.push_back(static_cast<int>(rendered.tokens[i]));
      }
    }
    std::vector<std::string> expected;
    for (const Turn& turn : conversation)
      if (turn.role == Role::assistant) expected.push_back(turn.content);
    EXPECT_EQ(answers, expected) << line;
    EXPECT_TRUE(answer.empty()) << "targets after the last end-of-turn marker: " << line;
  }
  // A prompt opens the assistant's turn: the conversation, then <|im_start|>assistant\n.
  const Conversation question = {{Role::user, "Hello?"}};
  const std::vector<uint32_t> prompt = renderer.prompt(question);
  std::vector<uint32_t> expected = renderer.render(question).tokens;
  expected.push_back(*tokenizer.piece_id("<|im_start|>"));
  for (uint32_t id : tokenizer.encode("assistant\n")) expected.push_back(id);
  EXPECT_EQ(prompt, expected);
  EXPECT_EQ(renderer.end_of_turn(), *tokenizer.piece_id("<|im_end|>"));
}

TEST(ChatTemplate, ATokenizerWithoutTheTemplatesMarkersIsRefusedNamingTheMarker) {
  TemporaryDirectory dir;
  train_tokenizer(read_documents({kFortunes}, DocumentFormat::kFortune), 800, 2,
                  dir / "plain.model");
  const Tokenizer plain(dir / "plain.model");
  try {
    ChatRenderer renderer(plain, ChatTemplate::chatml);
    FAIL() << "a tokenizer without <|im_start|> was taken";
  } catch (const UserError& error) {
    EXPECT_CONTAINS(std::string(error.what()),
                    "the tokenizer has no piece <|im_start|> of its own");
  }
  // llama2's markers are <s> and </s>, which every tokenizer mlprep trains has.
  EXPECT_EQ(ChatRenderer(plain, ChatTemplate::llama2).end_of_turn(), plain.end_of_document());
}

TEST(Conversation, BothShapesOfAConversationMakeTheSameDocument) {
  const std::string messages = conversation_document(parse_conversation(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"));
  const std::string sharegpt = conversation_document(parse_conversation(
      R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "id": 7})"));
  EXPECT_EQ(messages, sharegpt);
  const Conversation back = parse_conversation(messages);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[1].role, Role::user);
  EXPECT_EQ(back[2].content, "A");
}

// Each kind of bad conversation is one line naming the file and line, or, with --skip-bad-lines,
// counted and passed over.
TEST(Conversation, EachBadConversationNamesItsFileAndLineOrIsCountedWhenSkipped) {
  TemporaryDirectory dir;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"messages": []})", "the \"messages\" list is empty"},
      {R"({"messages": [{"role": "bot", "content": "x"}]})",
       "message 1: unknown role \"bot\" (expected system, user or assistant)"},
      {R"({"conversations": [{"from": "human", "value": "x"}, {"from": "assistant", "value": "y"}]})",
       "message 2: unknown from \"assistant\" (expected system, human or gpt)"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": 3}]})",
       "message 2's \"content\" is not a string"},
      {R"({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]})",
       "no assistant turn"},
      {R"({"text": "plain"})", "expected a \"messages\" list"},
      {"not json", "not JSON"},
      {R"({"messages": [], "conversations": []})",
       "both a \"messages\" and a \"conversations\" list"},
  };
  const std::string good =
      R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})";
  std::string lines = good + "\n";
  for (const auto& [line, message] : bad) lines += line + "\n";
  lines += good + "\n";
  testing::write_text(dir / "chat.jsonl", lines);
  for (size_t i = 0; i < bad.size(); ++i) {
    // Each bad line alone after a good one: the error names line 2.
    testing::write_text(dir / "one.jsonl", good + "\n" + bad[i].first + "\n");
    try {
      read_documents({dir / "one.jsonl"}, {.format = DocumentFormat::kChat});
      ADD_FAILURE() << "passed: " << bad[i].first;
    } catch (const UserError& error) {
      const std::string what = error.what();
      EXPECT_CONTAINS(what, "one.jsonl:2: " + bad[i].second);
      EXPECT_CONTAINS(what, "--skip-bad-lines");
      EXPECT_EQ(std::count(what.begin(), what.end(), '\n'), 0) << what;
    }
  }
  DocumentReader reader({dir / "chat.jsonl"},
                        {.format = DocumentFormat::kChat, .skip_bad_lines = true});
  EXPECT_TRUE(reader.next());
  EXPECT_TRUE(reader.next());
  EXPECT_FALSE(reader.next());
  EXPECT_EQ(reader.bad_lines(), static_cast<int64_t>(bad.size()));
}

}  // namespace
}  // namespace mltrain

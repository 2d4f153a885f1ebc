#include "launch/mlgen_chat.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "data/text_stream.h"

namespace mltrain {
namespace {

// The tokens the model continues: the end-of-document token, then the conversation and the
// opening of the assistant's turn. The oldest turns after a system turn go first where the whole
// does not leave room for `answer_room` new tokens.
std::vector<int64_t> fitting_prompt(const ChatRenderer& renderer, Conversation& conversation,
                                    int64_t end_of_document, int64_t max_seq_len,
                                    int64_t answer_room) {
  while (true) {
    std::vector<int64_t> tokens = {end_of_document};
    for (const uint32_t id : renderer.prompt(conversation)) tokens.push_back(id);
    if (static_cast<int64_t>(tokens.size()) + answer_room <= max_seq_len) return tokens;
    const auto first_turn =
        std::find_if(conversation.begin(), conversation.end(),
                     [](const Turn& turn) { return turn.role != Role::system; });
    // The newest user turn alone is all that is left: nothing more can go.
    if (conversation.end() - first_turn <= 1) {
      throw UserError(
          fmt::format("the conversation's last turn is {} tokens with the template, too long for "
                      "model.max_seq_len = {} with room for an answer",
                      tokens.size(), max_seq_len));
    }
    // An exchange goes whole: the user's turn and the answers after it.
    const auto next_user = std::find_if(first_turn + 1, conversation.end(),
                                        [](const Turn& turn) { return turn.role == Role::user; });
    conversation.erase(first_turn, next_user);
  }
}

}  // namespace

std::string escaped_line(const std::string& text) {
  std::string line;
  for (const char c : text) {
    if (c == '\n') {
      line += "\\n";
    } else if (c == '\\') {
      line += "\\\\";
    } else {
      line += c;
    }
  }
  return line;
}

void chat(Llama& model, const Tokenizer& tokenizer, ChatTemplate chat_template,
          const GenerationOptions& options, const std::optional<std::string>& system,
          std::istream& in, bool one_line) {
  const ChatRenderer renderer(tokenizer, chat_template);
  GenerationOptions answering = options;
  answering.stop = renderer.end_of_turn();
  Conversation conversation;
  if (system) conversation.push_back({Role::system, *system});
  const int64_t max_seq_len = model->config().max_seq_len;
  // Room for a short answer at least, so that dropping old turns makes a difference.
  const int64_t answer_room = std::min<int64_t>(options.max_new_tokens, max_seq_len / 4);
  for (std::string line; std::getline(in, line);) {
    if (line.ends_with('\r')) line.pop_back();
    conversation.push_back({Role::user, line});
    const std::vector<std::vector<int64_t>> prompt = {fitting_prompt(
        renderer, conversation, tokenizer.end_of_document(), max_seq_len, answer_room)};
    TextStream stream(tokenizer);
    std::string answer;
    const auto print = [&](std::string text) {
      // llama2 puts a space between [/INST] and the answer: the template's, not the answer's.
      if (answer.empty() && chat_template == ChatTemplate::llama2 && text.starts_with(' '))
        text.erase(0, 1);
      answer += text;
      if (one_line) return;
      fmt::print("{}", text);
      std::fflush(stdout);
    };
    generate(model, prompt, answering, [&](size_t, int64_t token) {
      if (token != static_cast<int64_t>(renderer.end_of_turn())) print(stream.add(token));
    });
    print(stream.finish());
    fmt::print("{}\n", one_line ? escaped_line(answer) : "");
    std::fflush(stdout);
    conversation.push_back({Role::assistant, answer});
  }
}

}  // namespace mltrain

#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain {

// One conversation of a chat corpus (mlprep --format chat): its turns in order.
enum class Role { system, user, assistant };

struct Turn {
  Role role;
  std::string content;
};

using Conversation = std::vector<Turn>;

// "system", "user" or "assistant".
const char* role_name(Role role);

// What is wrong with a JSON line that should hold a conversation, said in a few words
// (DocumentReader adds the file and line).
class BadConversation : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The conversation of one JSON line, in either common shape:
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//   {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}  (ShareGPT)
// A line that is no JSON object of either shape, an empty conversation, an unknown role, a content
// that is not a string, and a conversation without an assistant turn are each a BadConversation.
Conversation parse_conversation(std::string_view json_line);

// A conversation as one document's text: the "messages" shape, compact, so that both shapes of
// one conversation make the same document (and fall in the same split). parse_conversation reads
// it back.
std::string conversation_document(const Conversation& conversation);

}  // namespace mltrain

#include "data/conversation.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace mltrain {
namespace {

// How one shape names its list, its fields and its roles.
struct Shape {
  const char* list;
  const char* role_field;
  const char* content_field;
  const char* role_names[3];  // system, user, assistant
};

constexpr Shape kMessages = {"messages", "role", "content", {"system", "user", "assistant"}};
constexpr Shape kShareGpt = {"conversations", "from", "value", {"system", "human", "gpt"}};

Role role_of(const nlohmann::json& turn, const Shape& shape, size_t index) {
  const auto field = turn.find(shape.role_field);
  if (field == turn.end() || !field->is_string()) {
    throw BadConversation(
        fmt::format("message {} has no \"{}\" string", index + 1, shape.role_field));
  }
  const std::string& name = field->get_ref<const std::string&>();
  for (int role = 0; role < 3; ++role) {
    if (name == shape.role_names[role]) return static_cast<Role>(role);
  }
  throw BadConversation(fmt::format("message {}: unknown {} \"{}\" (expected {}, {} or {})",
                                    index + 1, shape.role_field, name, shape.role_names[0],
                                    shape.role_names[1], shape.role_names[2]));
}

}  // namespace

const char* role_name(Role role) { return kMessages.role_names[static_cast<int>(role)]; }

Conversation parse_conversation(std::string_view json_line) {
  nlohmann::json line;
  try {
    line = nlohmann::json::parse(json_line);
  } catch (const nlohmann::json::exception& error) {
    throw BadConversation(fmt::format("not JSON ({})", error.what()));
  }
  if (!line.is_object()) throw BadConversation("expected a JSON object");
  if (line.contains(kMessages.list) && line.contains(kShareGpt.list)) {
    throw BadConversation("both a \"messages\" and a \"conversations\" list: which is it?");
  }
  const Shape* shape = nullptr;
  for (const Shape* candidate : {&kMessages, &kShareGpt}) {
    if (line.contains(candidate->list)) shape = candidate;
  }
  if (shape == nullptr || !line[shape->list].is_array()) {
    throw BadConversation(
        "expected a \"messages\" list of {role, content} or a \"conversations\" list of "
        "{from, value}");
  }
  const nlohmann::json& turns = line[shape->list];
  if (turns.empty()) throw BadConversation(fmt::format("the \"{}\" list is empty", shape->list));
  Conversation conversation;
  for (size_t i = 0; i < turns.size(); ++i) {
    if (!turns[i].is_object()) throw BadConversation(fmt::format("message {} is no object", i + 1));
    const Role role = role_of(turns[i], *shape, i);
    const auto content = turns[i].find(shape->content_field);
    if (content == turns[i].end() || !content->is_string()) {
      throw BadConversation(fmt::format("message {}'s \"{}\" is {}", i + 1, shape->content_field,
                                        content == turns[i].end() ? "missing" : "not a string"));
    }
    conversation.push_back({role, content->get<std::string>()});
  }
  if (std::none_of(conversation.begin(), conversation.end(),
                   [](const Turn& turn) { return turn.role == Role::assistant; })) {
    throw BadConversation("no assistant turn: nothing to train on");
  }
  return conversation;
}

std::string conversation_document(const Conversation& conversation) {
  nlohmann::json turns = nlohmann::json::array();
  for (const Turn& turn : conversation)
    turns.push_back({{"role", role_name(turn.role)}, {"content", turn.content}});
  return nlohmann::json{{"messages", turns}}.dump();
}

}  // namespace mltrain

#include "data/chat_template.h"

#include <fmt/format.h>

#include "common/error.h"

namespace mltrain {
namespace {

// A stretch of a rendered conversation: text to encode, or a marker by its index in chat_markers.
struct Segment {
  std::string text;
  int marker = -1;
  bool target = false;
};

Segment text_segment(std::string text, bool target = false) {
  return {std::move(text), -1, target};
}
Segment marker_segment(int marker, bool target = false) { return {"", marker, target}; }

// chatml's markers; the end of a turn last, as ChatRenderer::end_of_turn reads it.
constexpr int kImStart = 0;
constexpr int kImEnd = 1;
// llama2's.
constexpr int kBeginSequence = 0;
constexpr int kEndSequence = 1;

std::vector<Segment> chatml_segments(const Conversation& conversation, bool open_answer) {
  std::vector<Segment> segments;
  for (const Turn& turn : conversation) {
    const bool answer = turn.role == Role::assistant;
    segments.push_back(marker_segment(kImStart));
    segments.push_back(text_segment(fmt::format("{}\n", role_name(turn.role))));
    segments.push_back(text_segment(turn.content, answer));
    segments.push_back(marker_segment(kImEnd, answer));
    segments.push_back(text_segment("\n"));
  }
  if (open_answer) {
    segments.push_back(marker_segment(kImStart));
    segments.push_back(text_segment("assistant\n"));
  }
  return segments;
}

// Meta's Llama 2 chat format. A system turn goes into the [INST] of the user turn after it.
std::vector<Segment> llama2_segments(const Conversation& conversation) {
  std::vector<Segment> segments;
  std::string system;
  for (const Turn& turn : conversation) {
    switch (turn.role) {
      case Role::system:
        system += turn.content;
        break;
      case Role::user:
        segments.push_back(marker_segment(kBeginSequence));
        segments.push_back(text_segment(fmt::format(
            "[INST] {}{} [/INST]",
            system.empty() ? "" : fmt::format("<<SYS>>\n{}\n<</SYS>>\n\n", system), turn.content)));
        system.clear();
        break;
      case Role::assistant:
        segments.push_back(text_segment(" " + turn.content, true));
        segments.push_back(marker_segment(kEndSequence, true));
        break;
    }
  }
  return segments;
}

std::vector<Segment> segments_of(const Conversation& conversation, ChatTemplate chat_template,
                                 bool open_answer) {
  // llama2's answer opens right after [/INST]: its prompt is the conversation as it is.
  return chat_template == ChatTemplate::chatml ? chatml_segments(conversation, open_answer)
                                               : llama2_segments(conversation);
}

// Whether the tokenizer puts a space mark before every text it encodes (a dummy prefix).
bool adds_leading_space(const Tokenizer& tokenizer) {
  const std::vector<uint32_t> ids = tokenizer.encode("a");
  return !ids.empty() && tokenizer.piece(ids.front()).starts_with("\u2581");
}

}  // namespace

std::optional<ChatTemplate> chat_template_named(const std::string& name) {
  if (name == "chatml") return ChatTemplate::chatml;
  if (name == "llama2") return ChatTemplate::llama2;
  return std::nullopt;
}

ChatTemplate parse_chat_template(const std::string& name) {
  if (const std::optional<ChatTemplate> known = chat_template_named(name)) return *known;
  throw UserError(fmt::format("--chat-template {}: expected chatml or llama2", name));
}

const char* chat_template_name(ChatTemplate chat_template) {
  return chat_template == ChatTemplate::chatml ? "chatml" : "llama2";
}

std::vector<std::string> chat_markers(ChatTemplate chat_template) {
  if (chat_template == ChatTemplate::chatml) return {"<|im_start|>", "<|im_end|>"};
  return {"<s>", "</s>"};
}

std::vector<std::string> chat_control_pieces(ChatTemplate chat_template) {
  return chat_template == ChatTemplate::chatml ? chat_markers(chat_template)
                                               : std::vector<std::string>{};
}

std::string chat_training_text(const Conversation& conversation, ChatTemplate chat_template) {
  std::string text;
  for (const Segment& segment : segments_of(conversation, chat_template, /*open_answer=*/false))
    text += segment.text;
  return text;
}

ChatRenderer::ChatRenderer(const Tokenizer& tokenizer, ChatTemplate chat_template, Encode encode)
    : template_(chat_template),
      encode_(encode ? std::move(encode) : Encode([&tokenizer](std::string_view text) {
        return tokenizer.encode(text);
      })),
      adds_space_(adds_leading_space(tokenizer)) {
  for (const std::string& marker : chat_markers(chat_template)) {
    const std::optional<uint32_t> id = tokenizer.piece_id(marker);
    if (!id) {
      throw UserError(fmt::format(
          "the tokenizer has no piece {} of its own, which the {} chat template needs: give a "
          "tokenizer that has it, or let mlprep train one (without --tokenizer){}",
          marker, chat_template_name(chat_template),
          chat_template == ChatTemplate::chatml ? ", or use --chat-template llama2" : ""));
    }
    marker_ids_.push_back(*id);
  }
}

MaskedTokens ChatRenderer::render(const Conversation& conversation) const {
  return render(conversation, /*open_answer=*/false);
}

std::vector<uint32_t> ChatRenderer::prompt(const Conversation& conversation) const {
  return render(conversation, /*open_answer=*/true).tokens;
}

MaskedTokens ChatRenderer::render(const Conversation& conversation, bool open_answer) const {
  MaskedTokens out;
  for (const Segment& segment : segments_of(conversation, template_, open_answer)) {
    std::vector<uint32_t> ids;
    if (segment.marker >= 0) {
      ids = {marker_ids_[static_cast<size_t>(segment.marker)]};
    } else {
      std::string_view text = segment.text;
      if (adds_space_ && text.starts_with(' ')) text.remove_prefix(1);
      ids = encode_(text);
    }
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    out.targets.insert(out.targets.end(), ids.size(), segment.target ? 1 : 0);
  }
  return out;
}

}  // namespace mltrain

#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/conversation.h"
#include "data/tokenizer.h"

namespace mltrain {

// How a conversation becomes tokens:
//   chatml: <|im_start|>ROLE\nCONTENT<|im_end|>\n for each turn; the two markers are pieces of
//           their own (control pieces, which no text encodes to), that mlprep adds to a tokenizer
//           it trains;
//   llama2: <s>[INST] USER [/INST] ANSWER</s> for each exchange, a system turn in <<SYS>> ...
//           <</SYS>> inside the next [INST]; its markers are the begin- and end-of-sequence
//           pieces every Llama tokenizer has, so a Llama 2 or TinyLlama tokenizer serves as it is.
// The targets of training are each assistant turn's content and the end-of-turn marker after it
// (<|im_end|>, </s>): the model learns to answer and to stop; never the prompts or the rest of
// the template.
enum class ChatTemplate { chatml, llama2 };

// The template of a name, "chatml" or "llama2"; none for any other.
std::optional<ChatTemplate> chat_template_named(const std::string& name);
// The same for mlprep's --chat-template: another name is a UserError.
ChatTemplate parse_chat_template(const std::string& name);
const char* chat_template_name(ChatTemplate chat_template);

// The pieces the template puts in by id, which a tokenizer must hold each as a piece of its own.
std::vector<std::string> chat_markers(ChatTemplate chat_template);
// Those a tokenizer mlprep trains is given as control pieces (chatml's two; llama2 needs none).
std::vector<std::string> chat_control_pieces(ChatTemplate chat_template);

// The conversation's text as the template renders it, without the markers: what a tokenizer
// trains on.
std::string chat_training_text(const Conversation& conversation, ChatTemplate chat_template);

// A conversation's tokens and, for each, whether it is a target (1) or not (0).
struct MaskedTokens {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> targets;
};

// Renders conversations with a tokenizer. Each stretch of text between markers is encoded alone,
// so a target's tokens never merge with a prompt's; a text that starts with a space loses it to a
// tokenizer that adds a space (SentencePiece's dummy prefix) to every text it encodes.
class ChatRenderer {
 public:
  using Encode = std::function<std::vector<uint32_t>(std::string_view)>;

  // A tokenizer without one of the template's markers as a piece of its own is a UserError
  // naming the marker. `encode` replaces tokenizer.encode where it gives the same ids faster
  // (BpeEncoder). The tokenizer must outlive the renderer.
  ChatRenderer(const Tokenizer& tokenizer, ChatTemplate chat_template, Encode encode = {});

  // The whole conversation, for training.
  MaskedTokens render(const Conversation& conversation) const;
  // The conversation so far, then the opening of the assistant's turn: what a model continues to
  // answer (mlgen --chat).
  std::vector<uint32_t> prompt(const Conversation& conversation) const;
  // The marker that ends an assistant's turn, where generation stops.
  uint32_t end_of_turn() const { return marker_ids_.back(); }

 private:
  MaskedTokens render(const Conversation& conversation, bool open_answer) const;

  ChatTemplate template_;
  Encode encode_;
  bool adds_space_;
  std::vector<uint32_t> marker_ids_;  // in chat_markers' order, the end-of-turn marker last
};

}  // namespace mltrain

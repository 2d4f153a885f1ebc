#pragma once

#include <istream>
#include <optional>
#include <string>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "model/generation/generate.h"
#include "model/layers/llama.h"

namespace mltrain {

// mlgen --chat: a conversation with the model, a user turn per line of `in`. Each turn is added
// to the conversation, which is rendered with the chat template (after the end-of-document
// token, as every training document follows one) and continued until the template's end-of-turn
// marker or options.max_new_tokens; the answer, printed as it is made, joins the conversation.
// `system`, when given, is the system turn. Where the conversation outgrows model.max_seq_len,
// its oldest exchanges are dropped (the system turn kept); a single turn too long for it is a
// UserError. With `one_line`, each answer is printed on one line (newlines as \n), for a script
// that reads the answers back.
void chat(Llama& model, const Tokenizer& tokenizer, ChatTemplate chat_template,
          const GenerationOptions& options, const std::optional<std::string>& system,
          std::istream& in, bool one_line);

// A text on one line: newlines as \n and backslashes as \\ (reversible), as mlgen prints
// continuations and answers for a script to read back.
std::string escaped_line(const std::string& text);

}  // namespace mltrain

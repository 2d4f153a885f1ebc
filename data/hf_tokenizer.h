#pragma once

#include <filesystem>

namespace mltrain {

// Writes the SentencePiece model `sentencepiece_model` into `directory` as Hugging Face tokenizer
// files: tokenizer.json (the same BPE as a `tokenizers` model: vocabulary, merges, byte fallback,
// no normalisation beyond spaces to U+2581), tokenizer_config.json and special_tokens_map.json,
// with the SentencePiece model itself as tokenizer.model. AutoTokenizer.from_pretrained(directory)
// then encodes text to the ids Tokenizer::encode gives, adding no special tokens; its bos and eos
// are both the end-of-document token, which every training document follows. A missing or
// unreadable model is a UserError naming it.
void write_hf_tokenizer(const std::filesystem::path& sentencepiece_model,
                        const std::filesystem::path& directory);

}  // namespace mltrain

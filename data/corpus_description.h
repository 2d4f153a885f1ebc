#pragma once

#include <filesystem>
#include <optional>

#include "data/chat_template.h"

namespace mltrain {

// What a corpus directory holds beyond llm.c's shards, said by DIR/corpus.json, which mlprep
// writes for a chat corpus: {"format": "chat", "chat_template": "chatml", "loss_masks": true}.
// A directory without the file holds plain shards (every corpus made before it existed). The file
// is what makes a missing mask an error rather than a corpus quietly trained on every token.
struct CorpusDescription {
  std::optional<ChatTemplate> chat_template;  // set for a chat corpus
  bool loss_masks = false;                    // a mask beside every shard (loss_mask.h)
};

inline constexpr const char* kCorpusDescriptionFile = "corpus.json";

void write_corpus_description(const std::filesystem::path& directory,
                              const CorpusDescription& description);

// The description in `directory`; the default (plain shards) where it has none. A file that is
// not one is a UserError naming it.
CorpusDescription read_corpus_description(const std::filesystem::path& directory);

}  // namespace mltrain

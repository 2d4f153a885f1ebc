#include "data/bpe_encoder.h"

#include <atomic>
#include <queue>
#include <string>

namespace mltrain {
namespace {

// SentencePiece's escaped space, U+2581, in UTF-8.
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

// A thread's cache holds at most this many segments; full, it starts again.
constexpr size_t kCachedSegments = size_t{1} << 17;

// Texts whose ids must be SentencePiece's for the encoder to be used: runs and ends of spaces,
// digits, tabs and newlines (byte pieces), punctuation, Chinese and an emoji.
const char* const kProbes[] = {"hello  world",
                               "  leading and trailing  ",
                               "tabs\tand\nnew lines\n\n",
                               "digits 1234567 and 3.14",
                               "a,b;c: (d) [e] {f} \"g\" 'h' -- i...",
                               "中文的句子，还有标点。",
                               "mixed 中文 and English 2024",
                               "emoji \xF0\x9F\x98\x80 end",
                               "\xE2\x96\x81 a space mark in the text",
                               "x"};

std::atomic<uint64_t> next_identity{1};

// The length of the UTF-8 character at text[i], or 0 where the bytes are not valid UTF-8.
size_t utf8_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t length = lead < 0x80           ? 1
                        : (lead >> 5) == 0x6  ? 2
                        : (lead >> 4) == 0xE  ? 3
                        : (lead >> 3) == 0x1E ? 4
                                              : 0;
  if (length == 0 || i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k)
    if ((byte(i + k) >> 6) != 0x2) return 0;
  return length;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_length(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

// Whether a piece holds a space mark after something that is not one ("a\u2581b", "a\u2581"),
// as models trained without splitting at whitespace, or with it as a suffix, have.
bool has_space_mark_after_text(std::string_view piece) {
  size_t i = 0;
  while (piece.substr(i).starts_with(kSpaceMark)) i += kSpaceMark.size();
  return piece.find(kSpaceMark, i) != std::string_view::npos;
}

}  // namespace

BpeEncoder::BpeEncoder(const Tokenizer& tokenizer)
    : tokenizer_(&tokenizer), byte_pieces_(256), identity_(next_identity++) {}

std::optional<BpeEncoder> BpeEncoder::for_model(const Tokenizer& tokenizer) {
  BpeEncoder encoder(tokenizer);
  int bytes = 0;
  const std::vector<Tokenizer::Piece> pieces = tokenizer.pieces();
  for (uint32_t id = 0; id < pieces.size(); ++id) {
    const Tokenizer::Piece& piece = pieces[id];
    switch (piece.kind) {
      case Tokenizer::PieceKind::normal:
        if (has_space_mark_after_text(piece.text)) return std::nullopt;  // the cuts would not hold
        encoder.pieces_.emplace(piece.text, Piece{id, piece.score});
        break;
      case Tokenizer::PieceKind::byte:  // "<0xAB>"
        encoder.byte_pieces_[std::stoi(piece.text.substr(3, 2), nullptr, 16)] = id;
        ++bytes;
        break;
      case Tokenizer::PieceKind::unused:
        return std::nullopt;
      case Tokenizer::PieceKind::control:
      case Tokenizer::PieceKind::unknown:
        break;
    }
  }
  if (bytes != 256) return std::nullopt;
  for (const char* probe : kProbes) {
    if (encoder.encode(probe) != tokenizer.encode(probe)) return std::nullopt;
  }
  return encoder;
}

std::vector<uint32_t> BpeEncoder::encode(std::string_view text) const {
  if (!is_valid_utf8(text)) return tokenizer_->encode(text);
  thread_local std::string normalized;
  normalized.clear();
  size_t from = 0;
  for (size_t space; (space = text.find(' ', from)) != std::string_view::npos; from = space + 1) {
    normalized.append(text.substr(from, space - from));
    normalized.append(kSpaceMark);
  }
  normalized.append(text.substr(from));

  thread_local uint64_t cache_owner = 0;
  thread_local std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>>
      cache;
  if (cache_owner != identity_ || cache.size() >= kCachedSegments) {
    cache.clear();
    cache_owner = identity_;
  }
  const std::string_view all(normalized);
  const auto space_mark_at = [&](size_t i) {
    return all.compare(i, kSpaceMark.size(), kSpaceMark) == 0;
  };
  std::vector<uint32_t> ids;
  size_t start = 0;
  for (size_t i = 1; i <= all.size(); ++i) {
    const bool cut =
        i == all.size() ||
        (space_mark_at(i) && !(i >= kSpaceMark.size() && space_mark_at(i - kSpaceMark.size())));
    if (!cut) continue;
    const std::string_view segment = all.substr(start, i - start);
    auto cached = cache.find(segment);
    if (cached == cache.end())
      cached = cache.emplace(std::string(segment), encode_segment(segment)).first;
    ids.insert(ids.end(), cached->second.begin(), cached->second.end());
    start = i;
  }
  return ids;
}

std::vector<uint32_t> BpeEncoder::encode_segment(std::string_view text) const {
  // The characters as a linked list of symbols; a merged symbol spans its parts' bytes.
  struct Symbol {
    int previous;
    int next;
    uint32_t begin;
    uint32_t end;  // begin == end: merged into the symbol before it
  };
  std::vector<Symbol> symbols;
  for (uint32_t i = 0; i < text.size();) {
    const uint32_t length = static_cast<uint32_t>(utf8_length(text, i));
    symbols.push_back({static_cast<int>(symbols.size()) - 1, static_cast<int>(symbols.size()) + 1,
                       i, i + length});
    i += length;
  }
  symbols.back().next = -1;

  // Candidate merges: the highest score first, the leftmost on a tie, as SentencePiece orders
  // them. A candidate whose symbols have changed since is stale and passed over.
  struct Candidate {
    float score;
    int left;
    uint32_t size;
  };
  const auto lower = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower)> candidates(lower);
  const auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[right].end - symbols[left].begin;
    const auto piece = pieces_.find(text.substr(symbols[left].begin, size));
    if (piece != pieces_.end()) candidates.push({piece->second.score, left, size});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i, i + 1);
  while (!candidates.empty()) {
    const Candidate best = candidates.top();
    candidates.pop();
    Symbol& left = symbols[best.left];
    if (left.begin == left.end || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.end - left.begin != best.size) continue;
    left.end = right.end;
    right.end = right.begin;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].previous = best.left;
    consider(left.previous, best.left);
    consider(best.left, left.next);
  }

  std::vector<uint32_t> ids;
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].begin, symbols[i].end - symbols[i].begin);
    const auto known = pieces_.find(piece);
    if (known != pieces_.end()) {
      ids.push_back(known->second.id);
    } else {  // byte fallback
      for (const unsigned char byte : piece) ids.push_back(byte_pieces_[byte]);
    }
  }
  return ids;
}

}  // namespace mltrain

#include "model/interop/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/json_text.h"
#include "common/shared_file.h"

namespace mltrain {
namespace {

// Headers of real checkpoints are kilobytes; anything near this is a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

constexpr std::array<std::pair<const char*, at::ScalarType>, 10> kDtypes{{
    {"F64", at::kDouble},
    {"F32", at::kFloat},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"I64", at::kLong},
    {"I32", at::kInt},
    {"I16", at::kShort},
    {"I8", at::kChar},
    {"U8", at::kByte},
    {"BOOL", at::kBool},
}};

const char* dtype_name(at::ScalarType type) {
  for (const auto& [name, scalar_type] : kDtypes) {
    if (scalar_type == type) return name;
  }
  throw UserError(fmt::format("safetensors cannot store tensors of type {}", c10::toString(type)));
}

at::ScalarType parse_dtype(const std::string& name) {
  for (const auto& [dtype, scalar_type] : kDtypes) {
    if (name == dtype) return scalar_type;
  }
  throw std::invalid_argument(fmt::format("unsupported dtype \"{}\"", name));
}

// The elements of a tensor of `shape` (one for a scalar's empty shape).
int64_t elements_of(const std::vector<int64_t>& shape) {
  int64_t elements = 1;
  for (const int64_t dim : shape) elements *= dim;
  return elements;
}

struct TensorEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// The list of non-negative integers under `key` of a tensor's entry.
std::vector<uint64_t> unsigned_list(const nlohmann::json& entry, const char* key) {
  const auto found = entry.find(key);
  if (found == entry.end() || !found->is_array())
    throw std::invalid_argument(fmt::format("\"{}\" must be a list of integers", key));
  std::vector<uint64_t> values;
  for (const nlohmann::json& value : *found) {
    // Non-negative integers are the only ones JSON parsing stores unsigned.
    if (!value.is_number_unsigned()) {
      throw std::invalid_argument(
          fmt::format("\"{}\" holds {}, not a non-negative integer", key, json_value_text(value)));
    }
    values.push_back(value.get<uint64_t>());
  }
  return values;
}

TensorEntry parse_entry(const std::string& name, const nlohmann::json& entry) {
  if (!entry.is_object()) throw std::invalid_argument("its entry must be a JSON object");
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string())
    throw std::invalid_argument("\"dtype\" must be a string");
  TensorEntry parsed{name, parse_dtype(dtype->get<std::string>()), {}, 0, 0};
  const std::vector<uint64_t> offsets = unsigned_list(entry, "data_offsets");
  if (offsets.size() != 2 || offsets[0] > offsets[1]) {
    throw std::invalid_argument("data_offsets must be [begin, end] with begin <= end");
  }
  parsed.begin = offsets[0];
  parsed.end = offsets[1];
  // The bytes, and the strides a tensor of this shape has, must be countable in 64 bits: a shape
  // whose product overflows could otherwise pass for one of few bytes.
  uint64_t bytes = at::elementSize(parsed.dtype);
  uint64_t largest_stride = bytes;
  for (const uint64_t dim : unsigned_list(entry, "shape")) {
    if (dim > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(largest_stride, std::max<uint64_t>(dim, 1), &largest_stride) ||
        largest_stride > static_cast<uint64_t>(INT64_MAX)) {
      throw std::invalid_argument("its shape has more elements than 64-bit sizes count");
    }
    bytes *= dim;
    parsed.shape.push_back(static_cast<int64_t>(dim));
  }
  if (bytes != parsed.end - parsed.begin) {
    throw std::invalid_argument(fmt::format(
        "shape [{}] of {} needs {} bytes but data_offsets span {}", fmt::join(parsed.shape, ", "),
        dtype->get<std::string>(), bytes, parsed.end - parsed.begin));
  }
  return parsed;
}

}  // namespace

SafetensorsLayout::SafetensorsLayout(const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata) {
  for (const SafetensorsEntry& entry : entries) {
    if (!entries_.emplace(entry.name, std::pair{entry, uint64_t{0}}).second)
      throw std::invalid_argument(fmt::format("tensor '{}' is named twice", entry.name));
  }
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& [name, placed] : entries_) {
    const SafetensorsEntry& entry = placed.first;
    const uint64_t bytes =
        at::elementSize(entry.dtype) * static_cast<uint64_t>(elements_of(entry.shape));
    header[name] = {{"dtype", dtype_name(entry.dtype)},
                    {"shape", entry.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    placed.second = offset;
    offset += bytes;
  }
  std::string header_text = json_text(header);
  // Pad with spaces so the data starts 8-byte aligned, as the reference implementation does.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_length = header_text.size();
  // x86-64 and aarch64 are little-endian.
  head_.assign(reinterpret_cast<const char*>(&header_length), sizeof(header_length));
  head_ += header_text;
  for (auto& [name, placed] : entries_) placed.second += head_.size();
  file_bytes_ = head_.size() + offset;
}

const SafetensorsEntry& SafetensorsLayout::entry(const std::string& name) const {
  const auto found = entries_.find(name);
  if (found == entries_.end())
    throw std::invalid_argument(fmt::format("the file has no tensor '{}'", name));
  return found->second.first;
}

uint64_t SafetensorsLayout::file_offset(const std::string& name) const {
  entry(name);
  return entries_.at(name).second;
}

SafetensorsShare whole_share(const NamedTensors& tensors) {
  SafetensorsShare share;
  for (const auto& [name, tensor] : tensors) {
    share.entries.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
    share.pieces.push_back({.name = name, .first = 0, .values = tensor});
  }
  return share;
}

void create_safetensors(const std::filesystem::path& path, const SafetensorsLayout& layout) {
  make_file_of_size(path, layout.head(), layout.file_bytes());
}

void write_safetensors_pieces(const std::filesystem::path& path, const SafetensorsLayout& layout,
                              const std::vector<TensorPiece>& pieces) {
  // Every piece is checked before any is written.
  for (const TensorPiece& piece : pieces) {
    const SafetensorsEntry& entry = layout.entry(piece.name);
    const int64_t elements = elements_of(entry.shape);
    if (piece.values.scalar_type() != entry.dtype || piece.first < 0 ||
        piece.first + piece.values.numel() > elements) {
      throw std::invalid_argument(
          fmt::format("a piece of {} elements of {} at element {} does not fit tensor '{}' ({} "
                      "elements of {})",
                      piece.values.numel(), c10::toString(piece.values.scalar_type()), piece.first,
                      piece.name, elements, c10::toString(entry.dtype)));
    }
  }
  // The writers place their pieces by the layout each computed: the file's header must be the
  // same, or the pieces would land in the wrong places unseen.
  std::string head(layout.head().size(), '\0');
  InputFile(path, "safetensors file").read_at(0, head.data(), head.size());
  if (head != layout.head())
    throw std::invalid_argument(path.string() + ": its header is not the one its pieces are for");
  SharedFileWriter file(path);
  for (const TensorPiece& piece : pieces) {
    const at::Tensor values = piece.values.detach().to(at::kCPU).contiguous();
    file.write_at(
        layout.file_offset(piece.name) + static_cast<uint64_t>(piece.first) * values.element_size(),
        values.data_ptr(), values.nbytes());
  }
  file.flush();
}

void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  std::vector<at::Tensor> payloads;  // in the layout's order, which is the map's: by name
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    entries.push_back({name, cpu.scalar_type(), cpu.sizes().vec()});
    payloads.push_back(cpu);
  }
  const SafetensorsLayout layout(entries, metadata);
  AtomicFileWriter file(path);
  file.write(layout.head());
  for (const at::Tensor& payload : payloads) file.write(payload.data_ptr(), payload.nbytes());
  file.commit();
}

SafetensorsReader::SafetensorsReader(const std::filesystem::path& path)
    : in_(path, "safetensors file") {
  const auto fail = [&path](const std::string& what) {
    return UserError(fmt::format("{}: {}", path.string(), what));
  };
  const InputFile& in = in_;
  const uint64_t file_size = in.size();

  uint64_t header_length = 0;
  if (file_size < sizeof(header_length))
    throw fail("truncated: shorter than the 8-byte header length");
  in.read_at(0, &header_length, sizeof(header_length));
  if (header_length > kMaxHeaderBytes || header_length > file_size - sizeof(header_length)) {
    throw fail(
        fmt::format("header length {} does not fit a file of {} bytes (corrupt or truncated)",
                    header_length, file_size));
  }
  std::string header_text(header_length, '\0');
  in.read_at(sizeof(header_length), header_text.data(), header_length);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& error) {
    throw fail(fmt::format("header is not valid JSON ({})", error.what()));
  }
  if (!header.is_object()) throw fail("header is not a JSON object");

  std::vector<TensorEntry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      entries.push_back(parse_entry(name, entry));
    } catch (const std::exception& error) {  // missing fields, wrong JSON types, bad values
      throw fail(fmt::format("tensor '{}': {}", name, error.what()));
    }
  }

  // The data section must be exactly the tensors, back to back: a gap, an overlap or a short
  // section means the file was damaged or written wrongly.
  std::sort(entries.begin(), entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  const uint64_t data_size = file_size - sizeof(header_length) - header_length;
  uint64_t expected_begin = 0;
  for (const TensorEntry& entry : entries) {
    if (entry.begin != expected_begin) {
      throw fail(
          fmt::format("tensor '{}' starts at data byte {} where {} was expected "
                      "(overlapping or non-contiguous tensors)",
                      entry.name, entry.begin, expected_begin));
    }
    if (entry.end > data_size) {
      throw fail(
          fmt::format("tensor '{}' ends at data byte {} but the file holds {} bytes of data "
                      "(truncated)",
                      entry.name, entry.end, data_size));
    }
    expected_begin = entry.end;
  }
  if (expected_begin != data_size) {
    throw fail(fmt::format("{} bytes of data follow the last tensor", data_size - expected_begin));
  }
  data_begin_ = sizeof(header_length) + header_length;
  for (const TensorEntry& entry : entries)
    placed_.emplace(entry.name, Placed{{entry.name, entry.dtype, entry.shape}, entry.begin});
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  const auto found = placed_.find(name);
  return found == placed_.end() ? nullptr : &found->second.entry;
}

std::vector<SafetensorsEntry> SafetensorsReader::entries() const {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, placed] : placed_) entries.push_back(placed.entry);
  return entries;
}

at::Tensor SafetensorsReader::read(const std::string& name, int64_t first, int64_t count) const {
  const Placed& placed = placed_.at(name);
  at::Tensor values = at::empty({count}, at::TensorOptions().dtype(placed.entry.dtype));
  in_.read_at(data_begin_ + placed.begin + static_cast<uint64_t>(first) * values.element_size(),
              values.data_ptr(), values.nbytes());
  return values;
}

NamedTensors SafetensorsReader::read_all() const {
  NamedTensors tensors;
  for (const auto& [name, placed] : placed_) {
    tensors.emplace(name,
                    read(name, 0, elements_of(placed.entry.shape)).reshape(placed.entry.shape));
  }
  return tensors;
}

void SafetensorsReader::read_pieces(const std::vector<TensorPiece>& pieces) const {
  for (const TensorPiece& piece : pieces) {
    const SafetensorsEntry* entry = find(piece.name);
    if (entry == nullptr || piece.first < 0 ||
        piece.first + piece.values.numel() > elements_of(entry->shape)) {
      throw UserError(fmt::format("{}: holds no elements {} to {} of a tensor '{}'",
                                  in_.path().string(), piece.first,
                                  piece.first + piece.values.numel(), piece.name));
    }
  }
  at::NoGradGuard no_grad;
  for (const TensorPiece& piece : pieces) {
    // Read in the file's dtype, then copied (and cast) to wherever the piece lives.
    piece.values.copy_(
        read(piece.name, piece.first, piece.values.numel()).view(piece.values.sizes()));
  }
}

NamedTensors load_safetensors(const std::filesystem::path& path) {
  return SafetensorsReader(path).read_all();
}

}  // namespace mltrain

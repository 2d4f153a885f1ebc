#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/input_file.h"

namespace mltrain {

using NamedTensors = std::map<std::string, at::Tensor>;

// The .safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the tensors' raw little-endian bytes, packed with no gaps.

// Writes the tensors (copied to the CPU, contiguous) atomically: a reader never sees a partial
// file.
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor of a safetensors file, as its header gives it.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

// Where the tensors of a file lie: the header save_safetensors writes for them (the tensors in the
// order of their names) and each tensor's first byte.
class SafetensorsLayout {
 public:
  explicit SafetensorsLayout(const std::vector<SafetensorsEntry>& entries,
                             const std::map<std::string, std::string>& metadata = {});

  // The 8-byte header length and the header, which the data follows.
  const std::string& head() const { return head_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // Where `name`'s first byte is in the file, and its entry; a name not in the file throws.
  uint64_t file_offset(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;

 private:
  std::map<std::string, std::pair<SafetensorsEntry, uint64_t>> entries_;  // by name: with offset
  std::string head_;
  uint64_t file_bytes_ = 0;
};

// Elements [first, first + values.numel()) of the tensor `name`, in its row-major order.
struct TensorPiece {
  std::string name;
  int64_t first = 0;
  at::Tensor values;
};

// What one process writes of a file that several write together: the pieces it holds and the
// entries of the whole file, which every writer needs to place its pieces.
struct SafetensorsShare {
  std::vector<SafetensorsEntry> entries;
  std::vector<TensorPiece> pieces;
};

// The whole of `tensors` as one share.
SafetensorsShare whole_share(const NamedTensors& tensors);

// Makes `path` a file of `layout`: its header, and zeros where the tensors go until
// write_safetensors_pieces() fills them.
void create_safetensors(const std::filesystem::path& path, const SafetensorsLayout& layout);

// Writes `pieces` into their places in `path`, made by create_safetensors with `layout`, and
// flushes them to disk. Several processes may write theirs at once. A piece of a tensor the layout
// lacks, of another dtype, or past the tensor's end throws std::invalid_argument.
void write_safetensors_pieces(const std::filesystem::path& path, const SafetensorsLayout& layout,
                              const std::vector<TensorPiece>& pieces);

// A safetensors file whose header is read and validated at once, as load_safetensors validates it
// (a failure is a UserError naming the file and, where one is at fault, the tensor), and whose
// tensors are read when asked for: all of them, or pieces of them into tensors of the caller's.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& path);

  // The entry of the tensor `name`; none where the file has no such tensor.
  const SafetensorsEntry* find(const std::string& name) const;
  // Every tensor's entry, in the order of their names.
  std::vector<SafetensorsEntry> entries() const;
  // Every tensor, into CPU memory.
  NamedTensors read_all() const;
  // Reads each piece's elements into its `values` (of any dtype, on any device: cast and copied
  // there from the file's). A piece of a tensor the file lacks, or past its end, is a UserError
  // naming the file, before anything is read.
  void read_pieces(const std::vector<TensorPiece>& pieces) const;

 private:
  struct Placed {
    SafetensorsEntry entry;
    uint64_t begin = 0;  // the tensor's first byte in the data section
  };
  at::Tensor read(const std::string& name, int64_t first, int64_t count) const;

  InputFile in_;
  uint64_t data_begin_ = 0;
  std::map<std::string, Placed> placed_;
};

// Reads every tensor into CPU memory. Validates the header length, the JSON, each dtype, shape and
// offset range, and that the data section is exactly covered; a failure is a UserError naming the
// file and, where one is at fault, the tensor.
NamedTensors load_safetensors(const std::filesystem::path& path);

}  // namespace mltrain

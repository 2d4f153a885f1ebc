#include "dist/unit_shards.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

namespace mltrain {
namespace {

// The storage under `tensor`, shared with every view of it (the parameters).
c10::StorageImpl& storage_of(const at::Tensor& tensor) {
  return *tensor.storage().unsafeGetStorageImpl();
}

}  // namespace

UnitShards::UnitShards(std::vector<at::Tensor> parameters, std::vector<BucketLayout> units,
                       std::vector<size_t> order, Communicator& communicator,
                       at::ScalarType gather_dtype)
    : parameters_(std::move(parameters)),
      order_(std::move(order)),
      communicator_(communicator),
      gather_dtype_(gather_dtype),
      backward_reads_(order_.size(), true) {
  for (const size_t unit : order_)
    if (unit >= units.size()) throw std::invalid_argument("UnitShards: a position of no unit");
  at::NoGradGuard no_grad;
  const int ranks = communicator_.size();
  const bool without_bytes =
      std::all_of(parameters_.begin(), parameters_.end(),
                  [](const at::Tensor& parameter) { return parameter.storage().nbytes() == 0; });
  for (BucketLayout& layout : units) {
    if (layout.members.empty() || layout.elements % ranks != 0)
      throw std::invalid_argument("UnitShards: a unit without members, or not cut into parts");
    const at::TensorOptions options = parameters_.at(layout.members.front()).options();
    if (options.dtype() != at::kFloat)
      throw std::invalid_argument("UnitShards: the parts are kept in fp32");
    Unit unit;
    unit.layout = std::move(layout);
    const int64_t elements = unit.layout.part_elements(ranks);
    if (without_bytes) {
      // The parameters stay as they were made (fp32, for what is built over them, as the reducer's
      // buckets) until fill() makes them views of the unit.
      unit.part = at::zeros({elements}, options);
      unit.whole = at::empty({unit.layout.elements}, options.dtype(gather_dtype_));
      unit.has_bytes = true;
      free(unit);
      units_.push_back(std::move(unit));
      continue;
    }
    const at::Tensor flat = at::zeros({unit.layout.elements}, options);
    for (size_t k = 0; k < unit.layout.members.size(); ++k) {
      const at::Tensor& parameter = parameters_.at(unit.layout.members[k]);
      unit.layout.member_view(flat, k, parameter.sizes()).copy_(parameter);
    }
    view_parameters(unit, flat);
    unit.part = flat.narrow(0, communicator_.rank() * elements, elements).clone();
    if (casts()) {
      unit.kept = flat;
      unit.whole = at::empty({unit.layout.elements}, options.dtype(gather_dtype_));
      unit.has_bytes = true;
      free(unit);
    } else {
      unit.whole = flat;
      unit.has_bytes = true;
    }
    units_.push_back(std::move(unit));
  }
  kept_whole_ = !without_bytes;
  most_whole_ = whole_units();
}

UnitShards::~UnitShards() {
  // A gather in flight writes into its unit's storage: it lands before the storage goes.
  for (Unit& unit : units_) {
    if (unit.gathering) unit.gathering->wait();
  }
}

int64_t UnitShards::part_begin(size_t unit) const {
  return communicator_.rank() * units_.at(unit).layout.part_elements(communicator_.size());
}

// The unit's whole tensor with bytes again (the device's allocator now, rather than the one the
// storage was made with: a test's counting allocator sees the gathers).
void UnitShards::give_bytes(Unit& unit) {
  c10::StorageImpl& storage = storage_of(unit.whole);
  const size_t bytes = unit.whole.numel() * unit.whole.element_size();
  storage.set_data_ptr_noswap(c10::GetAllocator(unit.whole.device().type())->allocate(bytes));
  storage.set_nbytes(bytes);
}

// Gives the unit's whole tensor its bytes again, puts this rank's part in place (cast to the
// gather dtype) and starts the all-gather of the others'. Nothing when it is whole or on its way
// already.
void UnitShards::gather(size_t index) {
  Unit& unit = units_[index];
  if (unit.has_bytes) return;
  give_bytes(unit);
  at::NoGradGuard no_grad;
  unit.whole.narrow(0, part_begin(index), unit.part.numel()).copy_(unit.part);
  unit.gathering = communicator_.all_gather(unit.whole);
  ++gathers_;
  // Only now: a gather that failed to start leaves the unit freed, not whole with one part.
  unit.has_bytes = true;
  most_whole_ = std::max(most_whole_, whole_units());
}

void UnitShards::wait_whole(size_t index) {
  gather(index);
  Unit& unit = units_[index];
  if (!unit.gathering) return;
  unit.gathering->wait();
  unit.gathering.reset();
}

void UnitShards::free(Unit& unit) {
  if (!unit.has_bytes) return;
  // The all-gather writes into the storage until it completes.
  if (unit.gathering) {
    unit.gathering->wait();
    unit.gathering.reset();
  }
  c10::StorageImpl& storage = storage_of(unit.whole);
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, unit.whole.device()));
  storage.set_nbytes(0);
  unit.has_bytes = false;
}

// Each of the unit's parameters a view of `flat`, laid out as the unit is. A view is made only of
// a tensor with bytes; a parameter keeps viewing its storage once they are freed.
void UnitShards::view_parameters(const Unit& unit, const at::Tensor& flat) {
  for (size_t k = 0; k < unit.layout.members.size(); ++k) {
    at::Tensor& parameter = parameters_.at(unit.layout.members[k]);
    parameter.set_data(unit.layout.member_view(flat, k, parameter.sizes()));
  }
}

// The parameters views of the unit's whole tensor in the gather dtype, which is then freed: made
// with bytes for as long as the views take to make.
void UnitShards::view_freed(Unit& unit) {
  give_bytes(unit);
  unit.has_bytes = true;
  view_parameters(unit, unit.whole);
  free(unit);
}

bool UnitShards::read_twice(size_t unit) const {
  return std::count(order_.begin(), order_.end(), unit) > 1;
}

bool UnitShards::read_after(size_t position) const {
  return std::find(order_.begin() + static_cast<std::ptrdiff_t>(position) + 1, order_.end(),
                   order_[position]) != order_.end();
}

void UnitShards::before_forward(size_t position) {
  std::lock_guard lock(mutex_);
  if (kept_whole_) return;
  wait_whole(order_.at(position));
  if (position + 1 < order_.size()) gather(order_[position + 1]);
}

void UnitShards::after_forward(size_t position, bool backward_follows, bool backward_reads) {
  std::lock_guard lock(mutex_);
  backward_reads_.at(position) = backward_reads;
  if (kept_whole_) return;
  const bool last = position + 1 == order_.size();
  if (read_after(position) || (last && backward_follows)) return;
  free(units_[order_.at(position)]);
}

// The unit after this position's may still be whole: autograd has computed its input's gradient,
// which calls this, but not necessarily added up all its weights' gradients, which releases it.
// The previous position's unit is then gathered once it goes, so that two units at most are whole.
void UnitShards::before_backward(size_t position) {
  std::lock_guard lock(mutex_);
  if (kept_whole_) return;
  const size_t unit = order_.at(position);
  wait_whole(unit);
  if (position == 0 || !backward_reads_[position - 1]) return;
  const size_t previous = order_[position - 1];
  const bool after_is_whole = position + 1 < order_.size() && !read_twice(order_[position + 1]) &&
                              units_[order_[position + 1]].has_bytes;
  if (after_is_whole) {
    deferred_gather_ = previous;
  } else {
    gather(previous);
  }
}

void UnitShards::release(size_t unit) {
  std::lock_guard lock(mutex_);
  if (kept_whole_) return;
  free(units_.at(unit));
  if (deferred_gather_) {
    gather(*deferred_gather_);
    deferred_gather_.reset();
  }
}

void UnitShards::release_all() {
  std::lock_guard lock(mutex_);
  if (kept_whole_) return;
  deferred_gather_.reset();
  for (Unit& unit : units_) free(unit);
}

void UnitShards::make_whole() {
  std::lock_guard lock(mutex_);
  if (kept_whole_) return;
  // A unit left whole since before an update holds the weights before it: each is gathered anew
  // from the parts, in fp32 where they are gathered in another dtype to train.
  for (Unit& unit : units_) free(unit);
  if (!casts()) {
    for (size_t u = 0; u < units_.size(); ++u) wait_whole(u);
    kept_whole_ = true;
    return;
  }
  // Every unit gathered before any parameter views it: a gather that fails leaves the parameters
  // as they were.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> kept;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    kept.push_back(at::empty({unit.layout.elements}, unit.part.options()));
    kept.back().narrow(0, part_begin(u), unit.part.numel()).copy_(unit.part);
    communicator_.all_gather(kept.back())->wait();
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].kept = std::move(kept[u]);
    view_parameters(units_[u], units_[u].kept);
  }
  most_whole_ = std::max(most_whole_, whole_units());
  kept_whole_ = true;
}

void UnitShards::shard() {
  std::lock_guard lock(mutex_);
  if (!kept_whole_) return;
  at::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    const at::Tensor& kept = casts() ? unit.kept : unit.whole;
    unit.part.copy_(kept.narrow(0, part_begin(u), unit.part.numel()));
    if (casts()) {
      // The parameters view the gather dtype's tensor from here on.
      view_freed(unit);
      unit.kept = at::Tensor();
    }
    free(unit);
  }
  kept_whole_ = false;
}

void UnitShards::fill(const Fill& fill) {
  std::lock_guard lock(mutex_);
  const auto members = [&](const Unit& unit) {
    std::vector<at::Tensor> tensors;
    for (const size_t member : unit.layout.members) tensors.push_back(parameters_.at(member));
    return tensors;
  };
  if (kept_whole_) {
    for (const Unit& unit : units_) fill(members(unit));
    return;
  }
  at::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    // A unit left whole since an update holds the weights before it; these replace them.
    free(unit);
    // In fp32, for the part: the whole tensor itself where the unit is gathered in fp32.
    at::Tensor flat;
    if (casts()) {
      flat = at::empty({unit.layout.elements}, unit.part.options());
    } else {
      give_bytes(unit);
      unit.has_bytes = true;
      flat = unit.whole;
    }
    // The padding past the members goes into the last part: zeros, as the constructor leaves it.
    flat.zero_();
    view_parameters(unit, flat);
    // Every rank learns whether every rank's fill went through before any broadcast, so that a
    // failure on one (a file it cannot read) ends them all alike, the unit as it was.
    std::exception_ptr failure;
    try {
      fill(members(unit));
    } catch (...) {
      failure = std::current_exception();
    }
    const bool all_filled = communicator_.all_reduce_sum(failure ? 1.0 : 0.0) == 0.0;
    if (all_filled) {
      communicator_.broadcast(flat, 0);
      unit.part.copy_(flat.narrow(0, part_begin(u), unit.part.numel()));
    }
    if (casts()) {
      view_freed(unit);
    } else {
      free(unit);
    }
    if (failure) std::rethrow_exception(failure);
    if (!all_filled) throw std::runtime_error("another rank could not fill its weights");
  }
}

int64_t UnitShards::gathers() const {
  std::lock_guard lock(mutex_);
  return gathers_;
}

int64_t UnitShards::whole_units() const {
  return std::count_if(units_.begin(), units_.end(),
                       [](const Unit& unit) { return unit.has_bytes || unit.kept.defined(); });
}

int64_t UnitShards::most_whole_units() const {
  std::lock_guard lock(mutex_);
  return most_whole_;
}

void UnitShards::reset_most_whole_units() {
  std::lock_guard lock(mutex_);
  most_whole_ = whole_units();
}

}  // namespace mltrain

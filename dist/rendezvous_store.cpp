#include "dist/rendezvous_store.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "common/error.h"

namespace mltrain {
namespace {

constexpr std::string_view kFilePrefix = "file:";

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string environment_text(const std::string& name) {
  return process_environment(name).value_or("");
}

// Whether torchrun's agent serves the store its ranks meet at (TORCHELASTIC_USE_AGENT_STORE).
bool served_by_torchrun() { return environment_text("TORCHELASTIC_USE_AGENT_STORE") == "True"; }

// A FileStore's file is a regular file (or none yet) in a directory that must be there and
// writable: that is the user's to fix (exit 2), where the store itself would fail later with a
// message of its own. Checked with access(), not by making a file: ranks that share the directory
// would race for its name.
void check_store_file(const std::string& rendezvous) {
  const std::filesystem::path file =
      std::filesystem::absolute(rendezvous.substr(kFilePrefix.size()));
  const std::filesystem::path directory = file.parent_path();
  std::error_code missing;
  const std::filesystem::file_status status = std::filesystem::status(file, missing);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw UserError(fmt::format(
        "dist.rendezvous {}: {} is not a file (a directory, a pipe or a device): name a file for "
        "the store, new for each run",
        rendezvous, file.string()));
  }
  std::string why;
  if (!std::filesystem::is_directory(directory)) {
    why = "no such directory";
  } else if (::access(directory.c_str(), W_OK) != 0) {
    why = std::strerror(errno);
  } else {
    return;
  }
  throw UserError(fmt::format(
      "dist.rendezvous {}: cannot make the store's file in {}: {}; give a file in a directory "
      "that every rank shares and may write",
      rendezvous, directory.string(), why));
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_rendezvous(const World& world,
                                                   const std::string& rendezvous,
                                                   double timeout_s) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
  if (rendezvous.starts_with(kFilePrefix)) check_store_file(rendezvous);
  std::string where;
  try {
    c10::intrusive_ptr<c10d::Store> store;
    if (rendezvous.starts_with(kFilePrefix)) {
      where = fmt::format("the file store {}", rendezvous.substr(kFilePrefix.size()));
      store =
          c10::make_intrusive<c10d::FileStore>(rendezvous.substr(kFilePrefix.size()), world.size);
      store->setTimeout(timeout);
    } else {
      where = fmt::format("{}:{} (TCP, served by rank 0)", world.rendezvous_host,
                          world.rendezvous_port);
      c10d::TCPStoreOptions options;
      options.port = static_cast<uint16_t>(world.rendezvous_port);
      // torchrun's agent serves a store at MASTER_ADDR:MASTER_PORT itself, and says so.
      options.isServer = world.rank == 0 && !served_by_torchrun();
      options.numWorkers = world.size;
      options.waitWorkers = true;
      options.timeout = timeout;
      store = c10::make_intrusive<c10d::TCPStore>(world.rendezvous_host, options);
    }
    // The agent's store outlives a restart of the ranks: each attempt counts under its own keys.
    if (served_by_torchrun())
      store = c10::make_intrusive<c10d::PrefixStore>(
          fmt::format("mltrain/{}/{}", environment_text("TORCHELASTIC_RUN_ID"),
                      environment_text("TORCHELASTIC_RESTART_COUNT")),
          store);
    // Every rank is there once each has checked in: a barrier over the store.
    store->add("mltrain/arrived", 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (store->add("mltrain/arrived", 0) < world.size) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(
            fmt::format("{} of {} ranks arrived", store->add("mltrain/arrived", 0), world.size));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return store;
  } catch (const std::exception& error) {
    throw std::runtime_error(
        fmt::format("rank {} of {}: the rendezvous at {} failed within dist.timeout_s = {} s: {}",
                    world.rank, world.size, where, timeout_s, first_line(error.what())));
  }
}

}  // namespace mltrain

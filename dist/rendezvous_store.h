#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

#include "dist/world.h"

namespace mltrain {

// Where the ranks of a world started without MPI meet to set up their communicators (the Gloo
// group's addresses, the NCCL unique id), as dist.rendezvous says: "tcp", a c10d TCPStore that
// rank 0 serves at the launcher's rendezvous host and port, or "file:PATH", a c10d FileStore in
// a file on a filesystem every rank shares and that no earlier run left behind. Every wait, the
// store's file's lock included, ends within timeout_s: a rank that does not come is an error
// (exit 1) that says where they were to meet, how many ranks came and which did not. What the
// user is to fix is a UserError (exit 2) on every rank that came, at once: a file that holds
// something other than a store's records, or an earlier meeting's; ranks started with different
// numbers of ranks, or two with the same rank.
c10::intrusive_ptr<c10d::Store> connect_rendezvous(const World& world,
                                                   const std::string& rendezvous, double timeout_s);

}  // namespace mltrain

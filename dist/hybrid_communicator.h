#pragma once

#include <memory>

#include "dist/communicator.h"

namespace mltrain {

// Hybrid sharding (HSDP, dist.shard_ranks): the ranks in groups of `shard_ranks` consecutive ranks
// (a node's, under a launcher that numbers ranks node by node), each group holding one replica of
// what is sharded, cut among its own ranks; rank r is rank r % shard_ranks of group
// r / shard_ranks. The communicator a sharded optimizer uses on such a run: its ranks, and the
// parts it cuts, are the group's; reduce-scatters, all-gathers, broadcasts and host sums run
// within the group, where the parts are; average_across_replicas averages a part among the ranks
// of the other groups that hold the same part, once a step (grad_reducer.h), so that what crosses
// between groups (between nodes) is each rank's part of the gradients, once a step, however many
// micro-steps reduce-scatter within the group. all_reduce_average (a clipping norm, Muon's whole
// gradients) averages over every rank: within the group, then across the groups, the whole
// tensor each time. A collective; every rank of `ranks` calls it alike, and the groups are
// communicators of their own, which `ranks` need not outlive.
std::unique_ptr<Communicator> make_hybrid_communicator(Communicator& ranks, int shard_ranks);

}  // namespace mltrain

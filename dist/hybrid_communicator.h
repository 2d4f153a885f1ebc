#pragma once

#include <memory>

#include "dist/communicator.h"

namespace mltrain {

// Hybrid sharding (HSDP, dist.shard_ranks): the ranks in groups of `shard_ranks` consecutive ranks
// (a node's, under a launcher that numbers ranks node by node), each group holding one replica of
// what is sharded, cut among its own ranks; rank r is rank r % shard_ranks of group
// r / shard_ranks. The communicator a sharded optimizer uses on such a run: its ranks, and the
// parts it cuts, are the group's; all-gathers, broadcasts and host sums run within the group,
// where the parts are; averages are over every rank of `ranks`: a reduce-scatter within the group,
// then an all-reduce of this rank's part among the ranks of the other groups that hold the same
// part (the replicas), so that the bytes that cross between groups (between nodes) are the
// parts, not whole buckets. `ranks` must outlive it only while it is made: the groups are
// communicators of their own. A collective; every rank of `ranks` calls it alike.
std::unique_ptr<Communicator> make_hybrid_communicator(Communicator& ranks, int shard_ranks);

}  // namespace mltrain

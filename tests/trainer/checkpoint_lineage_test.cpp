#include "trainer/run/checkpoint_lineage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace mltrain {
namespace {

using Steps = std::vector<int64_t>;

// Resumed from step 8 (checkpoints 6 and 8 kept) with a learning rate that wrecks the weights in
// one update: step 9 is applied, every step after it is skipped. The run goes back to 8, then,
// when the trouble comes back, to 6, then stops: 8 stays the last good checkpoint, and neither is
// bad (the update after them was at fault, not their weights).
TEST(CheckpointLineage, TroubleThatComesBackGoesFurtherBackThenNamesTheNewestGood) {
  CheckpointLineage lineage(8);
  const Steps available = {8, 6};
  lineage.applied(9);
  CheckpointLineage::Rollback first = lineage.roll_back(available);
  EXPECT_TRUE(first.bad.empty());
  EXPECT_EQ(first.target, 8);

  lineage.applied(9);
  CheckpointLineage::Rollback second = lineage.roll_back(available);
  EXPECT_TRUE(second.bad.empty());
  EXPECT_EQ(second.target, 6);

  lineage.applied(7);
  CheckpointLineage::Rollback third = lineage.roll_back(available);
  EXPECT_TRUE(third.bad.empty());
  EXPECT_FALSE(third.target);
  EXPECT_EQ(lineage.newest_good(available), 8);
  EXPECT_EQ(lineage.tried(), (Steps{8, 6})) << "in the order the rollbacks went";
}

// A checkpoint saved right after the destructive update holds the wrecked weights. The rollback
// tries it first (the trouble might have been a few samples); when its weights give only skipped
// steps again, it is bad, and the run goes to the one before it. The same step saved again from
// there is not gone back to twice: when the trouble comes back the run stops, that checkpoint
// (which no step confirmed) is bad too, and the last good one is the one before.
TEST(CheckpointLineage, ACheckpointThatGivesOnlySkippedStepsIsBad) {
  CheckpointLineage lineage(8);
  lineage.applied(9);
  lineage.saved(9);
  EXPECT_EQ(lineage.newest_good({9, 8}), 8) << "9 is not confirmed yet";
  CheckpointLineage::Rollback first = lineage.roll_back({9, 8});
  EXPECT_TRUE(first.bad.empty());
  EXPECT_EQ(first.target, 9);
  CheckpointLineage::Rollback second = lineage.roll_back({9, 8});
  EXPECT_EQ(second.bad, Steps{9});
  EXPECT_EQ(second.target, 8);

  lineage.applied(9);
  lineage.saved(9);
  CheckpointLineage::Rollback third = lineage.roll_back({9, 8});
  EXPECT_FALSE(third.target);
  EXPECT_EQ(third.bad, Steps{9});
  EXPECT_EQ(lineage.newest_good({9, 8}), 8);
}

// A checkpoint that an applied step confirmed is never bad, even when gone back to it gives only
// skipped steps (a long stretch of bad samples): the run goes further back, and names it good.
TEST(CheckpointLineage, AConfirmedCheckpointIsNeverBad) {
  CheckpointLineage lineage(std::nullopt);
  for (const int64_t step : {2, 4, 5}) {
    lineage.applied(step);
    if (step % 2 == 0) lineage.saved(step);
  }
  EXPECT_EQ(lineage.roll_back({4, 2}).target, 4);
  CheckpointLineage::Rollback rollback = lineage.roll_back({4, 2});
  EXPECT_TRUE(rollback.bad.empty());
  EXPECT_EQ(rollback.target, 2);
  EXPECT_EQ(lineage.newest_good({4, 2}), 4);
}

// Trouble that comes back at the same step whatever the run goes back to (a schedule that blows
// up there): each rollback goes to a step not gone back to before, checkpoints saved again on the
// way included, so the rollbacks are at most one per step held, not one per path through them.
TEST(CheckpointLineage, RollbacksAreAtMostOnePerStepHeld) {
  constexpr int64_t kTrouble = 9;  // every step from 9 on is skipped
  CheckpointLineage lineage(std::nullopt);
  Steps available;
  int64_t step = 0;
  int rollbacks = 0;
  for (int attempts = 0; attempts < 1000; ++attempts) {
    while (step + 1 < kTrouble) {
      lineage.applied(++step);
      if (step % 2 == 0) {
        lineage.saved(step);
        if (std::find(available.begin(), available.end(), step) == available.end())
          available.push_back(step);
      }
    }
    const CheckpointLineage::Rollback rollback = lineage.roll_back(available);
    for (const int64_t bad : rollback.bad) std::erase(available, bad);
    if (!rollback.target) break;
    ++rollbacks;
    step = *rollback.target;
  }
  EXPECT_EQ(rollbacks, 4) << "to 8, 6, 4 and 2, once each";
  // No step from 8's weights was ever applied: the last good checkpoint is 6.
  EXPECT_EQ(lineage.newest_good(available), 6);
  EXPECT_EQ(available, (Steps{2, 4, 6}));
}

// Pruning keeps the newest checkpoint that a later applied step confirms: not the one just saved
// (nothing trained from it yet), but the one before it.
TEST(CheckpointLineage, ACheckpointIsConfirmedByAStepAppliedAfterIt) {
  CheckpointLineage lineage(4);
  EXPECT_FALSE(lineage.confirmed());
  lineage.applied(5);
  EXPECT_EQ(lineage.confirmed(), 4);
  lineage.saved(5);
  EXPECT_EQ(lineage.confirmed(), 4);
  lineage.applied(6);
  EXPECT_EQ(lineage.confirmed(), 5);
}

// A fresh run with no checkpoint has nothing to go back to, and no good checkpoint to name.
TEST(CheckpointLineage, NothingSavedIsNothingToGoBackTo) {
  CheckpointLineage lineage(std::nullopt);
  lineage.applied(3);
  const CheckpointLineage::Rollback rollback = lineage.roll_back({});
  EXPECT_FALSE(rollback.target);
  EXPECT_FALSE(lineage.newest_good({}));
}

}  // namespace
}  // namespace mltrain

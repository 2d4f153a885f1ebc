#pragma once

namespace mltrain {

// Graceful stops: after install_stop_handlers(), SIGTERM (Slurm pre-emption, `kill`), SIGUSR1
// (Slurm's --signal warning) and a first SIGINT (Ctrl-C) only set a flag that the training loop
// reads at the next step boundary, where it checkpoints and exits 0. A second SIGINT exits at once
// (code 130): the way out when the current step itself is stuck.
void install_stop_handlers();

// The signal that asked the run to stop, or 0.
int stop_requested();

}  // namespace mltrain

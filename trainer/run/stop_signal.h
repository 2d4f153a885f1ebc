#pragma once

namespace mltrain {

// Graceful stops: after install_stop_handlers(), SIGTERM (Slurm pre-emption, `kill`), SIGUSR1
// (Slurm's --signal warning; what mpirun forwards to every rank, see launch/local_ranks.sh),
// SIGHUP (a closed terminal) and a first SIGINT (Ctrl-C) only set a flag that the training loop
// reads at the next step boundary, where it checkpoints and exits 0. A second SIGINT exits at once
// (code 130): the way out when the current step itself is stuck. SIGHUP and SIGINT stay ignored
// where the process was started ignoring them (nohup; a shell's background job).
void install_stop_handlers();

// The signal that asked the run to stop, or 0.
int stop_requested();

}  // namespace mltrain

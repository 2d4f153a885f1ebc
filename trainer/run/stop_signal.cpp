#include "trainer/run/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace mltrain {
namespace {

std::atomic<int> requested_signal{0};

// Only an interrupt is acknowledged here, to the person at the terminal; the training loop says
// what it does about any stop request once it acts on it. A launcher that signals every rank
// because one died (mpirun sends SIGTERM, then SIGKILL) then leaves no promise of a checkpoint
// that the ranks cannot keep.
extern "C" void on_stop_signal(int signal) {
  if (signal == SIGINT && requested_signal.load() == SIGINT) {
    constexpr char kMessage[] = "\nsecond interrupt: exiting without a checkpoint\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    ::_exit(130);
  }
  if (requested_signal.exchange(signal) == 0 && signal == SIGINT) {
    constexpr char kMessage[] =
        "\ninterrupt: checkpointing after this step (interrupt again to exit at once)\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGTERM, SIGUSR1}) ::sigaction(signal, &action, nullptr);
  // The two a launcher ignores on purpose: `nohup` ignores SIGHUP so that a closed terminal does
  // not stop the run, and a shell ignores SIGINT in what it starts in the background, so that
  // Ctrl-C stops only what runs in the foreground.
  for (const int signal : {SIGINT, SIGHUP}) {
    struct sigaction current {};
    ::sigaction(signal, nullptr, &current);
    if (current.sa_handler != SIG_IGN) ::sigaction(signal, &action, nullptr);
  }
}

int stop_requested() { return requested_signal.load(); }

}  // namespace mltrain

#include "trainer/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace mltrain {
namespace {

std::atomic<int> requested_signal{0};

extern "C" void on_stop_signal(int signal) {
  if (signal == SIGINT && requested_signal.load() == SIGINT) {
    constexpr char kMessage[] = "\nsecond interrupt: exiting without a checkpoint\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    ::_exit(130);
  }
  if (requested_signal.exchange(signal) == 0) {
    constexpr char kMessage[] =
        "\nstop requested: checkpointing after this step (interrupt again to exit at once)\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1}) ::sigaction(signal, &action, nullptr);
}

int stop_requested() { return requested_signal.load(); }

}  // namespace mltrain

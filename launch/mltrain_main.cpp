// mltrain: trains, resumes or evaluates a LLaMA-style model described by a YAML config.
#include "launch/mltrain_command.h"

int main(int argc, char** argv) { return mltrain::run_mltrain(argc, argv); }

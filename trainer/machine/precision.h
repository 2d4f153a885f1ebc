#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace mltrain {

// How this CPU multiplies bf16, which decides whether bf16 autocast pays on it:
// - amx: AMX-BF16 tile units; oneDNN's bf16 products run several times the fp32 rate, and a
//   training step about 1.7x faster than in fp32 (a Xeon with AMX).
// - avx512_bf16: AVX512-BF16 dot products without AMX; oneDNN's bf16 products ran at 0.6x MKL's
//   fp32 rate and a training step at 0.6x fp32 on a Xeon whose hypervisor hides AMX
//   (bench/RESULTS.md).
// - emulated: neither; bf16 is converted in software, tens of times slower than fp32.
enum class CpuBf16 { emulated, avx512_bf16, amx };

// How this CPU multiplies bf16, from the CPUID features ATen's cpuinfo reads. AMX also needs the
// kernel's permission to use its tile state (Linux 5.16 and later grant it on request): where it is
// refused, oneDNN runs AVX512-BF16 code, and so this says avx512_bf16.
CpuBf16 cpu_bf16_support();

// What train.precision resolves to on a device, and why, in words for the log.
struct PrecisionChoice {
  bool bf16;
  bool slower_than_fp32;  // bf16 asked for on a CPU where it runs slower: worth a warning
  std::string reason;
};

// train.precision auto takes bf16 autocast where it is faster than fp32 (CUDA, and CPUs with
// AMX-BF16) and fp32 elsewhere; bf16 and fp32 are taken as asked, bf16 on a CPU without AMX-BF16
// with a reason that says it runs slower. A pure function of its arguments, so that every case is
// testable on any machine.
PrecisionChoice choose_precision(const std::string& precision, c10::Device device,
                                 CpuBf16 cpu_bf16);

// choose_precision for this machine's CPU.
PrecisionChoice precision_on_this_machine(const std::string& precision, c10::Device device);

// The choice, for the run's header: a warning when bf16 was asked for on a CPU where it runs
// slower than fp32, an info line otherwise.
void log_precision(const PrecisionChoice& choice);

// precision_on_this_machine, logged; whether to run under bf16 autocast.
bool use_bf16_autocast(const std::string& precision, c10::Device device);

}  // namespace mltrain

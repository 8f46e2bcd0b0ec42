// Which CPU path runs: detection, the POSENC_CPU_ISA cap, and the row-kernel tables (isa.h).
#include "cpu/isa.h"

#include "host/stable.h"
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace posenc::cpu {
namespace {

constexpr const char* kNames[] = {"portable", "avx2", "avx512", "avx512bf16"};

// What tells this CPU apart where the tuning below differs by CPU (none of it changes bits).
struct CpuKind {
  bool x86 = false, amd = false, avx512 = false;
  int family = 0;  // cpuid's family with its extended part: AMD Zen 2/3/4 are 23/25/25, Zen 5 is 26
  bool amd_zen2_3() const { return amd && !avx512; }
  bool amd_zen4() const { return amd && avx512 && family < 26; }
  bool amd_zen5_on() const { return amd && family >= 26; }
};

// Rows per call that stay in AMD Zen 5's 32 MiB L3 from call to call: below it, software prefetch
// measured slower and 512-bit float32 rows faster; above it, the reverse (benchmarks/RESULTS.md).
constexpr int64_t kZen5CachedRowBytes = int64_t{32} << 20;

// Which of `accepted` the environment variable `name` holds: its index, or -1 when it is unset or
// empty. Any other value fails, naming the variable, the value and what it accepts.
int env_choice(const char* name, std::initializer_list<const char*> accepted) {
  const char* value = std::getenv(name);
  if (!value || !*value) return -1;
  int i = 0;
  std::string expected;
  for (const char* a : accepted) {
    if (std::strcmp(value, a) == 0) return i;
    expected += (i == 0 ? "" : i + 1 == static_cast<int>(accepted.size()) ? " or " : ", ") + std::string(a);
    ++i;
  }
  posenc::fail("posenc: environment variable ", name, "=", value, " is not accepted: expected ", expected);
}

const CpuKind& cpu_kind() {
  static const CpuKind kind = [] {
    CpuKind k;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    k.x86 = true;
    k.amd = __builtin_cpu_is("amd");
    k.avx512 = __builtin_cpu_supports("avx512f");
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
      const int base = static_cast<int>((eax >> 8) & 0xf);
      k.family = base + (base == 0xf ? static_cast<int>((eax >> 20) & 0xff) : 0);
    }
#endif
    return k;
  }();
  return kind;
}

// The best path this CPU and this build support.
Isa detected() {
  Isa best = Isa::Portable;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && row_kernels_avx2(false, false);
  // F16C has no __builtin_cpu_supports name in GCC 12; every AVX2 CPU shipped so far has it, and
  // AVX-512F implies it. A hypothetical AVX2 CPU without it: set POSENC_CPU_ISA=portable.
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      row_kernels_avx512(false, false, false);
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16") && row_kernels_avx512bf16(false, false, false);
  best = bf16 ? Isa::Avx512Bf16 : avx512 ? Isa::Avx512 : avx2 ? Isa::Avx2 : Isa::Portable;
#endif
  return best;
}

// The cap from the environment (Avx512Bf16, the highest, when unset).
Isa cap() {
  const char* portable = std::getenv("POSENC_CPU_PORTABLE");
  if (portable && std::strcmp(portable, "1") == 0) return Isa::Portable;
  const int want = env_choice("POSENC_CPU_ISA", {kNames[0], kNames[1], kNames[2], kNames[3]});
  return want < 0 ? Isa::Avx512Bf16 : static_cast<Isa>(want);
}

}  // namespace

Isa cpu_isa() {
  static const Isa chosen = [] {
    const Isa c = cap(), d = detected();
    return static_cast<int>(c) < static_cast<int>(d) ? c : d;
  }();
  return chosen;
}

const char* isa_name(Isa isa) { return kNames[static_cast<int>(isa)]; }

// Read once per process (isa.h).
const Prefetch& cpu_prefetch() {
  static const Prefetch chosen = []() -> Prefetch {
    constexpr int64_t kL1 = 32 * 1024;
    const CpuKind& cpu = cpu_kind();
    // 8 KiB ahead on AMD CPUs: float32 rows streamed from DRAM on Zen 3 measured ~5% faster than with
    // 2 KiB (4-12 KiB alike, 24 KiB worse); on Zen 5 RoPE rows were as fast at 2-8 KiB, and
    // add_sinusoidal's x rows 1.1-1.3x faster at 4-8 KiB than at 2 KiB. 2 KiB elsewhere, where Intel
    // measured it (benchmarks/RESULTS.md).
    const int64_t distance = cpu.amd ? 8192 : 2048;
    const int want = env_choice("POSENC_CPU_PREFETCH", {"0", "1"});
    if (want >= 0) return {want == 1, kL1, distance};
    // Off on AMD Zen 4, where it measured slower (fp32 in place 1.06 -> 1.21-1.39x the floor). Other
    // AMD CPUs prefetch only rows too big to stay in their L3 from call to call (a decode batch): Zen 3
    // from 16 MiB (float32 rows from DRAM gained; rows of 1.3-10 MiB measured 10-30% slower with it),
    // Zen 5 from 32 MiB (in place from DRAM on two threads at most 1.03-1.16x the floor with it,
    // up to 1.27-1.72x without; one thread's rows of 1.25-30 MiB 5-15% slower with it). Intel CPUs
    // prefetch from 32 KiB: a decode batch of two or more sequences gained there (benchmarks/RESULTS.md).
    const int64_t from_bytes = cpu.amd_zen2_3() ? int64_t{16} << 20 : cpu.amd_zen5_on() ? kZen5CachedRowBytes : kL1;
    return {cpu.x86 && !cpu.amd_zen4(), from_bytes, distance};
  }();
  return chosen;
}

// Read once per process (isa.h). 512-bit rows on AMD Zen 5 and later, which execute 512-bit
// operations at full width: in place there, fp16 rows in 512-bit vectors measured 0.85-0.92x the floor
// against 1.1-1.28x in 256-bit ones, from cache and from DRAM alike; float32 rows 10-50% faster from
// cache (two threads, 5 MiB of rows: half-split 43 vs 49-56 us, interleaved 42 vs 62-68 us) but
// slower from DRAM, so only in calls under 32 MiB of rows (benchmarks/RESULTS.md). Zen 4 executes them
// as two halves, and measured 256-bit rows faster; other CPUs are not measured.
const VectorWidth& cpu_vector_width() {
  static const VectorWidth chosen = []() -> VectorWidth {
    constexpr int64_t kAlways = std::numeric_limits<int64_t>::max();
    switch (env_choice("POSENC_CPU_VECTOR_BITS", {"256", "512"})) {
      case 0: return {false, 0};
      case 1: return {true, kAlways};
      default: return cpu_kind().amd_zen5_on() ? VectorWidth{true, kZen5CachedRowBytes} : VectorWidth{false, 0};
    }
  }();
  return chosen;
}

// Read once per process (isa.h). 32 MiB: on AMD Zen 3 (32 MiB of L3, two threads) float32 tables of
// 8192 x 1024 (32 MiB) and 32768 x 1024 measured 13-20% faster streamed, one of 2048 x 1024 (8 MiB)
// 0-10% slower; out-of-place float32 RoPE over [1,4096,32,128] + [..,8,..] (80 MiB) ~1.5x faster
// (benchmarks/RESULTS.md, "Thirteenth session").
const Streaming& cpu_streaming() {
  static const Streaming chosen = []() -> Streaming {
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    switch (env_choice("POSENC_CPU_STREAM", {"0", "1"})) {
      case 0: return {kNever, false};
      case 1: return {0, true};
      default: break;
    }
#if defined(__x86_64__) || defined(_M_X64)
    return {int64_t{32} << 20, false};
#else
    return {kNever, false};  // the non-temporal stores are x86's (sinusoidal_cpu.cpp)
#endif
  }();
  return chosen;
}

bool Streaming::pages_present(const void* out, int64_t bytes) {
#if defined(__linux__)
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const int64_t at : {bytes / 2, bytes - 1}) {
    const uintptr_t addr = (reinterpret_cast<uintptr_t>(out) + static_cast<uintptr_t>(at)) & ~(page - 1);
    unsigned char present = 0;
    if (mincore(reinterpret_cast<void*>(addr), page, &present) != 0 || !(present & 1)) return false;
  }
#else
  (void)out, (void)bytes;
#endif
  return true;
}

const RowKernels* row_kernels(Isa isa, bool prefetch, bool stream, bool wide) {
  switch (isa) {
    case Isa::Avx2: return row_kernels_avx2(prefetch, stream);
    case Isa::Avx512: return row_kernels_avx512(prefetch, stream, wide);
    case Isa::Avx512Bf16: return row_kernels_avx512bf16(prefetch, stream, wide);
    default: return nullptr;
  }
}

}  // namespace posenc::cpu

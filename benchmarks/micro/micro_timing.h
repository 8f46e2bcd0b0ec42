// Timing shared by the C++ microbenchmarks in this folder: thread CPU time, and functions timed in
// alternation (one call of each per round, so load from other processes drifts into all of them alike).
#pragma once
#include <algorithm>
#include <ctime>
#include <functional>
#include <vector>

inline double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Each function's time (ms) at `quantile` of its `rounds` calls (0: the minimum).
inline std::vector<double> alternated_ms(const std::vector<std::function<void()>>& fns, int rounds, double quantile) {
  std::vector<std::vector<double>> times(fns.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const double t0 = cpu_ms();
      fns[i]();
      times[i].push_back(cpu_ms() - t0);
    }
  }
  std::vector<double> at;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    at.push_back(t[static_cast<size_t>(quantile * static_cast<double>(t.size()))]);
  }
  return at;
}

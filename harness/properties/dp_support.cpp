// The data-parallel properties' shared pieces (see dp_support.hpp).
#include "harness/properties/dp_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/dist/dp_step.hpp"
#include "harness/properties/sweep_support.hpp"

namespace hr::props {

std::vector<double> gather_doubles(dist::Communicator& comm, Device& dev, const std::vector<double>& mine) {
  std::vector<float> send(mine.size() * 2), recv;
  std::memcpy(send.data(), mine.data(), mine.size() * sizeof(double));
  dist::all_gather_host(comm, dev, send, recv);
  std::vector<double> out(mine.size() * static_cast<size_t>(comm.size()));
  std::memcpy(out.data(), recv.data(), out.size() * sizeof(double));
  return out;
}

double max_over_ranks(dist::Communicator& comm, Device& dev, double v) {
  double m = 0;
  for (double x : gather_doubles(comm, dev, {v})) {
    if (std::isnan(x)) return NAN;
    m = std::max(m, x);
  }
  return m;
}

size_t count_bitwise_mismatches(const NamedValues& a, const NamedValues& b) {
  size_t n = 0;
  for (size_t t = 0; t < a.size() && t < b.size(); ++t)
    for (size_t i = 0; i < a[t].second.size() && i < b[t].second.size(); ++i)
      if (std::memcmp(&a[t].second[i], &b[t].second[i], sizeof(float)) != 0) ++n;
  return n;
}

MemorySnapshot held_since(const MemorySnapshot& before, const MemorySnapshot& after) {
  MemorySnapshot d;
  for (int i = 0; i < kNumConsumers; ++i) {
    d.current_bytes[i] = after.current_bytes[i] - std::min(after.current_bytes[i], before.current_bytes[i]);
    d.peak_bytes[i] = after.peak_bytes[i] - std::min(after.peak_bytes[i], before.current_bytes[i]);
  }
  d.total_current_bytes = after.total_current_bytes - std::min(after.total_current_bytes, before.total_current_bytes);
  d.total_peak_bytes = after.total_peak_bytes - std::min(after.total_peak_bytes, before.total_current_bytes);
  return d;
}

void mem_points(Device& dev, dist::Communicator& comm, const char* model, DType dtype, nlohmann::json config,
                const MemorySnapshot& mine, DpOutput& out) {
  std::vector<double> v;
  for (int i = 0; i < kNumConsumers; ++i) v.push_back(static_cast<double>(mine.current_bytes[i]));
  for (int i = 0; i < kNumConsumers; ++i) v.push_back(static_cast<double>(mine.peak_bytes[i]));
  v.push_back(static_cast<double>(mine.total_peak_bytes));
  const std::vector<double> all = gather_doubles(comm, dev, v);
  for (int r = 0; r < comm.size(); ++r) {
    nlohmann::json c = config;
    c["ranks"] = comm.size();
    c["rank"] = r;
    c["engine"] = comm.engine();
    SweepPoint p = sweep_point("DP-MEM", dev, dtype, model, c);
    const double* x = all.data() + static_cast<size_t>(r) * v.size();
    for (int i = 0; i < kNumConsumers; ++i) {
      p.memory.current_bytes[i] = static_cast<size_t>(x[i]);
      p.memory.peak_bytes[i] = static_cast<size_t>(x[kNumConsumers + i]);
      p.memory.total_current_bytes += p.memory.current_bytes[i];
    }
    p.memory.total_peak_bytes = static_cast<size_t>(x[2 * kNumConsumers]);
    out.points.push_back(std::move(p));
  }
}

}  // namespace hr::props

// Pieces the data-parallel properties share (data_parallel.cpp: DP-1..DP-4;
// sharding.cpp: the sharded step's DP-3, DP-5, DP-6 and the sharded DP-MEM and
// DP-COMM): values gathered over the ranks, and the per-rank memory points.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "harness/device.hpp"
#include "harness/dtype.hpp"
#include "harness/dist/communicator.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/properties/data_parallel.hpp"

namespace hr::props {

// Every rank's values, gathered in rank order (all-gather is a copy, so doubles
// travel bit for bit as pairs of fp32 words, through any engine). Collective.
std::vector<double> gather_doubles(dist::Communicator& comm, Device& dev, const std::vector<double>& mine);

// The largest value over ranks; NaN when any rank has one. Collective.
double max_over_ranks(dist::Communicator& comm, Device& dev, double v);

// Elements of a that differ bitwise from b's, tensor by tensor in order.
size_t count_bitwise_mismatches(const NamedValues& a, const NamedValues& b);

// Per-consumer bytes a variant added on this rank: held after its steps (current)
// and its high-water mark, both above what was held before it was built.
MemorySnapshot held_since(const MemorySnapshot& before, const MemorySnapshot& after);

// One DP-MEM point per rank (on every rank: gathered), with `config` plus ranks,
// rank and engine. Collective.
void mem_points(Device& dev, dist::Communicator& comm, const char* model, DType dtype, nlohmann::json config,
                const MemorySnapshot& mine, DpOutput& out);

// DP-5, DP-6, ZeRO-1 as a step setting (DP-3) and their DP-MEM and DP-COMM rows
// (sharding.cpp). Collective.
void dp_sharding(Device& dev, dist::Communicator& comm, Preset preset, uint64_t seed, DpOutput& out);

}  // namespace hr::props

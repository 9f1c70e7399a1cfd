// Data-parallel dumps, one rank's part (see dp_dump.hpp).
#include "harness/dist/dp_dump.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "harness/check.hpp"
#include "harness/dist/dp_step.hpp"
#include "harness/step/train_step.hpp"

namespace hr::dist {

std::vector<std::pair<int64_t, int64_t>> zero1_shards(int64_t total, int64_t ranks) {
  HR_CHECK(ranks > 0, "zero1_shards: {} ranks", ranks);
  const int64_t shard = (total + ranks - 1) / ranks;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t r = 0; r < ranks; ++r) out.emplace_back(std::min(total, r * shard), std::min(total, (r + 1) * shard));
  return out;
}

int64_t dump_rank(Device& dev, Communicator& comm, const StepConfig& cfg, const DumpOptions& opt,
                  const std::string& dir) {
  validate(cfg);
  DumpOptions o = opt;
  o.ranks = comm.size();
  validate(o, cfg);
  DpOptions record;
  record.record_sent = true;
  DataParallelStep dp(dev, comm, cfg, DpSync::once_per_window, DpFault::none, record);
  TrainStep& local = dp.local();
  Zero1AdamW zero(dev, comm, local.params(), cfg.optimizer.adamw);
  const std::filesystem::path root = std::filesystem::path(dir) / fmt::format("rank_{}", comm.rank());
  const int64_t rows = dp.rows_per_rank(), r = comm.rank();
  int64_t files = 0;
  const auto put = [&](const std::filesystem::path& p, const std::vector<SafetensorsEntry>& e) {
    write_dump_file(p.string(), e);
    ++files;
  };
  for (int64_t s = 1; s <= std::max<int64_t>(o.steps, 1); ++s) {
    const DumpBatch db = make_dump_batch(dev, cfg, o, o.data_seed + static_cast<uint64_t>(s - 1));
    dp.reduce_gradients(db.batch);
    const std::filesystem::path at = root / fmt::format("step_{}", s);
    std::error_code ec;
    std::filesystem::create_directories(at, ec);
    HR_CHECK(!ec, "dump: cannot create '{}': {}", at.string(), ec.message());
    put(at / "batch.safetensors", batch_entries(db.batch.slice(r * rows, (r + 1) * rows)));
    put(at / "gradients_local.safetensors", flat_entries(local, dp.sent()));
    std::vector<SafetensorsEntry> grads;
    for (const auto& [name, g] : local.gradients()) grads.push_back(safetensors_entry(name, g));
    put(at / "gradients.safetensors", grads);
    zero.step(local.params(), s);
    put(at / "weights.safetensors", weight_entries(local, false));
    put(at / "optimizer_state.safetensors",
        {safetensors_entry("exp_avg", zero.exp_avg()), safetensors_entry("exp_avg_sq", zero.exp_avg_sq())});
  }
  return files;
}

}  // namespace hr::dist

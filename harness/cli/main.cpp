// The headroom command line: argument parsing only; each subcommand is a function
// in harness/cli/commands.hpp (so the tests drive the same code).
//   headroom run       run every property and sweep, write results.json + index.html
//   headroom validate  judge a run (new or from a file) against a trusted baseline
//   headroom compare   the same comparison between two results files
//   headroom report    the HTML report of a results file
//   headroom dump      training steps as safetensors files, for checking a framework
//   headroom info      the device record
//   headroom list      every property and sweep, what it needs and how long it takes
//   headroom plan      the cheapest techniques that fit a step on each card
//   headroom fleet     every device of a node or cluster checked side by side
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "harness/build_info.hpp"
#include "harness/check.hpp"
#include "harness/ctest_gpus.hpp"
#include "harness/device.hpp"
#include "harness/dist/launch.hpp"
#include "harness/dump/dump.hpp"
#include "harness/cli/commands.hpp"
#include "harness/plan/plan.hpp"
#include "harness/process_limits.hpp"

namespace {

// Strict values: CLI11 alone reads "-1" into a uint64 as 2^64 - 1 and "nan" into
// a double. Each check returns the reason, which CLI11 prints after the option.
const CLI::Validator kSeed(
    [](std::string& s) -> std::string {
      if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos)
        return fmt::format("'{}' is not a seed: a whole number from 0 to 18446744073709551615", s.substr(0, 40));
      errno = 0;
      (void)std::strtoull(s.c_str(), nullptr, 10);
      if (errno == ERANGE) return fmt::format("'{}' is beyond 2^64 - 1 = 18446744073709551615", s);
      return {};
    },
    "SEED");

const CLI::Validator kPositiveInt(
    [](std::string& s) -> std::string {
      if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos ||
          std::strtoll(s.c_str(), nullptr, 10) <= 0)
        return fmt::format("'{}' is not a positive whole number", s.substr(0, 40));
      return {};
    },
    "N > 0");

// A finite number in [lo, hi) (hi_inclusive: [lo, hi]); lo_exclusive: (lo, ...).
CLI::Validator finite_in(double lo, bool lo_exclusive, double hi, const char* range) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(s.c_str(), &end);
        const bool ok = !s.empty() && end == s.c_str() + s.size() && errno == 0 && std::isfinite(v) &&
                        (lo_exclusive ? v > lo : v >= lo) && v < hi;
        return ok ? std::string() : fmt::format("'{}' is not a finite number in {}", s.substr(0, 40), range);
      },
      range);
}

// The options of a run. validate's take the baseline's preset, backend, seed and
// selection where they are not given (`from_baseline`), which its help says in place
// of run's defaults.
void add_run_options(CLI::App* cmd, hr::RunCommand& r, bool from_baseline = false) {
  auto help = [from_baseline](const char* text) {
    return from_baseline ? std::string(text) + " (default: the baseline's)" : std::string(text);
  };
  auto* preset = cmd->add_option("--preset", r.preset, help("quick (minutes on a CPU) | full"))
                     ->check(CLI::IsMember({"quick", "full"}));
  auto* backend = cmd->add_option("--backend", r.backend, help("auto | cpu | cuda (auto: cuda when a GPU answers)"))
                      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--only", r.only, help("regular expression over property/sweep id and title (e.g. 'GA-|CK-3')"));
  cmd->add_option("--skip", r.skip,
                  help("the same, for what is left out even when --only selects it (e.g. '^TRADE$')"));
  cmd->add_option("--out", r.out_dir, "directory for results.json and index.html")->capture_default_str();
  auto* seed = cmd->add_option("--seed", r.seed, help("seed of every random draw (0 to 2^64 - 1)"))->check(kSeed);
  if (!from_baseline)
    for (CLI::Option* o : {preset, backend, seed}) o->capture_default_str();
  cmd->add_option("--junit", r.junit, "also write JUnit XML here: one test case per check and sweep point");
}

const std::string kTimeFloorHelp =
    fmt::format("minimum effect: a step-time change within this fraction is the same (default {:g}, and {:g} for the "
                "CPU backend's CPU-time samples; given, it sets both)",
                hr::CompareOptions{}.time_floor, hr::CompareOptions{}.cpu_time_floor);

// "headroom 0.1.0 (git 8dd3b2979051, Release, GNU 12.2.0, CUDA nvcc 13.0.88, architectures 90)".
std::string version_line() {
  std::string cuda = hr::build::kCudaCompiler;
  cuda = cuda.empty() ? "no CUDA" : fmt::format("CUDA {}, architectures {}", cuda, hr::build::kCudaArchs);
  return fmt::format("headroom {} (git {}, {}, {}, {})", hr::build::kVersion, hr::build::git_sha(), hr::build::kBuildType,
                     hr::build::kCxxCompiler, cuda);
}

}  // namespace

int main(int argc, char** argv) {
  hr::bind_ctest_gpus();  // under ctest --resource-spec-file: the GPUs CTest gave this test
  hr::rerun_with_one_blas_thread_under_a_memory_limit(argv);
  CLI::App app{"headroom: benchmark and conformance suite for memory-saving training techniques"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_line(), "print the version, the git commit and the build, and exit");
  app.footer("Start with: headroom run --out results   (then open results/index.html)\n"
             "            headroom list                  (what runs, what it needs, how long)\n"
             "Each command's --help shows examples. Exit codes: 0 passed / fit, 1 failed / not fit, 2 bad input.");
  bool debug = false;
  app.add_flag("--debug", debug,
               "error messages carry the failed internal check and its source location (also HEADROOM_DEBUG=1)");

  std::string info_backend = "auto";
  auto* info = app.add_subcommand("info", "print the device record as JSON");
  info->add_option("--backend", info_backend, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  info->footer("Example:\n  headroom info --backend cuda    # the GPU's name, memory, clocks, driver, or why none answers");

  hr::ListCommand list;
  auto* list_cmd = app.add_subcommand("list", "list every property and sweep: ID, kind, expected time, whether it runs "
                                              "here, title");
  list_cmd->add_option("--preset", list.preset, "quick | full")
      ->check(CLI::IsMember({"quick", "full"}))
      ->capture_default_str();
  list_cmd->add_option("--backend", list.backend, "auto | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  list_cmd->add_flag("--json", list.json, "one JSON array instead of the table");
  list_cmd->footer("Examples:\n"
                   "  headroom list                      # the IDs --only and --skip select from\n"
                   "  headroom list --backend cuda --json");

  hr::RunCommand run;
  auto* run_cmd = app.add_subcommand("run", "run every property and sweep of a preset; write results.json and index.html");
  add_run_options(run_cmd, run);
  // The data-parallel entries (DP-1..DP-6, DP-MEM, BM-DP) launch mpirun -np N for N in {2, 4}.
  run_cmd->add_option_function<int>("--ranks", [&run](const int& n) { run.dp_ranks = {n}; },
                                    "data-parallel entries: launch N ranks only (default: 2 and 4)")
      ->check(CLI::IsMember({2, 4, 8, 16}));
  auto* resume = run_cmd->add_option("--resume", run.resume_dir,
                                     "finish the run in DIR with its preset, backend, seed, selection and --ranks "
                                     "(only what did not run runs); --only/--skip given with it become its selection, "
                                     "to add entries it left out");
  for (const char* other : {"--preset", "--backend", "--out", "--seed", "--ranks"})
    resume->excludes(run_cmd->get_option(other));
  run_cmd->footer("Examples:\n"
                  "  headroom run --out results                     # the quick preset; open results/index.html\n"
                  "  headroom run --only '^GA-' --out ga            # gradient accumulation's properties only\n"
                  "  headroom run --skip '^(TRADE|BM-FIT)$'         # without the trade table (~50 s on 2 cores)\n"
                  "  headroom run --preset full --backend cuda --junit junit.xml\n"
                  "  headroom run --resume results                  # finish a run that was interrupted\n"
                  "  headroom run --resume results --skip ''        # and add what its --skip left out");

  hr::ValidateCommand val;
  auto* val_cmd = app.add_subcommand(
      "validate", "judge a run against a trusted baseline: exit 0 fit, 1 not fit, 2 bad input");
  val_cmd->add_option("--baseline", val.baseline, "results.json of a trusted device")->required();
  auto* val_results = val_cmd->add_option("--results", val.results, "judge this results.json instead of running now");
  val_cmd->add_option("--html", val.html, "with --results: write the report with the verdict here");
  val_cmd->add_flag("--any-device", val.any_device,
                    "judge a run on another kind of device than the baseline's (refused otherwise)");
  val_cmd->add_option_function<int>("--ranks", [&val](const int& n) { val.run.dp_ranks = {n}; },
                                    "data-parallel entries: launch N ranks only (default: the baseline's)")
      ->check(CLI::IsMember({2, 4, 8, 16}));
  val_cmd
      ->add_option_function<double>(
          "--time-floor", [&val](const double& f) { val.compare.time_floor = val.compare.cpu_time_floor = f; },
          kTimeFloorHelp)
      ->check(finite_in(0, false, 1, "[0, 1)"));
  val_cmd->add_option("--time-alpha", val.compare.time_alpha,
                      "significance level of the rank test over both runs' step-time samples")
      ->check(finite_in(0, true, 1, "(0, 1)"))
      ->capture_default_str();
  add_run_options(val_cmd, val.run, /*from_baseline=*/true);

  std::string cmp_a, cmp_b, cmp_html;
  val_cmd->footer("Examples:\n"
                  "  headroom run --out trusted                                    # once, on the trusted card\n"
                  "  headroom validate --baseline trusted/results.json --out new  # on the new card: runs, judges\n"
                  "  headroom validate --baseline trusted/results.json --results new/results.json --html v.html");
  auto* cmp_cmd = app.add_subcommand("compare", "compare B against A (the baseline): table on stdout, optional HTML");
  cmp_cmd->add_option("A", cmp_a, "baseline results.json")->required();
  cmp_cmd->add_option("B", cmp_b, "results.json to judge")->required();
  cmp_cmd->add_option("--html", cmp_html, "write the report of B with the comparison here");
  hr::CompareOptions cmp_opt;
  cmp_cmd
      ->add_option_function<double>(
          "--time-floor", [&cmp_opt](const double& f) { cmp_opt.time_floor = cmp_opt.cpu_time_floor = f; },
          kTimeFloorHelp)
      ->check(finite_in(0, false, 1, "[0, 1)"));
  cmp_cmd->add_option("--time-alpha", cmp_opt.time_alpha,
                      "significance level of the rank test over both runs' step-time samples")
      ->check(finite_in(0, true, 1, "(0, 1)"))
      ->capture_default_str();

  hr::DumpCommand dump;
  auto* dump_cmd = app.add_subcommand(
      "dump", "write one training step of a controlled model (weights, batch, loss, gradients, masks) as safetensors");
  dump_cmd->add_option("--model", dump.model, "mlp | transformer")
      ->check(CLI::IsMember({"mlp", "transformer"}))
      ->capture_default_str();
  dump_cmd->add_option("--preset", dump.preset, "model sizes: quick | full")
      ->check(CLI::IsMember({"quick", "full"}))
      ->capture_default_str();
  dump_cmd->add_option("--config", dump.config_file, "JSON object of step configuration fields over the preset's");
  dump_cmd->add_option("--dtype", dump.dtype, "compute dtype: fp32 | fp16 | bf16")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  dump_cmd->add_option("--batch", dump.batch, "rows per step (default: the preset's)")->check(kPositiveInt);
  dump_cmd->add_option("--micro-batch", dump.micro_batch, "rows per forward + backward (default: the preset's)")
      ->check(kPositiveInt);
  dump_cmd->add_option("--backend", dump.backend, "cpu | cuda | auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  dump_cmd->add_option("--out", dump.out_dir, "output directory")->capture_default_str();
  dump_cmd->add_option("--data-seed", dump.data_seed, "seed of the batch drawn (step s: this + s - 1)")
      ->check(kSeed)
      ->capture_default_str();
  dump_cmd->add_option("--steps", dump.steps, "optimizer steps to run and write, each into step_<s>/ (0: one forward "
                                              "+ backward, no step)")
      ->check(CLI::Range(int64_t{0}, hr::kMaxDumpSteps))
      ->capture_default_str();
  dump_cmd->add_option("--overflow-steps", dump.overflow_steps,
                       "steps (1-based, comma-separated) whose losses are multiplied by 2^64, so their fp16 "
                       "gradients overflow and the loss scaler skips them")
      ->delimiter(',');
  dump_cmd->add_option("--layout", dump.layout, "transformer batch rows: padded (one sequence per row) | packed")
      ->check(CLI::IsMember({"padded", "packed"}))
      ->capture_default_str();
  dump_cmd->add_option("--lengths", dump.lengths,
                       "transformer sequence lengths, comma-separated (padded: one per row; packed: packed into the "
                       "rows); default: drawn from the length distribution")
      ->delimiter(',');
  dump_cmd->add_option("--lora-b-std", dump.lora_b_std,
                       "draw LoRA's B from normal(0, this) instead of zero, so A's gradient is not zero (needs "
                       "adapters.kind lora in --config)")
      ->check(finite_in(0, true, 1000, "(0, 1000]"));
  dump_cmd->add_option("--ranks", dump.ranks,
                       "data parallel over this many ranks under mpirun (ZeRO-1 AdamW, fp32): rank_<r>/ per rank")
      ->check(CLI::Range(int64_t{1}, hr::kMaxDumpRanks));

  cmp_cmd->footer("Example:\n  headroom compare a/results.json b/results.json --html compare.html   # B judged against A");
  dump_cmd->footer("Examples:\n"
                   "  headroom dump --model mlp --micro-batch 16 --out dump       # one pass; see the README's numpy "
                   "rebuild\n"
                   "  headroom dump --dtype fp16 --steps 3 --overflow-steps 2     # the loss scaler skips step 2\n"
                   "  headroom dump --layout packed --lengths 100,60,28,5 --out packed\n"
                   "  headroom dump --model mlp --ranks 2 --steps 2 --micro-batch 16  # data parallel, ZeRO-1");

  std::string rep_results, rep_baseline, rep_html, rep_peer;
  auto* rep_cmd = app.add_subcommand("report", "write the HTML report of a results.json");
  rep_cmd->add_option("RESULTS", rep_results, "results.json")->required();
  rep_cmd->add_option("--baseline", rep_baseline, "compare against this results.json in the report");
  rep_cmd->add_option("--html", rep_html, "output HTML file")->required();
  rep_cmd->add_option("--peer", rep_peer,
                      "ci/peer/torch_step.py's record of a BM-MB point of RESULTS: the PyTorch section");
  rep_cmd->footer(
      "Example:\n  headroom report results/results.json --baseline trusted/results.json --html report.html\n"
      "  headroom report results/results.json --peer results-peer.json --html report.html");

  // ---- headroom plan (harness/plan/plan.hpp) ----
  hr::plan::PlanCommand plan;
  auto* plan_cmd = app.add_subcommand(
      "plan", "for each card, the cheapest combination of techniques that fits a step configuration, and its cost");
  plan_cmd->add_option("--config", plan.config_file, "step configuration JSON (fields over the preset's)")->required();
  plan_cmd->add_option("--cards", plan.cards_file, "cards JSON (memory_gib, price_per_hour, tokens_per_s or results)")
      ->required();
  plan_cmd->add_option("--preset", plan.preset, "sizes the configuration's fields are laid over: quick | full")
      ->check(CLI::IsMember({"quick", "full"}))
      ->capture_default_str();
  plan_cmd->add_option("--json", plan.json_out, "also write the plan as JSON to this file");
  plan_cmd->add_option("--measured", plan.measured,
                       "a results.json whose TRADE rows give each technique's step-time factor (default: the field "
                       "guide's figures)");
  plan_cmd->add_option("--headroom", plan.headroom_fraction, "fraction of each card's memory left free")
      ->check(finite_in(0, false, 1, "[0, 1)"))
      ->capture_default_str();
  plan_cmd->footer("Example:\n"
                   "  headroom plan --preset full --config harness/plan/samples/step-1p3b.json \\\n"
                   "                --cards harness/plan/samples/sample-cards.json\n"
                   "  (the sample cards' prices are placeholders: put your own in a copy)");

  // ---- headroom fleet (harness/fleet/fleet.hpp) ----
  hr::fleet::FleetOptions fleet;
  auto* fleet_cmd = app.add_subcommand(
      "fleet", "check every device of a node or cluster at once: the same fixed-seed steps bit for bit on each (silent "
               "data corruption), throughput against the fleet's median, conformance; a row per device");
  fleet_cmd->add_option("--ranks", fleet.ranks, "devices: one process each under mpirun (one GPU each, by local rank)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  fleet_cmd->add_option("--level", fleet.level,
                        "1: op conformance, the step digest, throughput (~1 min a GPU); 2: and the quick preset; 3: "
                        "the full preset and the fleet's all-reduce")
      ->check(CLI::Range(1, 3))
      ->capture_default_str();
  fleet_cmd->add_option("--backend", fleet.backend, "cuda | cpu (CPU ranks stand in for devices) | auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  fleet_cmd->add_option("--seed", fleet.seed, "seed of the steps every device runs")->check(kSeed)->capture_default_str();
  fleet_cmd->add_option("--out", fleet.out, "folder for fleet.json, fleet.html and each rank's record (shared by "
                                            "every node)")
      ->capture_default_str();
  fleet_cmd->add_option("--baseline", fleet.baseline, "an earlier fleet.json: throughput is also judged against it");
  fleet_cmd->add_option("--junit", fleet.junit, "also write JUnit XML here: a case per device and check");
  fleet_cmd->add_flag("--judge", fleet.judge_only,
                      "launch nothing: judge the records that ranks started elsewhere (srun ... headroom fleet-rank "
                      "--dir OUT) left in --out; --ranks says how many there should be");
  fleet_cmd->add_option("--budget", fleet.budget_s,
                        "seconds each device is given before it counts as hung (default: the level's: 1: 5 min on "
                        "CPU ranks, 2 min on a GPU; 2: 20 / 10 min; 3: 4 h / 30 min)")
      ->check(finite_in(0, true, 1e7, "(0, 1e7]"));
  fleet_cmd->footer("Examples:\n"
                    "  headroom fleet --ranks 8 --backend cuda --out fleet     # the 8 GPUs of this node, level 1\n"
                    "  headroom fleet --ranks 4 --backend cpu --level 1        # 4 CPU ranks standing in for devices\n"
                    "  HEADROOM_MPIRUN_ARGS='--hostfile hosts' headroom fleet --ranks 64 --level 2 --out /shared/fleet\n"
                    "Exit status: 0 every device ok, 1 a device slow, wrong or failed, 2 the fleet could not start.");
  hr::fleet::RankOptions rank;
  bool rank_child = false;
  auto* rank_cmd = app.add_subcommand(
      "fleet-rank", "one rank of `headroom fleet`: what mpirun starts, or srun on nodes of their own (then judge them "
                    "with `headroom fleet --judge`)");
  rank_cmd->add_option("--dir", rank.dir, "the fleet's folder, shared by every rank")->required();
  rank_cmd->add_option("--level", rank.level, "as `headroom fleet --level`")->check(CLI::Range(1, 3));
  rank_cmd->add_option("--seed", rank.seed, "as `headroom fleet --seed`")->check(kSeed);
  rank_cmd->add_option("--backend", rank.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  rank_cmd->add_option("--budget", rank.budget_s, "seconds this device is given before it counts as hung")
      ->check(finite_in(0, true, 1e7, "(0, 1e7]"));
  rank_cmd->add_flag("--child", rank_child, "the work itself, under the rank's supervisor")
      ->group("");  // the rank starts it

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help is success; anything else is bad input (exit 2, not CLI11's own codes).
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (debug) hr::set_debug_messages(true);

  if (run_cmd->parsed()) {
    run.only_given = run_cmd->get_option("--only")->count() > 0;
    run.skip_given = run_cmd->get_option("--skip")->count() > 0;
    return hr::command_run(run, std::cout, std::cerr);
  }
  if (val_cmd->parsed()) {
    // What was not given is the baseline's (preset, backend, seed, selection, ranks).
    val.given = {val_cmd->get_option("--preset")->count() > 0, val_cmd->get_option("--backend")->count() > 0,
                 val_cmd->get_option("--seed")->count() > 0,   val_cmd->get_option("--only")->count() > 0,
                 val_cmd->get_option("--skip")->count() > 0,   val_cmd->get_option("--ranks")->count() > 0};
    if (val_results->count() == 0 && !val.html.empty()) {
      fmt::print(stderr, "headroom: --html goes with --results; a run writes its report into --out\n");
      return 2;
    }
    return hr::command_validate(val, std::cout, std::cerr);
  }
  if (cmp_cmd->parsed()) return hr::command_compare(cmp_a, cmp_b, cmp_html, std::cout, std::cerr, cmp_opt);
  if (rep_cmd->parsed()) return hr::command_report(rep_results, rep_baseline, rep_html, std::cout, std::cerr, rep_peer);
  if (dump_cmd->parsed()) return hr::command_dump(dump, std::cout, std::cerr);
  if (list_cmd->parsed()) return hr::command_list(list, std::cout, std::cerr);
  if (plan_cmd->parsed()) return hr::plan::command_plan(plan, std::cout, std::cerr);

  if (fleet_cmd->parsed()) return hr::command_fleet(fleet, std::cout, std::cerr);
  if (rank_cmd->parsed()) return hr::command_fleet_rank(rank, rank_child, std::cerr);
  if (info->parsed()) return hr::command_info(info_backend, std::cout, std::cerr);
  return 2;
}

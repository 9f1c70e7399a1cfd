// libFuzzer target over headroom's JSON readers: the step configuration
// (`--config`, `dump`) and results / baseline files (`validate`, `compare`,
// `report`, `run --resume`). Any input must either be read or be refused with
// hr::Error (a message for the user): another exception type, a crash or a
// sanitizer report is a finding. What is read must round-trip: written, read
// again and written again, it gives the same text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/check.hpp"
#include "harness/results/results.hpp"
#include "harness/step/step_config.hpp"

namespace {

[[noreturn]] void finding(const char* reader, const std::string& what) {
  std::fprintf(stderr, "fuzz_json_readers: %s: %s\n", reader, what.c_str());
  std::abort();
}

// Runs read(j); returns false when it refused the input with hr::Error.
template <typename Read>
bool reads(const char* reader, Read&& read) {
  try {
    read();
    return true;
  } catch (const hr::Error&) {
    return false;
  } catch (const std::exception& e) {
    finding(reader, std::string("an exception other than hr::Error: ") + e.what());
  } catch (...) {
    finding(reader, "a non-standard exception");
  }
}

// The test's negative control (HEADROOM_FUZZ_PLANTED_FAULT=1): a writer that names
// bf16 "bfloat16" once, so that writing what it read back gives other text. The
// control's corpus (fuzz/planted/) holds a bf16 configuration, the main corpus
// none: the finding must stop the run and fail it.
bool planted_fault() {
  static const bool on = [] {
    const char* v = std::getenv("HEADROOM_FUZZ_PLANTED_FAULT");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

void step_config_round_trip(const nlohmann::json& j) {
  hr::StepConfig first;
  if (!reads("step config", [&] { first = hr::step_config_from_json(j); })) return;
  nlohmann::json written;
  hr::to_json(written, first);
  if (planted_fault() && first.precision.compute == hr::DType::bf16) written["precision"]["compute"] = "bfloat16";
  hr::StepConfig second;
  if (!reads("step config (its own output)", [&] { second = hr::step_config_from_json(written); }))
    finding("step config", "its own output is refused: " + written.dump());
  nlohmann::json rewritten;
  hr::to_json(rewritten, second);
  if (written.dump() != rewritten.dump())
    finding("step config", "write, read, write differs:\n" + written.dump() + "\n" + rewritten.dump());
}

void results_round_trip(const nlohmann::json& j) {
  hr::Results first;
  if (!reads("results", [&] { first = hr::results_from_json(j); })) return;
  const nlohmann::json written = hr::results_to_json(first);
  hr::Results second;
  if (!reads("results (its own output)", [&] { second = hr::results_from_json(written); }))
    finding("results", "its own output is refused: " + written.dump().substr(0, 2000));
  const std::string a = written.dump(), b = hr::results_to_json(second).dump();
  if (a != b) finding("results", "write, read, write differs:\n" + a.substr(0, 2000) + "\n" + b.substr(0, 2000));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The CLI's own parser first: strict JSON (no trailing text, no key twice),
  // nested at most kMaxJsonDepth deep; what it refuses goes no further.
  nlohmann::json j;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!reads("parser", [&] { j = hr::parse_json_strict(text, "fuzz input"); })) return 0;
  step_config_round_trip(j);
  results_round_trip(j);
  return 0;
}

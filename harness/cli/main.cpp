// The headroom command line.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "harness/check.hpp"
#include "harness/device.hpp"

int main(int argc, char** argv) {
  CLI::App app{"headroom: benchmark and conformance suite for memory-saving training techniques"};
  app.require_subcommand(1);

  std::string backend = "auto";
  auto* info = app.add_subcommand("info", "print the device record as JSON");
  info->add_option("--backend", backend, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  CLI11_PARSE(app, argc, argv);
  try {
    if (info->parsed()) {
      auto dev = hr::make_device(backend);
      nlohmann::json j = dev->record();
      std::string why;
      if (!hr::cuda_device_available(&why)) j["cuda_unavailable_reason"] = why;
      std::cout << j.dump(2) << "\n";
    }
  } catch (const hr::InvalidArgument& e) {
    fmt::print(stderr, "headroom: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "headroom: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

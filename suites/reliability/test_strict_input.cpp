// Strict reading of what a user hands headroom: step configurations (every key
// known, every value of its type and range), JSON files (no trailing text, no key
// twice, bounded depth) and results files (verdicts recomputed, not trusted).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <typeinfo>

#include "harness/check.hpp"
#include "harness/registry.hpp"
#include "harness/results/results.hpp"
#include "harness/step/step_config.hpp"

namespace {

using hr::InvalidArgument;
using nlohmann::json;

// The message of the InvalidArgument that f throws ("" when it does not throw).
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

hr::StepConfig over_preset(const json& j) {
  return hr::step_config_from_json(j, hr::step_config_for(hr::ModelKind::transformer, hr::Preset::quick));
}

TEST(StrictConfig, EveryWrittenConfigurationReadsBack) {
  for (auto model : {hr::ModelKind::mlp, hr::ModelKind::transformer})
    for (auto preset : {hr::Preset::quick, hr::Preset::full}) {
      const json j = hr::step_config_for(model, preset);
      EXPECT_EQ(json(hr::step_config_from_json(j)), j) << j.dump();
    }
}

TEST(StrictConfig, UnknownKeysAreNamedWithTheirPath) {
  EXPECT_EQ(refusal([] { over_preset({{"transformer", {{"d_modle", 64}}}}); }).rfind("transformer.d_modle: unknown", 0),
            0u);
  EXPECT_EQ(refusal([] { over_preset({{"precision", {{"scaler", {{"growht", 2.0}}}}}}); })
                .rfind("precision.scaler.growht: unknown", 0),
            0u);
  const std::string top = refusal([] { over_preset({{"batchsize", 8}}); });
  EXPECT_EQ(top.rfind("batchsize: unknown field", 0), 0u) << top;
  EXPECT_NE(top.find("micro_batch"), std::string::npos) << "the known keys are listed: " << top;
}

TEST(StrictConfig, SectionsMustBeObjects) {
  for (const json& v : {json(5), json(nullptr), json::array(), json("x")})
    EXPECT_EQ(refusal([&] { over_preset({{"transformer", v}}); }).rfind("transformer: must be an object", 0), 0u)
        << v.dump();
  EXPECT_EQ(refusal([] { over_preset({{"optimizer", {{"adamw", nullptr}}}}); }).rfind("optimizer.adamw: must be", 0),
            0u);
}

TEST(StrictConfig, ValuesMustHaveTheirTypeAndRange) {
  EXPECT_EQ(refusal([] { over_preset({{"transformer", {{"d_model", 64.7}}}}); }),
            "transformer.d_model: must be an integer, got 64.7");
  EXPECT_EQ(refusal([] { over_preset({{"transformer", {{"d_model", 1e308}}}}); }).rfind("transformer.d_model:", 0), 0u);
  EXPECT_EQ(refusal([] { over_preset({{"batch", 18446744073709551615ull}}); }).rfind("batch: 18446744073709551615 is out", 0),
            0u);
  EXPECT_EQ(refusal([] { over_preset({{"init_seed", -1}}); }).rfind("init_seed: must not be negative", 0), 0u);
  EXPECT_EQ(refusal([] { over_preset({{"batch", "8"}}); }).rfind("batch: must be an integer", 0), 0u);
  EXPECT_EQ(refusal([] { over_preset({{"transformer", {{"dropout", 1e300}}}}); }).rfind("transformer.dropout:", 0), 0u);
  EXPECT_EQ(refusal([] { over_preset({{"checkpoint", {{"fresh_rng_on_recompute", 1}}}}); })
                .rfind("checkpoint.fresh_rng_on_recompute: must be true or false", 0),
            0u);
  // Within range, integral values of every kind are taken as they are.
  const hr::StepConfig c = over_preset({{"init_seed", 18446744073709551615ull}, {"transformer", {{"d_model", 96}}}});
  EXPECT_EQ(c.init_seed, 18446744073709551615ull);
  EXPECT_EQ(c.transformer.d_model, 96);
}

TEST(StrictConfig, DerivedAndOtherModelFieldsMustAgree) {
  EXPECT_EQ(refusal([] { over_preset({{"accum_steps", 3}}); }).rfind("accum_steps: 3 contradicts", 0), 0u);
  const hr::StepConfig p = hr::step_config_for(hr::ModelKind::transformer, hr::Preset::quick);
  EXPECT_EQ(over_preset({{"accum_steps", p.batch / p.micro_batch}}).batch, p.batch);
  EXPECT_EQ(refusal([] { over_preset({{"mlp", {{"width", 8}}}}); }).rfind("mlp: a section for the mlp", 0), 0u);
}

TEST(StrictJson, TrailingTextDuplicateKeysAndDepthAreRefused) {
  EXPECT_EQ(hr::parse_json_strict(R"({"a": {"b": [1, 2]}})", "t")["a"]["b"][1], 2);
  EXPECT_NE(refusal([] { hr::parse_json_strict(R"({"a": 1} x)", "t"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal([] { hr::parse_json_strict(R"({"a": 1, "a": 2})", "t"); }).find("\"a\" appears twice"),
            std::string::npos);
  // The same key in two objects is no duplicate.
  EXPECT_NO_THROW(hr::parse_json_strict(R"({"a": {"k": 1}, "b": {"k": 2}})", "t"));
  const auto nested = [](size_t depth) {
    return std::string(depth, '[') + std::string(depth, ']');
  };
  EXPECT_NO_THROW(hr::parse_json_strict(nested(hr::kMaxJsonDepth), "t"));
  EXPECT_NE(refusal([&] { hr::parse_json_strict(nested(hr::kMaxJsonDepth + 1), "t"); }).find("nested more than"),
            std::string::npos);
  EXPECT_NE(refusal([&] { hr::parse_json_strict(nested(70000), "t"); }).find("nested more than"), std::string::npos);
  // Brackets inside strings are text, not nesting.
  EXPECT_NO_THROW(hr::parse_json_strict("\"" + std::string(1000, '[') + "\"", "t"));
}

TEST(StrictJson, FilesThatAreNotFilesAreNamed) {
  const auto dir = std::filesystem::temp_directory_path() / "headroom_strict_json_dir.json";
  std::filesystem::create_directories(dir);
  EXPECT_NE(refusal([&] { hr::load_results(dir.string()); }).find("is a directory"), std::string::npos);
  EXPECT_NE(refusal([] { hr::load_results("/nonexistent/results.json"); }).find("no such file"), std::string::npos);
  std::filesystem::remove(dir);
}

// A measurement as results.json holds it, with the stored verdict given.
json stored(double error, double tolerance, bool passed, const char* control = nullptr) {
  json m{{"id", "X-1"},
         {"error", hr::json_number(error)},
         {"tolerance", tolerance},
         {"negative_control", control != nullptr},
         {"passed", passed}};
  if (control != nullptr) m["control"] = control;
  return m;
}

TEST(StoredVerdicts, AreRecomputedFromErrorAndTolerance) {
  // Consistent verdicts read back as written.
  EXPECT_TRUE(hr::measurement_from_json(stored(0.1, 0.1, true)).passed);
  EXPECT_FALSE(hr::measurement_from_json(stored(0.1000001, 0.1, false)).passed);
  EXPECT_TRUE(hr::measurement_from_json(stored(0.5, 0.1, true, "gross")).passed);
  EXPECT_TRUE(hr::measurement_from_json(stored(9.9, 0.1, true, "subtle")).passed);
  // A pass the numbers do not support, near the bound and far from it, is refused.
  for (double error : {0.1000001, 0.5, std::nan(""), HUGE_VAL})
    EXPECT_NE(refusal([&] { hr::measurement_from_json(stored(error, 0.1, true)); }).find("inconsistent"),
              std::string::npos)
        << error;
  EXPECT_NE(refusal([] { hr::measurement_from_json(stored(0.05, 0.1, false)); }).find("inconsistent"),
            std::string::npos);
  // Controls: caught only above the bound; a subtle one only within 100x of it.
  EXPECT_NE(refusal([] { hr::measurement_from_json(stored(0.1, 0.1, true, "gross")); }).find("inconsistent"),
            std::string::npos);
  EXPECT_NE(refusal([] { hr::measurement_from_json(stored(10.01, 0.1, true, "subtle")); }).find("inconsistent"),
            std::string::npos);
  EXPECT_NE(refusal([] { hr::measurement_from_json(stored(std::nan(""), 0.1, true, "gross")); }).find("inconsistent"),
            std::string::npos);
}

TEST(StoredVerdicts, AgreeWithTheRegistryForEveryKindOfMeasurement) {
  for (double error : {0.0, 0.05, 0.1, 0.1000001, 5.0, 10.0, 10.01, std::nan(""), HUGE_VAL}) {
    for (const hr::Measurement& m : {hr::make_check("X-1", "t", error, 0.1),
                                     hr::make_negative_control("X-1", "t", error, 0.1),
                                     hr::make_subtle_control("X-1", "t", error, 0.1)}) {
      EXPECT_EQ(hr::recomputed_verdict(m), m.passed) << error << " " << m.control;
      EXPECT_NO_THROW(hr::measurement_from_json(json(m)));
    }
  }
}

// What headroom writes, the strict reader reads back to the same text: parse,
// write, parse, write is a fixed point (the fixtures and a run's own records).
TEST(StrictJson, ResultsRoundTripThroughTheStrictReader) {
  const std::filesystem::path fixtures = HEADROOM_TESTDATA_DIR;
  for (const char* name : {"results.json", "baseline_ok.json", "baseline_faster.json"}) {
    const hr::Results r = hr::load_results((fixtures / name).string());
    const std::string once = hr::results_to_json(r).dump(2);
    const std::string twice = hr::results_to_json(hr::results_from_json(hr::parse_json_strict(once, name))).dump(2);
    EXPECT_EQ(once, twice) << name;
    EXPECT_FALSE(r.measurements.empty()) << name;
  }
  hr::Results cut = hr::load_results((fixtures / "results.json").string());
  cut.incomplete = true;
  cut.not_run = {"GA-2", "BM-MB"};
  const hr::Results back = hr::results_from_json(hr::parse_json_strict(hr::results_to_json(cut).dump(), "t"));
  EXPECT_TRUE(back.incomplete);
  EXPECT_EQ(back.not_run, cut.not_run);
}

// Bounded mutation fuzzing of the readers (results files, step configurations):
// bytes flipped, dropped, duplicated and cut from valid documents. Every mutant
// is either read, and then written and read back to the same text, or refused
// with InvalidArgument; no other exception, no crash. A fixed seed: the same
// mutants on every run.
TEST(Fuzz, MutatedDocumentsAreReadAndRoundTripOrRefused) {
  const std::filesystem::path fixtures = HEADROOM_TESTDATA_DIR;
  std::ifstream in(fixtures / "baseline_faster.json", std::ios::binary);
  const std::string results_text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string config_text = json(hr::step_config_for(hr::ModelKind::transformer, hr::Preset::quick)).dump(1);
  ASSERT_GT(results_text.size(), 1000u);
  const std::string alphabet = "{}[]\",:0123456789.eE-+ntfalsrue \\";
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  int read = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    const bool config = i % 2 == 1;
    std::string t = config ? config_text : results_text;
    for (int k = 0, n = 1 + static_cast<int>(next() % 4); k < n; ++k) {
      const size_t at = next() % t.size();
      switch (next() % 4) {
        case 0: t[at] = alphabet[next() % alphabet.size()]; break;
        case 1: t.erase(at, 1 + next() % 8); break;
        case 2: t.insert(at, t.substr(at, 1 + next() % 16)); break;
        default: t.resize(std::max<size_t>(1, at)); break;
      }
      if (t.empty()) t = "{";
    }
    try {
      const json j = hr::parse_json_strict(t, "mutant");
      if (config) {
        const hr::StepConfig c = hr::step_config_from_json(j);
        const json once = c;
        EXPECT_EQ(json(hr::step_config_from_json(once)), once) << t;
      } else {
        const std::string once = hr::results_to_json(hr::results_from_json(j, "mutant")).dump(2);
        const std::string twice =
            hr::results_to_json(hr::results_from_json(hr::parse_json_strict(once, "again"), "again")).dump(2);
        EXPECT_EQ(once, twice);
      }
      ++read;
    } catch (const InvalidArgument&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutant " << i << " threw a " << typeid(e).name() << ": " << e.what();
    }
  }
  std::cout << "fuzz: 3000 mutants, " << read << " read and round-tripped, " << refused << " refused\n";
  EXPECT_GT(read, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace

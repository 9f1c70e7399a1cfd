// The fleet's pieces without a launch (harness/fleet/): SHA-256 against the
// standard's test vector, the digest's determinism and where two digests first
// differ, and the judgement of rank records: the majority, a tie, a missing rank,
// a slow one against the others and against a baseline. The launched fleet with
// its fault switches is suites/fleet/ (label fleet).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/fleet/digest.hpp"
#include "harness/fleet/fleet.hpp"
#include "harness/fleet/fleet_internal.hpp"
#include "suites/common/test_support.hpp"

namespace {

using nlohmann::json;

TEST(FleetDigest, Sha256OfTheStandardsVectors) {
  // FIPS 180-2, appendix B.1 and the empty message.
  EXPECT_EQ(hr::fleet::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hr::fleet::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(FleetDigest, TheSameStepsGiveTheSameDigestAndAnotherSeedAnother) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const hr::fleet::Digest a = hr::fleet::compute_digest(dev, 7), b = hr::fleet::compute_digest(dev, 7);
  EXPECT_EQ(a.sha256, b.sha256);
  EXPECT_FALSE(hr::fleet::first_difference(a, b).has_value());
  ASSERT_EQ(a.configs.size(), hr::fleet::digest_configs().size());
  // Every step hashes the loss, each gradient and each master weight.
  EXPECT_EQ(a.configs[0].steps.size(), 3u);
  EXPECT_EQ(a.configs[0].steps[0].tensors.front().name, "loss");
  const hr::fleet::Digest c = hr::fleet::compute_digest(dev, 8);
  EXPECT_NE(a.sha256, c.sha256);
  const auto d = hr::fleet::first_difference(a, c);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->config, a.configs[0].name);
  EXPECT_EQ(d->step, 1);
  EXPECT_EQ(d->tensor, "loss");
  // Through JSON and back, the same digest.
  const hr::fleet::Digest e = json(a).get<hr::fleet::Digest>();
  EXPECT_FALSE(hr::fleet::first_difference(a, e).has_value());
}

TEST(FleetDigest, OneFlippedTensorIsNamedWithItsStep) {
  HR_TEST_DEVICE(dev, hr::BackendKind::cpu);
  const hr::fleet::Digest a = hr::fleet::compute_digest(dev, 7);
  hr::fleet::Digest b = a;
  hr::fleet::TensorDigest& t = b.configs[1].steps[2].tensors[5];
  t.sha256[0] = t.sha256[0] == '0' ? '1' : '0';
  b.sha256 = "another";
  const auto d = hr::fleet::first_difference(a, b);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->config, a.configs[1].name);
  EXPECT_EQ(d->step, 3);
  EXPECT_EQ(d->tensor, t.name);
}

// A rank record as a rank writes it: a device, a digest, throughputs, conformance.
json record(int rank, const std::string& sha, double step_tokens_per_s) {
  json digest{{"sha256", sha}, {"seconds", 0.1}, {"configs", json::array({{{"name", "c"}, {"steps", json::array({json::array({json::array({"loss", sha})})})}}})}};
  auto metric = [](double v) { return json{{"status", "ok"}, {"value", v}}; };
  return {{"rank", rank},
          {"status", "ok"},
          {"backend", "cpu"},
          {"host", "h"},
          {"device", {{"name", "cpu-x"}, {"sm_count", 0}, {"driver_version", 0}}},
          {"build", {{"git_sha", "abc"}}},
          {"digest", digest},
          {"self_difference", nullptr},
          {"throughput", {{"step", metric(step_tokens_per_s)}, {"gemm", metric(1.0)}, {"copy", metric(10.0)}}},
          {"conformance", {{"measurements", 5}, {"passed", 5}, {"failed", json::array()}}}};
}

const json& device(const json& fleet, int rank) {
  for (const json& d : fleet["devices"])
    if (d["rank"] == rank) return d;
  throw std::runtime_error("no such rank");
}

// A throughput is the median of its rounds, each round's own fastest repetition:
// one fast spell of a shared host (the 44 here, as a CPU rank once read beside
// rounds of 29-31) moves one round, not the value judged. The fastest round's point
// is kept under its own key; a round that fails to measure is the result from then on.
TEST(FleetThroughput, AThroughputIsTheMedianOfItsRounds) {
  auto round = [](double v, int id) { return json{{"status", "ok"}, {"value", v}, {"round", id}, {"best_s", 1 / v}}; };
  json t;
  const std::vector<double> values{30.0, 44.0, 29.0, 31.0, 30.5};
  for (size_t i = 0; i < values.size(); ++i) hr::fleet::fold_round(t, round(values[i], static_cast<int>(i)));
  EXPECT_EQ(t["status"], "ok");
  EXPECT_DOUBLE_EQ(t["value"].get<double>(), 30.5);
  EXPECT_EQ(t["fastest_round"], round(44.0, 1));  // the fastest round's point, whole
  EXPECT_FALSE(t.contains("best_s"));             // no timing of one round beside the median
  EXPECT_EQ(t["round_values"], json(values));
  hr::fleet::fold_round(t, round(29.5, 5));  // an even count: the middle two's mean
  EXPECT_DOUBLE_EQ(t["value"].get<double>(), 30.25);
  EXPECT_EQ(t["fastest_round"]["round"], 1);
  hr::fleet::fold_round(t, json{{"status", "out of memory"}, {"reason", "256 MiB more"}, {"value", 0.0}, {"round", 6}});
  hr::fleet::fold_round(t, round(50.0, 7));
  EXPECT_EQ(t["status"], "out of memory");
  EXPECT_EQ(t["reason"], "256 MiB more");
  EXPECT_DOUBLE_EQ(t["value"].get<double>(), 0.0);
  EXPECT_EQ(t["failed_round"]["round"], 6);
  EXPECT_FALSE(t.contains("fastest_round"));
  EXPECT_EQ(t["round_values"].size(), 8u);
  json first;  // a failure in the first round
  hr::fleet::fold_round(first, json{{"status", "error"}, {"reason", "no kernel"}, {"value", 0.0}});
  EXPECT_EQ(first["status"], "error");
  EXPECT_EQ(first["round_values"], json::array({0.0}));
}

TEST(FleetJudge, TheMajorityDigestWinsAndTheOddDeviceIsWrongAtItsFirstTensor) {
  const std::vector<json> ranks{record(0, "aa", 100), record(1, "aa", 101), record(2, "bb", 99), record(3, "aa", 100)};
  const json f = hr::fleet::judge_fleet(ranks, nullptr, hr::BackendKind::cpu);
  EXPECT_EQ(f["verdict"], "fail");
  EXPECT_EQ(device(f, 2)["verdict"], "wrong");
  EXPECT_EQ(device(f, 2)["checks"]["digest"]["first_difference"]["tensor"], "loss");
  EXPECT_EQ(f["devices"][0]["rank"], 2);  // flagged first
  for (int r : {0, 1, 3}) EXPECT_EQ(device(f, r)["verdict"], "ok") << r;
}

TEST(FleetJudge, AnEvenSplitHasNoMajorityAndFailsEveryone) {
  const std::vector<json> ranks{record(0, "aa", 100), record(1, "aa", 100), record(2, "bb", 100), record(3, "bb", 100)};
  const json f = hr::fleet::judge_fleet(ranks, nullptr, hr::BackendKind::cpu);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(device(f, r)["verdict"], "wrong") << r;
}

TEST(FleetJudge, AMissingRankIsFailedAndTheOthersAreStillJudged) {
  const std::vector<json> ranks{record(0, "aa", 100), nullptr, record(2, "aa", 100), record(3, "aa", 100)};
  const json f = hr::fleet::judge_fleet(ranks, nullptr, hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "failed");
  EXPECT_EQ(f["summary"]["ok"], 3);
}

TEST(FleetJudge, ASlowDeviceIsSlowNotWrongAndTheFloorHoldsTheSpread) {
  // 20% below the others' median: slow against a 15% floor; 10% below: not.
  json f = hr::fleet::judge_fleet({record(0, "aa", 100), record(1, "aa", 80), record(2, "aa", 101), record(3, "aa", 99)},
                                  nullptr, hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "slow");
  EXPECT_EQ(device(f, 1)["checks"]["digest"]["verdict"], "pass");
  f = hr::fleet::judge_fleet({record(0, "aa", 100), record(1, "aa", 90), record(2, "aa", 101), record(3, "aa", 99)},
                             nullptr, hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "ok");
  // On GPUs the floor is 5%: 10% below is slow there.
  f = hr::fleet::judge_fleet({record(0, "aa", 100), record(1, "aa", 90), record(2, "aa", 101), record(3, "aa", 99)},
                             nullptr, hr::BackendKind::cuda);
  EXPECT_EQ(device(f, 1)["verdict"], "slow");
  // A wide spread among the others raises the bound: 20% below others spread +-20% is not slow.
  f = hr::fleet::judge_fleet({record(0, "aa", 80), record(1, "aa", 80), record(2, "aa", 120), record(3, "aa", 100)},
                             nullptr, hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "ok");
}

TEST(FleetJudge, WithTwoDevicesOnlyTheBaselineJudgesThroughput) {
  json f = hr::fleet::judge_fleet({record(0, "aa", 100), record(1, "aa", 50)}, nullptr, hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "ok");
  const json base = hr::fleet::judge_fleet({record(0, "aa", 100), record(1, "aa", 100), record(2, "aa", 100)}, nullptr,
                                           hr::BackendKind::cpu);
  f = hr::fleet::judge_fleet({record(0, "aa", 100), record(1, "aa", 50)}, base, hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "slow");
  EXPECT_EQ(device(f, 0)["verdict"], "ok");
}

TEST(FleetJudge, ADeviceThatMeasuredNothingIsNotOk) {
  json r = record(1, "aa", 100);
  r["conformance"]["measurements"] = 0;
  const json f = hr::fleet::judge_fleet({record(0, "aa", 100), r, record(2, "aa", 100)}, nullptr, hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "wrong");
}

TEST(FleetJudge, ARecordCutShortIsAFailedDeviceNotACrash) {
  json no_digest = record(1, "aa", 100);
  no_digest.erase("digest");
  json bad_metric = record(2, "aa", 100);
  bad_metric["throughput"]["gemm"]["value"] = "fast";
  const json f = hr::fleet::judge_fleet({record(0, "aa", 100), no_digest, bad_metric, record(3, "aa", 100)}, nullptr,
                                        hr::BackendKind::cpu);
  EXPECT_EQ(device(f, 1)["verdict"], "failed");
  EXPECT_EQ(device(f, 2)["verdict"], "failed");
  EXPECT_NE(device(f, 1)["reasons"][0].get<std::string>().find("digest"), std::string::npos);
  EXPECT_EQ(device(f, 0)["verdict"], "ok");
}

TEST(FleetJudge, JUnitHasACasePerDeviceAndCheck) {
  const json f = hr::fleet::judge_fleet({record(0, "aa", 100), nullptr, record(2, "bb", 100), record(3, "aa", 100)},
                                        nullptr, hr::BackendKind::cpu);
  const std::string x = hr::fleet::fleet_junit(f);
  EXPECT_NE(x.find("tests=\"16\""), std::string::npos) << x;   // 3 devices x 5 + 1 failed
  EXPECT_NE(x.find("failures=\"2\""), std::string::npos) << x;  // rank 1 did not run; rank 2 its digest
}

}  // namespace

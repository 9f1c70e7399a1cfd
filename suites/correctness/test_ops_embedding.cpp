// Token + position embedding conformance: forward and backward against the
// float64 reference (OPS-1), backward against finite differences (OPS-2), DET-1,
// += accumulation of the weight gradients, and out-of-range ids rejected.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "kernels/embedding/embedding.hpp"
#include "kernels/embedding/embedding_ref.hpp"
#include "suites/common/finite_diff.hpp"
#include "suites/common/op_check.hpp"
#include "suites/common/test_support.hpp"
#include "harness/tolerances.hpp"

namespace {

using hr::Consumer;
using hr::DType;
using hr::Tensor;
using hr::test::Guarded;
using hr::test::stored_values;
using vecd = std::vector<double>;
using veci = std::vector<int32_t>;

class EmbeddingOp : public testing::TestWithParam<hr::test::BackendDType> {};

// B x T tokens with repeated ids (V small against B * T) and packed positions
// that restart at random sequence boundaries.
struct Case {
  int64_t B, T, V, P, C;
  veci ids, pos;
  std::vector<float> wte, wpe, dout;
  Case(int64_t b, int64_t t, int64_t v, int64_t c, uint64_t seed) : B(b), T(t), V(v), P(t), C(c) {
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < B * T; ++i) ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(V)));
    for (int64_t r = 0; r < B; ++r) {
      int32_t p = 0;
      for (int64_t i = 0; i < T; ++i) {
        if (rng() % 5 == 0) p = 0;  // a new packed sequence starts
        pos.push_back(p++);
      }
    }
    wte = hr::test::random_nonzero(static_cast<size_t>(V * C), seed + 1);
    wpe = hr::test::random_nonzero(static_cast<size_t>(P * C), seed + 2);
    dout = hr::test::random_nonzero(static_cast<size_t>(B * T * C), seed + 3);
  }
};

TEST_P(EmbeddingOp, ForwardAndBackwardMatchFloat64Reference) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  for (int64_t C : {1, 15, 16, 17, 127, 128, 129, 4097}) {
    const Case k(3, 11, 7, C, 40 + C);
    const std::string what = "C=" + std::to_string(C);
    Tensor ids = Tensor::from_host_i32(dev, k.ids, {k.B, k.T}, Consumer::workspace);
    Tensor pos = Tensor::from_host_i32(dev, k.pos, {k.B, k.T}, Consumer::workspace);
    Tensor wte = Tensor::from_host(dev, k.wte, {k.V, C}, dt, Consumer::weights);
    Tensor wpe = Tensor::from_host(dev, k.wpe, {k.P, C}, dt, Consumer::weights);
    Guarded out(dev, {k.B, k.T, C}, dt);
    hr::ops::embedding_forward(ids, pos, wte, wpe, out.tensor());
    vecd rout;
    hr::ref::embedding_forward(k.ids, k.pos, stored_values(k.wte, dt), stored_values(k.wpe, dt), C, rout);
    EXPECT_TRUE(hr::test::nmse_within(out.values(), rout, hr::tol::kRowwiseNmse(dt), "embedding out " + what));

    Tensor dout = Tensor::from_host(dev, k.dout, {k.B, k.T, C}, dt, Consumer::activations);
    Guarded dwte(dev, {k.V, C}, DType::f32), dwpe(dev, {k.P, C}, DType::f32);
    dwte.set(std::vector<float>(static_cast<size_t>(k.V * C), 0.f));
    dwpe.set(std::vector<float>(static_cast<size_t>(k.P * C), 0.f));
    hr::ops::embedding_backward(ids, pos, dout, dwte.tensor(), dwpe.tensor());
    vecd rdwte, rdwpe;
    hr::ref::embedding_backward(k.ids, k.pos, stored_values(k.dout, dt), k.V, k.P, C, rdwte, rdwpe);
    // fp32 sums of the stored dout: only fp32 addition separates them from the reference.
    const double b32 = hr::tol::kRowwiseNmse(DType::f32);
    EXPECT_TRUE(hr::test::nmse_within(dwte.values(), rdwte, b32, "embedding dwte " + what));
    EXPECT_TRUE(hr::test::nmse_within(dwpe.values(), rdwpe, b32, "embedding dwpe " + what));
    for (Guarded* g : {&out, &dwte, &dwpe}) EXPECT_TRUE(g->guards_intact()) << what;
  }
}

TEST_P(EmbeddingOp, BackwardMatchesFiniteDifferences) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const Case k(2, 6, 5, 3, 77);
  const vecd te = stored_values(k.wte, dt), pe = stored_values(k.wpe, dt), w = stored_values(k.dout, dt);
  auto loss = [&](const vecd& a, const vecd& b) {
    vecd out;
    hr::ref::embedding_forward(k.ids, k.pos, a, b, k.C, out);
    return hr::test::dot(w, out);
  };
  const vecd fte = hr::test::finite_diff_grad([&](const vecd& v) { return loss(v, pe); }, te);
  const vecd fpe = hr::test::finite_diff_grad([&](const vecd& v) { return loss(te, v); }, pe);
  Tensor ids = Tensor::from_host_i32(dev, k.ids, {k.B, k.T}, Consumer::workspace);
  Tensor pos = Tensor::from_host_i32(dev, k.pos, {k.B, k.T}, Consumer::workspace);
  Tensor dout = Tensor::from_host(dev, k.dout, {k.B, k.T, k.C}, dt, Consumer::activations);
  Tensor dwte = Tensor::zeros(dev, {k.V, k.C}, DType::f32, Consumer::gradients);
  Tensor dwpe = Tensor::zeros(dev, {k.P, k.C}, DType::f32, Consumer::gradients);
  hr::ops::embedding_backward(ids, pos, dout, dwte, dwpe);
  EXPECT_TRUE(hr::test::nmse_within(dwte.to_host_f32(), fte, hr::tol::kRowwiseGradNmse(dt), "embedding fd dwte"));
  EXPECT_TRUE(hr::test::nmse_within(dwpe.to_host_f32(), fpe, hr::tol::kRowwiseGradNmse(dt), "embedding fd dwpe"));
}

// A case's inputs on the device.
struct Uploaded {
  Tensor ids, pos, wte, wpe, dout;
  Uploaded(hr::Device& dev, const Case& k, DType dt)
      : ids(Tensor::from_host_i32(dev, k.ids, {k.B, k.T}, Consumer::workspace)),
        pos(Tensor::from_host_i32(dev, k.pos, {k.B, k.T}, Consumer::workspace)),
        wte(Tensor::from_host(dev, k.wte, {k.V, k.C}, dt, Consumer::weights)),
        wpe(Tensor::from_host(dev, k.wpe, {k.P, k.C}, dt, Consumer::weights)),
        dout(Tensor::from_host(dev, k.dout, {k.B, k.T, k.C}, dt, Consumer::activations)) {}
};

TEST_P(EmbeddingOp, RepeatsBitwiseAndAccumulatesGradients) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const Case k(4, 64, 50, 129, 9);
  const Uploaded u(dev, k, dt);
  const Tensor &ids = u.ids, &pos = u.pos, &wte = u.wte, &wpe = u.wpe, &dout = u.dout;
  Tensor out1 = Tensor::empty(dev, {k.B, k.T, k.C}, dt, Consumer::activations), out2 = out1.clone();
  hr::ops::embedding_forward(ids, pos, wte, wpe, out1);
  hr::ops::embedding_forward(ids, pos, wte, wpe, out2);
  EXPECT_EQ(out1.to_host_bytes(), out2.to_host_bytes());
  Tensor dwte = Tensor::zeros(dev, {k.V, k.C}, DType::f32, Consumer::gradients);
  Tensor dwpe = Tensor::zeros(dev, {k.P, k.C}, DType::f32, Consumer::gradients);
  hr::ops::embedding_backward(ids, pos, dout, dwte, dwpe);
  const std::vector<float> g1 = dwte.to_host_f32(), p1 = dwpe.to_host_f32();
  hr::ops::embedding_backward(ids, pos, dout, dwte, dwpe);  // += : exactly twice the first
  const std::vector<float> g2 = dwte.to_host_f32(), p2 = dwpe.to_host_f32();
  double norm = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    ASSERT_EQ(g2[i], 2.f * g1[i]) << "dwte[" << i << "]";
    norm += g1[i] * g1[i];
  }
  for (size_t i = 0; i < p1.size(); ++i) ASSERT_EQ(p2[i], 2.f * p1[i]) << "dwpe[" << i << "]";
  EXPECT_GT(norm, 0.0);
  // A fresh run from zero gives the first result bitwise (DET-1 for the backward).
  Tensor again = Tensor::zeros(dev, {k.V, k.C}, DType::f32, Consumer::gradients);
  Tensor again_p = Tensor::zeros(dev, {k.P, k.C}, DType::f32, Consumer::gradients);
  hr::ops::embedding_backward(ids, pos, dout, again, again_p);
  EXPECT_EQ(again.to_host_f32(), g1);
  EXPECT_EQ(again_p.to_host_f32(), p1);
}

// With host copies of ids and positions the op reads neither from the device and
// gives the same output and gradients bit for bit; the copies' values are what is
// range-checked, and a copy of the wrong size is refused.
TEST_P(EmbeddingOp, HostCopiesOfIdsGiveTheSameResult) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  const Case k(3, 20, 40, 33, 12);
  const Uploaded u(dev, k, dt);
  const Tensor &ids = u.ids, &pos = u.pos, &wte = u.wte, &wpe = u.wpe, &dout = u.dout;
  const hr::ops::EmbeddingHostIds host{&k.ids, &k.pos};
  Tensor out0 = Tensor::empty(dev, {k.B, k.T, k.C}, dt, Consumer::activations), out1 = out0.clone();
  hr::ops::embedding_forward(ids, pos, wte, wpe, out0);
  hr::ops::embedding_forward(ids, pos, wte, wpe, out1, host);
  EXPECT_EQ(out1.to_host_bytes(), out0.to_host_bytes());
  Tensor g0 = Tensor::zeros(dev, {k.V, k.C}, DType::f32, Consumer::gradients), g1 = g0.clone();
  Tensor p0 = Tensor::zeros(dev, {k.P, k.C}, DType::f32, Consumer::gradients), p1 = p0.clone();
  hr::ops::embedding_backward(ids, pos, dout, g0, p0);
  hr::ops::embedding_backward(ids, pos, dout, g1, p1, host);
  EXPECT_EQ(g1.to_host_bytes(), g0.to_host_bytes());
  EXPECT_EQ(p1.to_host_bytes(), p0.to_host_bytes());
  veci bad_ids = k.ids;
  bad_ids[7] = static_cast<int32_t>(k.V);
  EXPECT_THROW(hr::ops::embedding_forward(ids, pos, wte, wpe, out1, {&bad_ids, &k.pos}), hr::Error);
  const veci short_pos(k.pos.begin(), k.pos.end() - 1);
  EXPECT_THROW(hr::ops::embedding_backward(ids, pos, dout, g1, p1, {&k.ids, &short_pos}), hr::Error);
}

TEST_P(EmbeddingOp, RejectsOutOfRangeIdsAndPositions) {
  HR_TEST_DEVICE(dev, GetParam().backend);
  const DType dt = GetParam().dtype;
  Tensor wte = Tensor::zeros(dev, {5, 4}, dt, Consumer::weights);
  Tensor wpe = Tensor::zeros(dev, {3, 4}, dt, Consumer::weights);
  Tensor out = Tensor::empty(dev, {1, 2}, dt, Consumer::activations).reshape({1, 2, 1});
  Tensor out4 = Tensor::empty(dev, {1, 2, 4}, dt, Consumer::activations);
  Tensor ok_pos = Tensor::from_host_i32(dev, {0, 1}, {1, 2}, Consumer::workspace);
  for (veci bad : {veci{0, 5}, veci{-1, 0}}) {
    Tensor ids = Tensor::from_host_i32(dev, bad, {1, 2}, Consumer::workspace);
    EXPECT_THROW(hr::ops::embedding_forward(ids, ok_pos, wte, wpe, out4), hr::Error);
  }
  Tensor ok_ids = Tensor::from_host_i32(dev, {0, 4}, {1, 2}, Consumer::workspace);
  Tensor bad_pos = Tensor::from_host_i32(dev, {0, 3}, {1, 2}, Consumer::workspace);
  EXPECT_THROW(hr::ops::embedding_forward(ok_ids, bad_pos, wte, wpe, out4), hr::Error);
  EXPECT_THROW(hr::ops::embedding_forward(ok_ids, ok_pos, wte, wpe, out), hr::Error);  // wrong C
}

INSTANTIATE_TEST_SUITE_P(Ops, EmbeddingOp, testing::ValuesIn(hr::test::all_backend_dtypes()),
                         hr::test::param_name);

}  // namespace

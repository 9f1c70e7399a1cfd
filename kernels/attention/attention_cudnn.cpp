// cuDNN's fused attention beside the own kernels (attention_cuda.hpp says what it
// takes): the cuDNN frontend's SDPA graphs, forward (O and the row log-sum-exp,
// natural log, as the own kernels save it) and backward (dQ, dK, dV), built once
// per shape and cached. Both cuDNN and the CUDA runtime that the frontend calls are
// loaded at run time (the frontend's dynamic loading), so a build or a machine
// without cuDNN runs everything else and says why this form is unavailable.
#include "kernels/attention/attention_cuda.hpp"

#include <atomic>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "harness/check.hpp"

#if HEADROOM_HAVE_CUDA && HEADROOM_HAVE_CUDNN_FRONTEND
// Before the frontend's headers: every cuDNN and CUDA runtime call it makes goes
// through dlsym, and its JSON serialisation (unused) is left out.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "harness/cuda_check.cuh"
#include "harness/lru_cache.hpp"

// The handle the frontend's dlsym calls use (declared by cudnn_frontend_shim.h).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace hr::ops::cuda {

namespace {
// Whether backwards ask for cuDNN's deterministic algorithm (the runs do).
std::atomic<bool> deterministic_setting{true};
}  // namespace

bool cudnn_attention_deterministic() { return deterministic_setting.load(); }
void set_cudnn_attention_deterministic(bool on) { deterministic_setting.store(on); }

#if HEADROOM_HAVE_CUDA && HEADROOM_HAVE_CUDNN_FRONTEND
namespace {

namespace fe = cudnn_frontend;

// The loaded library, once per process.
struct Library {
  std::string error;  // why it is unavailable; empty once loaded
  size_t version = 0;  // cudnnGetVersion(): major * 10000 + minor * 100 + patch since 9.0
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    // The frontend would pick any libcudart.so.12 or .13 it finds; the one this
    // build links is the one whose streams and pointers it is handed.
    const std::string cudart = fmt::format("libcudart.so.{}", CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);  // a value already set stays
    // A deterministic backward on Hopper takes, from cuDNN 9.25, the engine that
    // orders its dQ sums, with a workspace linear in T, only where this limit is
    // below what the other way needs: a [B, H, T, T] dP buffer, which would make the
    // memory-efficient form's memory quadratic. Before 9.25 that buffer is the only
    // deterministic way (the workspace, which the memory accounting sees).
    setenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT", "0", 0);
    dlerror();
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      l.error = fmt::format("libcudnn.so.9 could not be loaded ({})", e ? e : "unknown reason");
      return l;
    }
    fe::cudnn_dlhandle = h;
    if (dlsym(h, "cudnnGetVersion") == nullptr || dlsym(h, "cudnnBackendCreateDescriptor") == nullptr) {
      l.error = "libcudnn.so.9 lacks cudnnGetVersion or the backend API";
      return l;
    }
    l.version = fe::detail::get_backend_version();
    // The frontend's fused attention needs 9.0 or newer within major version 9 (the
    // library name already says 9; an older 9.x would fail at its graph check).
    if (l.version < 90000 || l.version >= 100000)
      l.error = fmt::format("libcudnn.so.9 reports version {}, outside 9.x", l.version);
    return l;
  }();
  return lib;
}

std::string version_string(size_t v) { return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100); }

// The caches below are never destroyed: cuDNN's own state may be gone by the time a
// static's destructor would free a handle or a graph's plans at exit.

// One handle per device, made on first use there and kept for the process.
cudnnHandle_t handle_for(int device) {
  static std::mutex& mu = *new std::mutex;
  static std::map<int, cudnnHandle_t>& handles = *new std::map<int, cudnnHandle_t>;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  const ScopedCudaDevice on(device);
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = fe::detail::create_handle(&h);
  HR_CHECK(st == CUDNN_STATUS_SUCCESS, "cudnnCreate on device {}: {}", device, fe::detail::get_error_string(st));
  handles.emplace(device, h);
  return h;
}

// The variant pack's tensor ids.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqQ, kSeqKv };

// What a built graph depends on.
struct Key {
  int device;
  DType dt;
  int64_t B, H, T, D;
  bool causal, padding, backward;
  bool deterministic;   // backward: cuDNN's deterministic algorithm asked for (false for a forward)
  uint32_t scale_bits;  // the scale is a constant of the graph
  bool operator<(const Key& o) const {
    return std::tie(device, dt, B, H, T, D, causal, padding, backward, deterministic, scale_bits) <
           std::tie(o.device, o.dt, o.B, o.H, o.T, o.D, o.causal, o.padding, o.backward, o.deterministic,
                    o.scale_bits);
  }
};

Key make_key(int device, DType dt, std::array<int64_t, 4> bhtd, bool causal, bool padding, bool backward,
             bool deterministic, float scale) {
  Key k{device, dt, bhtd[0], bhtd[1], bhtd[2], bhtd[3], causal, padding, backward, backward && deterministic, 0};
  std::memcpy(&k.scale_bits, &scale, sizeof scale);
  return k;
}

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

void ok(fe::error_t e, const char* step, const Key& k) {
  HR_CHECK(e.is_good(), "cuDNN attention ({} {} [{}, {}, {}, {}]{}{}{}): {} failed: {}",
           k.backward ? "backward" : "forward", dtype_name(k.dt), k.B, k.H, k.T, k.D, k.causal ? " causal" : "",
           k.padding ? " padded" : "", k.deterministic ? " deterministic" : "", step, e.get_message());
}

// Builds the graph of one key: [B, H, T, D] contiguous inputs and outputs, the
// statistics fp32 [B, H, T, 1], fp32 arithmetic inside, the causal mask aligned top
// left (key s <= query t, as sm::allowed), the padding mask from per-batch key
// lengths with every query row live (seq_len_q = T), the backward's dQ sums in a
// fixed order where the key asks for it.
Built build(const Key& k, cudnnHandle_t handle, fe::AttentionImplementation_t impl) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(k.dt == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> dim{k.B, k.H, k.T, k.D}, stride{k.H * k.T * k.D, k.T * k.D, k.D, 1};
  const std::vector<int64_t> stats_dim{k.B, k.H, k.T, 1}, stats_stride{k.H * k.T, k.T, 1, 1};
  auto tensor = [&](const char* name, Uid uid) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
  };
  auto lengths = [&](const char* name, Uid uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({k.B, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  const float scale = [&] {
    float s;
    std::memcpy(&s, &k.scale_bits, sizeof s);
    return s;
  }();
  auto Q = tensor("Q", kQ), K = tensor("K", kK), V = tensor("V", kV);
  if (!k.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("headroom_sdpa")
                    .set_generate_stats(true)
                    .set_attn_scale(scale)
                    .set_implementation(impl);
    if (k.causal) opts.set_causal_mask(true);
    if (k.padding) opts.set_padding_mask(true).set_seq_len_q(lengths("seq_q", kSeqQ)).set_seq_len_kv(lengths("seq_kv", kSeqKv));
    auto [O, stats] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_dim(dim).set_stride(stride).set_uid(kO);
    stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim).set_stride(stats_stride).set_uid(kStats);
  } else {
    auto O = tensor("O", kO), dO = tensor("dO", kDO);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim(stats_dim)
                               .set_stride(stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("headroom_sdpa_backward")
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(k.deterministic);
    if (k.causal) opts.set_causal_mask(true);
    if (k.padding) opts.set_padding_mask(true).set_seq_len_q(lengths("seq_q", kSeqQ)).set_seq_len_kv(lengths("seq_kv", kSeqKv));
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
    dQ->set_output(true).set_dim(dim).set_stride(stride).set_uid(kDQ);
    dK->set_output(true).set_dim(dim).set_stride(stride).set_uid(kDK);
    dV->set_output(true).set_dim(dim).set_stride(stride).set_uid(kDV);
  }
  ok(g->validate(), "validate", k);
  ok(g->build_operation_graph(handle), "build_operation_graph", k);
  ok(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", k);
  ok(g->check_support(), "check_support", k);
  ok(g->build_plans(), "build_plans", k);
  Built b;
  b.graph = std::move(g);
  ok(b.graph->get_workspace_size(b.workspace), "get_workspace_size", k);
  return b;
}

// At most this many built graphs are kept, the least recently used pushed out
// first: every shape a run times needs two (forward and backward), and a bucketed
// step's buckets a few dozen, well inside it; a process that goes through shapes
// without end (a sweep of lengths) keeps no more.
constexpr size_t kMaxGraphs = 128;

// A built graph owned by the cache and by the callers running it. A graph's plans
// may hold the code of a kernel still queued on its device, so it is destroyed only
// once that device has finished what was queued (a graph pushed out of the cache
// is rare: the wait is not on a step's path).
std::shared_ptr<const Built> owned(Built b, int device) {
  return std::shared_ptr<const Built>(new Built(std::move(b)), [device](const Built* p) {
    int previous = -1;
    if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
      cudaDeviceSynchronize();  // an error here is the device's, reported by its next call
      cudaSetDevice(previous);
    }
    cudaGetLastError();
    delete p;
  });
}

// The built graphs (never destroyed, as the handles above), and how many were built
// and pushed out.
struct GraphCache {
  using Lru = LruCache<Key, const Built>;
  std::mutex mu;
  Lru lru{kMaxGraphs};
  uint64_t built = 0, pushed_out = 0;
};
GraphCache& graph_cache() {
  static GraphCache& c = *new GraphCache;
  return c;
}

// The built graph of a key, from the cache or built now (under the lock: two
// threads asking for one shape build it once). The frontend picks its forward's
// implementation by cuDNN's version alone (the unified one on newer releases); where
// that one has no engine for a shape, the composite one, which the backward always
// uses, is tried before giving up.
std::shared_ptr<const Built> graph_for(const Key& k, cudnnHandle_t handle) {
  GraphCache& c = graph_cache();
  std::vector<GraphCache::Lru::Entry> pushed_out;  // released after the lock (declared before it)
  const std::lock_guard<std::mutex> lock(c.mu);
  if (auto hit = c.lru.find(k)) return hit;
  Built b;
  try {
    b = build(k, handle, fe::AttentionImplementation_t::AUTO);
  } catch (const std::exception& first) {
    if (k.backward) throw;
    try {
      b = build(k, handle, fe::AttentionImplementation_t::COMPOSITE);
    } catch (const std::exception& second) {
      HR_CHECK(false, "{}; with the composite implementation: {}", first.what(), second.what());
    }
  }
  std::shared_ptr<const Built> g = owned(std::move(b), k.device);
  pushed_out = c.lru.insert(k, g);
  c.built += 1;
  c.pushed_out += pushed_out.size();
  return g;
}

// Whether cuDNN builds a small causal bf16 forward and backward (deterministic or
// not, as asked) on a device, once per device and kind: a library that loads may
// still lack an engine, a sub-library or NVRTC. Empty, or what failed.
const std::string& probe_error(int device, bool deterministic) {
  static std::mutex& mu = *new std::mutex;
  static std::map<std::pair<int, bool>, std::string>& seen = *new std::map<std::pair<int, bool>, std::string>;
  const std::pair<int, bool> at{device, deterministic};
  {
    const std::lock_guard<std::mutex> lock(mu);
    auto it = seen.find(at);
    if (it != seen.end()) return it->second;
  }
  std::string error;
  try {
    const ScopedCudaDevice on(device);
    const cudnnHandle_t h = handle_for(device);
    for (bool backward : {false, true})
      graph_for(make_key(device, DType::bf16, {1, 1, 64, 64}, true, false, backward, deterministic, 0.125f), h);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::lock_guard<std::mutex> lock(mu);
  return seen.emplace(at, std::move(error)).first->second;
}

Key key_of(const Tensor& q, const AttnMask& mask, float scale, bool backward) {
  return make_key(q.device().record().ordinal, q.dtype(), {q.dim(0), q.dim(1), q.dim(2), q.dim(3)}, mask.causal,
                  mask.key_valid_len.defined(), backward, deterministic_setting.load(), scale);
}

std::atomic<uint64_t> executions{0}, deterministic_backwards{0};

// The built graph of a key, or null where cuDNN builds none for it (an engine the
// frontend pins, or its heuristics, may not take every shape the check above lets
// through): said once per key on stderr, and the own scalar kernels run that
// direction (either backward follows either forward). The failure is kept, so a
// shape is not tried again at every call, and given in *why at each: the last
// kMaxFailedShapes of them, as the built graphs are bounded (a shape pushed out is
// tried, and said, again when it comes back).
constexpr size_t kMaxFailedShapes = 8 * kMaxGraphs;  // 8 times the graphs' default
std::shared_ptr<const Built> graph_or_null(const Key& k, cudnnHandle_t handle, std::string* why) {
  static std::mutex& mu = *new std::mutex;
  static LruCache<Key, const std::string>& failed = *new LruCache<Key, const std::string>(kMaxFailedShapes);
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (const std::shared_ptr<const std::string> known = failed.find(k)) {
      if (why != nullptr) *why = *known;
      return nullptr;
    }
  }
  try {
    return graph_for(k, handle);
  } catch (const std::exception& e) {
    const std::lock_guard<std::mutex> lock(mu);
    if (!failed.find(k)) {
      failed.insert(k, std::make_shared<const std::string>(e.what()));
      std::fprintf(stderr, "headroom: %s; the scalar kernels run this shape instead\n", e.what());
    }
    if (why != nullptr) *why = e.what();
    return nullptr;
  }
}

// Runs the built graph of a key on the tensors' stream; the workspace and the
// lengths of the padding mask (cudnn_padding_lengths) come from the device's
// allocator (Consumer::workspace), so the memory accounting sees them. False,
// having run nothing, where cuDNN builds no graph for it (why in *why).
bool execute(const Key& k, const Tensor& q, const AttnMask& mask, std::unordered_map<int64_t, void*>& pack,
             std::string* why) {
  // The tensors' device current while the graph is built (the frontend reads the
  // current device's architecture) and run.
  const ScopedCudaDevice on(k.device);
  const cudnnHandle_t h = handle_for(k.device);
  const std::shared_ptr<const Built> built = graph_or_null(k, h, why);  // alive while it runs
  if (built == nullptr) return false;
  const Built& b = *built;
  Tensor seq_q, seq_kv;
  if (k.padding) {
    seq_q = Tensor::empty(q.device(), {k.B}, DType::i32, Consumer::workspace);
    seq_kv = Tensor::empty(q.device(), {k.B}, DType::i32, Consumer::workspace);
    cudnn_padding_lengths(mask.key_valid_len, k.T, seq_q, seq_kv);
    pack[kSeqQ] = seq_q.data();
    pack[kSeqKv] = seq_kv.data();
  }
  Tensor ws;
  if (b.workspace > 0) ws = Tensor::empty(q.device(), {b.workspace}, DType::u8, Consumer::workspace);
  {
    // The handle is the device's, shared by every thread: its stream is set and the
    // graph enqueued under one lock, so no other thread's stream comes between.
    static std::mutex& mu = *new std::mutex;
    const std::lock_guard<std::mutex> lock(mu);
    const cudnnStatus_t st = fe::detail::set_stream(h, static_cast<cudaStream_t>(q.device().cuda_stream()));
    HR_CHECK(st == CUDNN_STATUS_SUCCESS, "cudnnSetStream: {}", fe::detail::get_error_string(st));
    ok(b.graph->execute(h, pack, ws.defined() ? ws.data() : nullptr), "execute", k);
  }
  executions.fetch_add(1);
  if (k.deterministic) deterministic_backwards.fetch_add(1);
  return true;
}

void* ptr(const Tensor& t) { return const_cast<void*>(t.data()); }

}  // namespace

uint64_t cudnn_attention_executions() { return executions.load(); }
uint64_t cudnn_attention_deterministic_backwards() { return deterministic_backwards.load(); }

CudnnGraphCache cudnn_attention_graph_cache() {
  GraphCache& c = graph_cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  return {c.built, c.pushed_out, c.lru.size(), c.lru.capacity()};
}

size_t set_cudnn_attention_graph_capacity(size_t capacity) {
  GraphCache& c = graph_cache();
  std::vector<GraphCache::Lru::Entry> pushed_out;  // released after the lock (declared before it)
  const std::lock_guard<std::mutex> lock(c.mu);
  const size_t before = c.lru.capacity();
  pushed_out = c.lru.set_capacity(capacity);
  c.pushed_out += pushed_out.size();
  return before;
}

std::string cudnn_attention_library() {
  const Library& l = library();
  return l.error.empty() ? "cuDNN " + version_string(l.version) : std::string();
}

bool cudnn_attention_available(const Tensor& q, const AttnMask& mask, std::string* why) {
  auto no = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (q.dtype() != DType::f16 && q.dtype() != DType::bf16)
    return no(fmt::format("{} takes the own kernels", dtype_name(q.dtype())));
  if (q.ndim() != 4 || q.dim(3) % 8 != 0 || q.dim(3) > 128)
    return no(fmt::format("head dim of {}: cuDNN's fused attention is used at multiples of 8 up to 128", q.str()));
  if (mask.segment_ids.defined()) return no("segment masks (packing) take the own kernels");
  if (reinterpret_cast<uintptr_t>(q.data()) % 16 != 0) return no("inputs not 16-byte aligned");
  const Library& l = library();
  if (!l.error.empty()) return no(l.error);
  // The fused engines run on sm_80 and newer.
  const DeviceRecord& rec = q.device().record();
  if (rec.cc_major < 8)
    return no(fmt::format("compute capability {}.{}: cuDNN's fused attention needs 8.0 or newer", rec.cc_major,
                          rec.cc_minor));
  const bool deterministic = deterministic_setting.load();
  if (const std::string& e = probe_error(rec.ordinal, deterministic); !e.empty())
    return no(fmt::format("cuDNN {} does not build a small {}attention graph here: {}", version_string(l.version),
                          deterministic ? "deterministic " : "", e));
  return true;
}

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttnMask& mask, float scale,
                             Tensor& out, Tensor& lse, std::string* why) {
  const Key key = key_of(q, mask, scale, false);
  std::unordered_map<int64_t, void*> pack{
      {kQ, ptr(q)}, {kK, ptr(k)}, {kV, ptr(v)}, {kO, out.data()}, {kStats, lse.data()}};
  return execute(key, q, mask, pack, why);
}

bool cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& dout, const AttnMask& mask, float scale, const Tensor& lse, Tensor& dq,
                              Tensor& dk, Tensor& dv, std::string* why) {
  const Key key = key_of(q, mask, scale, true);
  std::unordered_map<int64_t, void*> pack{{kQ, ptr(q)},      {kK, ptr(k)},       {kV, ptr(v)},
                                          {kO, ptr(out)},    {kDO, ptr(dout)},   {kStats, ptr(lse)},
                                          {kDQ, dq.data()},  {kDK, dk.data()},   {kDV, dv.data()}};
  return execute(key, q, mask, pack, why);
}

#else  // built without CUDA or without the cuDNN frontend's headers

namespace {
constexpr const char* kNoCudnn =
    HEADROOM_HAVE_CUDA ? "built without the cuDNN frontend's headers (cudnn_frontend.h or cudnn.h not found at configure time)"
                       : "built without the CUDA backend";
}

std::string cudnn_attention_library() { return std::string(); }
uint64_t cudnn_attention_executions() { return 0; }
uint64_t cudnn_attention_deterministic_backwards() { return 0; }
CudnnGraphCache cudnn_attention_graph_cache() { return {}; }
size_t set_cudnn_attention_graph_capacity(size_t) { return 0; }

bool cudnn_attention_available(const Tensor&, const AttnMask&, std::string* why) {
  if (why != nullptr) *why = kNoCudnn;
  return false;
}

bool cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, const AttnMask&, float, Tensor&, Tensor&,
                             std::string*) {
  HR_CHECK(false, "cuDNN attention: {}", kNoCudnn);
  return false;
}

bool cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const AttnMask&, float, const Tensor&, Tensor&, Tensor&, Tensor&, std::string*) {
  HR_CHECK(false, "cuDNN attention: {}", kNoCudnn);
  return false;
}

#endif

}  // namespace hr::ops::cuda

// The quick and full sizes of the controlled models (see presets.hpp).
#include "harness/models/presets.hpp"

#include "harness/check.hpp"

namespace hr {

const char* norm_kind_name(NormKind k) {
  switch (k) {
    case NormKind::none: return "none";
    case NormKind::layernorm: return "layernorm";
    case NormKind::batchnorm: return "batchnorm";
  }
  return "?";
}

NormKind parse_norm_kind(const std::string& s) {
  if (s == "none") return NormKind::none;
  if (s == "layernorm") return NormKind::layernorm;
  if (s == "batchnorm") return NormKind::batchnorm;
  throw InvalidArgument(fmt::format("unknown norm '{}' (expected none, layernorm or batchnorm)", s));
}

const char* kept_label_fault_name(KeptLabelFault f) {
  switch (f) {
    case KeptLabelFault::none: return "none";
    case KeptLabelFault::norm_stats: return "norm_stats";
    case KeptLabelFault::block_hidden: return "block_hidden";
  }
  return "?";
}

const char* mlp_task_name(MlpTask t) { return t == MlpTask::regression ? "regression" : "classification"; }

MlpPreset mlp_preset(Preset p) {
  MlpPreset r;
  if (p == Preset::quick) {
    r.model.in_dim = 64;
    r.model.width = 256;
    r.model.out_dim = 16;
    r.model.layers = 4;
    r.batch = 64;
    r.micro_batch = 64;
  } else {
    r.model.in_dim = 1024;
    r.model.width = 4096;
    r.model.out_dim = 1024;
    r.model.layers = 16;
    r.batch = 8192;
    r.micro_batch = 8192;
  }
  return r;
}

TransformerPreset transformer_preset(Preset p) {
  TransformerPreset r;
  if (p == Preset::quick) {
    r.model.vocab = 512;
    r.model.max_positions = 128;
    r.model.d_model = 128;
    r.model.heads = 4;
    r.model.layers = 4;
    r.batch = 8;
    r.micro_batch = 8;
    r.seq_len = 128;
  } else {
    r.model.vocab = 32768;
    r.model.max_positions = 1024;
    r.model.d_model = 1024;
    r.model.heads = 16;
    r.model.layers = 12;
    r.batch = 16;
    r.micro_batch = 16;
    r.seq_len = 1024;
  }
  return r;
}

}  // namespace hr

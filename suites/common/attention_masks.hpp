// The masks the attention tests run under, by name: none, causal, causal with key
// lengths (padding), causal within packed documents, and key lengths with packed
// documents. Each test file builds them for its own inputs.
#pragma once

namespace hr::test {

enum class MaskKind { none, causal, causal_padding, causal_packed, padding_packed };

inline const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::none: return "none";
    case MaskKind::causal: return "causal";
    case MaskKind::causal_padding: return "causal+padding";
    case MaskKind::causal_packed: return "causal+packed";
    case MaskKind::padding_packed: return "padding+packed";
  }
  return "?";
}

inline constexpr MaskKind kAllMasks[] = {MaskKind::none, MaskKind::causal, MaskKind::causal_padding,
                                         MaskKind::causal_packed, MaskKind::padding_packed};

inline bool is_causal(MaskKind m) {
  return m == MaskKind::causal || m == MaskKind::causal_padding || m == MaskKind::causal_packed;
}
inline bool has_key_lengths(MaskKind m) { return m == MaskKind::causal_padding || m == MaskKind::padding_packed; }
inline bool has_segments(MaskKind m) { return m == MaskKind::causal_packed || m == MaskKind::padding_packed; }

}  // namespace hr::test

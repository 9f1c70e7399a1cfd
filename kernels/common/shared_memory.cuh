// A kernel's static shared memory, declared as HR_SHARED(T, name) (T may be an
// array type: HR_SHARED(float[32], scratch)): `__shared__ T name` on a GPU; under
// the warp emulation (suites/common/warp_emulation.hpp) storage of the block being
// run, filled with 0xff bytes at each block as its dynamic shared memory is, so
// that a read of what no thread of this block wrote shows.
#pragma once

namespace hr::gpu {
template <typename T>
struct SharedType {
  using type = T;
};
}  // namespace hr::gpu

#if defined(HR_WARP_EMULATION)
#define HR_SHARED(T, name)                  \
  static const char hr_shared_tag_##name{}; \
  typename ::hr::gpu::SharedType<T>::type& name = ::hr::warp_emu::static_shared<T>(&hr_shared_tag_##name)
#else
#define HR_SHARED(T, name) __shared__ typename ::hr::gpu::SharedType<T>::type name
#endif

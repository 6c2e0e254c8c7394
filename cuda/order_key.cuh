// The token order of sampling and logprobs, as one 64-bit key: probability (or logit) desc, then
// id asc. order_key(x, id) > order_key(y, j) exactly when x > y, or x == y and id < j, so every
// "most likely first" walk is a descending walk over keys, ties broken like the CPU backend.
#pragma once

namespace xserv::cuda {

using order_key_t = unsigned long long;

// Order-preserving float bits in the high half, ~id in the low half.
__device__ __forceinline__ order_key_t order_key(float x, int id) {
  unsigned u = __float_as_uint(x);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<order_key_t>(u) << 32) | (0xFFFFFFFFu - static_cast<unsigned>(id));
}
__device__ __forceinline__ int key_id(order_key_t key) {
  return static_cast<int>(0xFFFFFFFFu - static_cast<unsigned>(key & 0xFFFFFFFFull));
}
// The float a key was made from.
__device__ __forceinline__ float key_value(order_key_t key) {
  const unsigned b = static_cast<unsigned>(key >> 32);
  return __uint_as_float((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b);
}

}  // namespace xserv::cuda

// NCCL loaded with dlopen (see nccl_communicator.hpp).
//
// The declarations below restate NCCL's public C API (types by size and meaning, enum values as
// documented) for the calls xserv makes: ncclGetVersion, ncclCommInitAll, ncclAllReduce,
// ncclCommDestroy, ncclGetErrorString. They are resolved with dlsym, never linked.
#include "parallel/nccl_communicator.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "core/error.hpp"

namespace xserv {

namespace {

// NCCL's handle, result code and the enum values xserv passes (documented in the NCCL API).
using NcclComm = struct NcclCommOpaque*;
using NcclResult = int;  // ncclResult_t; 0 = ncclSuccess
constexpr NcclResult nccl_success = 0;
constexpr int nccl_sum = 0;  // ncclRedOp_t ncclSum
enum NcclDataType : int { nccl_float16 = 6, nccl_float32 = 7, nccl_bfloat16 = 9 };

struct NcclApi {
  NcclResult (*get_version)(int*) = nullptr;
  NcclResult (*comm_init_all)(NcclComm*, int, const int*) = nullptr;
  NcclResult (*all_reduce)(const void*, void*, std::size_t, int, int, NcclComm, void*) = nullptr;
  NcclResult (*comm_destroy)(NcclComm) = nullptr;
  const char* (*get_error_string)(NcclResult) = nullptr;
  int version = 0;
  std::string error;  // why loading failed; empty when the API is usable
};

template <typename F>
bool resolve(void* lib, const char* name, F& out, std::string& error) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  if (!out) error = fmt::format("the NCCL library lacks {}", name);
  return out != nullptr;
}

NcclApi load_api(const std::string& name) {
  NcclApi a;
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    a.error = fmt::format("dlopen({}) failed: {}", name, e ? e : "unknown error");
    return a;
  }
  if (resolve(lib, "ncclGetVersion", a.get_version, a.error) &&
      resolve(lib, "ncclCommInitAll", a.comm_init_all, a.error) &&
      resolve(lib, "ncclAllReduce", a.all_reduce, a.error) &&
      resolve(lib, "ncclCommDestroy", a.comm_destroy, a.error) &&
      resolve(lib, "ncclGetErrorString", a.get_error_string, a.error)) {
    if (a.get_version(&a.version) != nccl_success) a.version = 0;
  }
  return a;
}

// The API of the library XSERV_NCCL_LIBRARY names now (default libnccl.so.2), loaded once per
// name and kept for the process (entries are never removed, so references stay valid).
const NcclApi& nccl() {
  static std::mutex mutex;
  static std::map<std::string, NcclApi> loaded;
  const char* env = std::getenv("XSERV_NCCL_LIBRARY");
  const std::string name = env && *env ? env : "libnccl.so.2";
  std::lock_guard lock(mutex);
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, load_api(name)).first;
  return it->second;
}

void check(const NcclApi& api, NcclResult r, const char* what) {
  if (r == nccl_success) return;
  const char* msg = api.get_error_string ? api.get_error_string(r) : nullptr;
  throw_error(ErrorCode::cuda, "{} failed: {} (NCCL error {})", what, msg ? msg : "unknown", r);
}

int nccl_dtype(DType t) {
  switch (t) {
    case DType::f32: return nccl_float32;
    case DType::f16: return nccl_float16;
    case DType::bf16: return nccl_bfloat16;
    default:
      throw_error(ErrorCode::invalid_argument, "all_reduce_sum: dtype {} (expected f32, f16 or bf16)",
                  dtype_name(t));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi& api, NcclComm comm, int rank, int size, void* stream)
      : api_(api), comm_(comm), rank_(rank), size_(size), stream_(stream) {}
  ~NcclCommunicator() override { (void)api_.comm_destroy(comm_); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  void all_reduce_sum(Tensor t) override {
    XSERV_CHECK(t.device.kind == DeviceKind::cuda, ErrorCode::invalid_argument,
                "all_reduce_sum: NCCL sums device tensors only");
    if (t.numel() == 0) return;  // one rank still calls NCCL: its test runs the real call
    check(api_, api_.all_reduce(t.data, t.data, static_cast<std::size_t>(t.numel()),
                                nccl_dtype(t.dtype), nccl_sum, comm_, stream_),
          "ncclAllReduce");
  }

 private:
  const NcclApi& api_;  // an entry of nccl()'s map: lives as long as the process
  NcclComm comm_;
  int rank_, size_;
  void* stream_;
};

}  // namespace

bool nccl_available(std::string* why) {
  const NcclApi& api = nccl();
  if (why) *why = api.error;
  return api.error.empty();
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    const std::vector<int>& devices, const std::vector<void*>& streams) {
  XSERV_CHECK(!devices.empty() && devices.size() == streams.size(), ErrorCode::invalid_argument,
              "NCCL: {} devices and {} streams (expected the same number, at least one)",
              devices.size(), streams.size());
  XSERV_CHECK(std::set<int>(devices.begin(), devices.end()).size() == devices.size(),
              ErrorCode::invalid_argument, "NCCL: a device is listed twice");
  const NcclApi& api = nccl();
  XSERV_CHECK(api.error.empty(), ErrorCode::unsupported,
              "tensor parallelism over {} GPUs needs NCCL at run time: {} (install NCCL 2, "
              "or point XSERV_NCCL_LIBRARY at libnccl.so.2)",
              devices.size(), api.error);
  const int n = static_cast<int>(devices.size());
  std::vector<NcclComm> raw(devices.size(), nullptr);
  check(api, api.comm_init_all(raw.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(devices.size());
  for (int r = 0; r < n; ++r)
    comms.push_back(std::make_unique<NcclCommunicator>(api, raw[static_cast<std::size_t>(r)], r, n,
                                                       streams[static_cast<std::size_t>(r)]));
  return comms;
}

}  // namespace xserv

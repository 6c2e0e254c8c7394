#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>

int main(int argc, char* argv[]) {
  // The tests check the CPU backend's f32-activation results (HF parity to 1e-4, CUDA ops against
  // the CPU backend): its AMX bf16 prefill GEMM, on by default where the CPU has AMX, runs only
  // where a test asks for it (XSERV_CPU_AMX, cpu_backend_test.cpp) or the environment does.
  ::setenv("XSERV_CPU_AMX", "0", 0);
  return Catch::Session().run(argc, argv);
}

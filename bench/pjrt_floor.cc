// The floor under a Strict op on this plugin: one cached program (an add of two
// f32[1024]) run back to back through torch_tpu's runtime layer, no torch, no engine.
//   build/tt_pjrt_floor            (TORCH_TPU_PJRT_PLUGIN names the plugin)
// Prints microseconds per run: enqueue only (runs in flight, bounded as the engine
// bounds them), and enqueue plus waiting for each run.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "hlo/builder.h"
#include "runtime/runtime.h"

using namespace tt;

int main() {
  const char* p = std::getenv("TORCH_TPU_PJRT_PLUGIN");
  if (!p || !*p) {
    std::fprintf(stderr, "TORCH_TPU_PJRT_PLUGIN is not set\n");
    return 2;
  }
  auto& c = rt::Client::init(p, "cpu", 1);
  hlo::Builder b;
  auto x = b.param(hlo::Type{hlo::DType::F32, {1024}});
  auto y = b.param(hlo::Type{hlo::DType::F32, {1024}});
  auto exe = c.compile(b.module({b.add(x, y)}));
  std::vector<float> host(1024, 1.0f);
  auto bx = c.from_host(host.data(), PJRT_T_F32, {1024}, 0);
  auto by = c.from_host(host.data(), PJRT_T_F32, {1024}, 0);
  std::vector<PJRT_Buffer*> args{bx->get(), by->get()};
  std::vector<int64_t> keep{0, 1};
  auto time_runs = [&](bool wait) {
    const int n = 20000;
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        auto out = exe->execute(0, args, keep);
        if (wait) c.wait_all();
      }
      c.wait_all();
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
      if (us < best) best = us;
    }
    return best;
  };
  double enqueue = time_runs(false), waited = time_runs(true);
  std::printf("{\"enqueue_us\": %.2f, \"run_and_wait_us\": %.2f}\n", enqueue, waited);
  return 0;
}

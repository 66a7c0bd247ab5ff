// In-program collectives (the path for TPU ICI / GPU NCCL inside a program): one
// StableHLO program compiled for 2 replicas runs on the CPU plugin's 2 devices in
// this process, each replica with its own arguments. Needs TORCH_TPU_PJRT_PLUGIN.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "hlo/builder.h"
#include "runtime/runtime.h"

using namespace tt;

namespace {
rt::Client& client() {
  const char* p = std::getenv("TORCH_TPU_PJRT_PLUGIN");
  if (!p || !*p) throw std::runtime_error("TORCH_TPU_PJRT_PLUGIN is not set");
  return rt::Client::init(p, "cpu", 2);
}

// A module whose main takes one f32[n_in] and returns f32[n_out] = `body` applied to %x.
std::string module(int n_in, int n_out, const std::string& body) {
  return "module @m {\n  func.func public @main(%x: tensor<" + std::to_string(n_in) + "xf32>) -> tensor<" +
         std::to_string(n_out) + "xf32> {\n" + body + "    return %r : tensor<" + std::to_string(n_out) +
         "xf32>\n  }\n}\n";
}

const char* kAdd =
    "({\n    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n      %s = stablehlo.add %a, %b : tensor<f32>\n"
    "      stablehlo.return %s : tensor<f32>\n    })";

// Runs `text` on both devices (replica i gets inputs[i]); returns each replica's output.
std::vector<std::vector<float>> run2(const std::string& text, const std::vector<std::vector<float>>& inputs,
                                     size_t n_out) {
  auto& c = client();
  auto exe = c.compile_replicated(text, 2);
  std::vector<rt::BufferPtr> keep;
  std::vector<std::vector<PJRT_Buffer*>> args;
  for (int d = 0; d < 2; ++d) {
    keep.push_back(c.from_host(inputs[d].data(), PJRT_T_F32, {static_cast<int64_t>(inputs[d].size())}, d));
    args.push_back({keep.back()->get()});
  }
  auto outs = exe->execute_replicated(args);
  std::vector<std::vector<float>> r(2, std::vector<float>(n_out));
  for (int d = 0; d < 2; ++d) outs[d][0]->to_host(r[d].data(), n_out * sizeof(float));
  return r;
}
}  // namespace

TEST(Collectives, AllReduceAcrossTwoDevices) {
  auto r = run2(module(4, 4, std::string("    %r = \"stablehlo.all_reduce\"(%x) ") + kAdd +
                                 " {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> "
                                 "tensor<4xf32>\n"),
                {{1, 2, 3, 4}, {10, 20, 30, 40}}, 4);
  EXPECT_EQ(r[0], (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(r[1], r[0]);
}

TEST(Collectives, AllGatherReduceScatterAllToAll) {
  auto g = run2(module(2, 4,
                       "    %r = \"stablehlo.all_gather\"(%x) {all_gather_dim = 0 : i64, replica_groups = "
                       "dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<2xf32>) -> tensor<4xf32>\n"),
                {{1, 2}, {3, 4}}, 4);
  EXPECT_EQ(g[0], (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(g[1], g[0]);
  auto rs = run2(module(4, 2, std::string("    %r = \"stablehlo.reduce_scatter\"(%x) ") + kAdd +
                                  " {scatter_dimension = 0 : i64, replica_groups = dense<[[0, 1]]> : "
                                  "tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<2xf32>\n"),
                 {{1, 2, 3, 4}, {10, 20, 30, 40}}, 2);
  EXPECT_EQ(rs[0], (std::vector<float>{11, 22}));
  EXPECT_EQ(rs[1], (std::vector<float>{33, 44}));
  auto a2a = run2(module(4, 4,
                         "    %r = \"stablehlo.all_to_all\"(%x) {split_dimension = 0 : i64, concat_dimension = 0 "
                         ": i64, split_count = 2 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : "
                         "(tensor<4xf32>) -> tensor<4xf32>\n"),
                  {{1, 2, 3, 4}, {10, 20, 30, 40}}, 4);
  EXPECT_EQ(a2a[0], (std::vector<float>{1, 2, 10, 20}));
  EXPECT_EQ(a2a[1], (std::vector<float>{3, 4, 30, 40}));
}

TEST(Collectives, SingletonGroupsAndErrors) {
  // replica groups {0} and {1}: each replica reduces alone
  auto r = run2(module(2, 2, std::string("    %r = \"stablehlo.all_reduce\"(%x) ") + kAdd +
                                 " {replica_groups = dense<[[0], [1]]> : tensor<2x1xi64>} : (tensor<2xf32>) -> "
                                 "tensor<2xf32>\n"),
                {{1, 2}, {5, 6}}, 2);
  EXPECT_EQ(r[0], (std::vector<float>{1, 2}));
  EXPECT_EQ(r[1], (std::vector<float>{5, 6}));
  EXPECT_THROW(client().compile_replicated(module(2, 2, "    %r = stablehlo.abs %x : tensor<2xf32>\n"), 3), rt::Error);
  auto exe = client().compile_replicated(module(2, 2, "    %r = stablehlo.abs %x : tensor<2xf32>\n"), 2);
  EXPECT_THROW(exe->execute_replicated({}), rt::Error);
}

// The builder's collectives: the text they emit runs as the hand-written modules above do.
TEST(Collectives, BuilderCollectivesRunOnTwoReplicas) {
  using hlo::Builder;
  auto built = [](int n_in, auto body) {
    Builder b;
    hlo::Value x = b.param(hlo::Type{hlo::DType::F32, {n_in}});
    return b.module({body(b, x)}, 2);
  };
  const Builder::Groups both{{0, 1}};
  std::vector<std::vector<float>> in{{1, 2, 3, 4}, {10, 20, 30, 40}};
  auto sum = run2(built(4, [&](Builder& b, hlo::Value x) { return b.all_reduce(x, "sum", both); }), in, 4);
  EXPECT_EQ(sum[0], (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(sum[1], sum[0]);
  auto avg = run2(built(4, [&](Builder& b, hlo::Value x) { return b.all_reduce(x, "avg", both); }), in, 4);
  EXPECT_EQ(avg[0], (std::vector<float>{5.5f, 11, 16.5f, 22}));
  auto mx = run2(built(4, [&](Builder& b, hlo::Value x) { return b.all_reduce(x, "max", {{0}, {1}}); }), in, 4);
  EXPECT_EQ(mx[1], in[1]);  // singleton groups: each replica alone
  auto g = run2(built(2, [&](Builder& b, hlo::Value x) { return b.all_gather(x, 0, both); }), {{1, 2}, {3, 4}}, 4);
  EXPECT_EQ(g[0], (std::vector<float>{1, 2, 3, 4}));
  auto rs = run2(built(4, [&](Builder& b, hlo::Value x) { return b.reduce_scatter(x, "sum", 0, both); }), in, 2);
  EXPECT_EQ(rs[1], (std::vector<float>{33, 44}));
  auto a2a = run2(built(4, [&](Builder& b, hlo::Value x) { return b.all_to_all(x, 0, 0, both); }), in, 4);
  EXPECT_EQ(a2a[0], (std::vector<float>{1, 2, 10, 20}));
  EXPECT_EQ(a2a[1], (std::vector<float>{3, 4, 30, 40}));
  // bad groups and reductions are build errors, not crashes
  Builder b;
  hlo::Value x = b.param(hlo::Type{hlo::DType::F32, {3}});
  EXPECT_THROW(b.all_reduce(x, "median", both), hlo::BuildError);
  EXPECT_THROW(b.all_reduce(x, "sum", {{0, 1}, {2}}), hlo::BuildError);
  EXPECT_THROW(b.reduce_scatter(x, "sum", 0, both), hlo::BuildError);  // 3 rows for 2 replicas
  EXPECT_THROW(b.all_gather(x, 1, both), hlo::BuildError);
}

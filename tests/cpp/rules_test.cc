// Rule-level tests: a lowering rule looked up in the registry, given arguments, builds
// StableHLO (checked as text) that runs on the PJRT plugin named by TORCH_TPU_PJRT_PLUGIN
// (the CPU plugin in CI). No engine and no torch: the rule layer alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "hlo/builder.h"
#include "lowering/lowering.h"
#include "runtime/runtime.h"

using namespace tt;
using hlo::DType;
using hlo::Type;
using hlo::Value;

namespace {

rt::Client& client() {
  const char* p = std::getenv("TORCH_TPU_PJRT_PLUGIN");
  if (!p || !*p) throw std::runtime_error("TORCH_TPU_PJRT_PLUGIN is not set");
  return rt::Client::init(p, "cpu", 2);
}

// What a rule asks of an engine, without one: a Python number bound at run time becomes
// the next program parameter (its value kept to pass when the program runs).
class TestEnv : public lower::Env {
 public:
  explicit TestEnv(hlo::Builder& b) : b_(b) {}
  Value scalar_param(double v, bool, DType t) override {
    scalars.push_back(static_cast<float>(v));
    return b_.param(Type{t, {}});
  }
  std::pair<Value, Value> rng(int64_t) override { throw lower::Unsupported("no generator in rule tests"); }
  lower::Precision precision() const override { return lower::Precision::HIGHEST; }
  std::vector<float> scalars;

 private:
  hlo::Builder& b_;
};

// An argument of one kind, its value set by `set`.
template <typename Set>
lower::Arg arg(lower::Arg::Kind kind, Set set) {
  lower::Arg a;
  a.kind = kind;
  set(a);
  return a;
}
lower::Arg tensor(Value v) { return arg(lower::Arg::Tensor, [&](lower::Arg& a) { a.tensor = v; }); }
lower::Arg number(double v) { return arg(lower::Arg::Scalar, [&](lower::Arg& a) { a.set_number(v); }); }
lower::Arg integer(int64_t v) { return arg(lower::Arg::Int, [&](lower::Arg& a) { a.i = v; }); }
lower::Arg flag(bool v) { return arg(lower::Arg::Bool, [&](lower::Arg& a) { a.b = v; }); }
lower::Arg ints(std::vector<int64_t> v) { return arg(lower::Arg::IntList, [&](lower::Arg& a) { a.ints = std::move(v); }); }
lower::Arg none() { return lower::Arg{}; }

// One rule applied to float32 tensor parameters of the given shapes plus `extra` arguments
// after them; its first result is the program's result.
struct Lowered {
  std::string text;
  lower::Reads reads;
  std::vector<float> scalars;  // values of the parameters the rule bound, after the tensors
};

Lowered lower_rule(const std::string& name, const std::vector<hlo::Shape>& shapes, std::vector<lower::Arg> extra,
                   const Type& out) {
  static bool registered = (lower::register_all(), true);
  (void)registered;
  const lower::Rule* rule = lower::find_rule(name);
  if (!rule) throw std::runtime_error("no rule for " + name);
  hlo::Builder b;
  TestEnv env(b);
  std::vector<lower::Arg> args;
  for (const auto& s : shapes) args.push_back(tensor(b.param(Type{DType::F32, s})));
  for (auto& a : extra) args.push_back(std::move(a));
  lower::Ctx ctx(b, env, std::move(args), {out});
  std::vector<Value> res = (*rule)(ctx);
  return {b.module({res.at(0)}), ctx.reads(), env.scalars};
}

int64_t numel(const hlo::Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<float> run(const Lowered& l, const std::vector<std::vector<float>>& inputs,
                       const std::vector<hlo::Shape>& shapes, const hlo::Shape& out_shape) {
  auto& c = client();
  auto exe = c.compile(l.text);
  std::vector<rt::BufferPtr> bufs;
  std::vector<PJRT_Buffer*> args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bufs.push_back(c.from_host(inputs[i].data(), PJRT_T_F32, shapes[i], 0));
    args.push_back(bufs.back()->get());
  }
  for (const float& v : l.scalars) {
    bufs.push_back(c.from_host(&v, PJRT_T_F32, {}, 0));
    args.push_back(bufs.back()->get());
  }
  auto outs = exe->execute(0, args);
  std::vector<float> r(numel(out_shape));
  outs[0]->to_host(r.data(), r.size() * sizeof(float));
  return r;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST(Rules, AddBroadcastsAndScalesByAlphaBoundAtRunTime) {
  // add.Tensor(x[2, 3], y[3], alpha=2): x + 2 * y, alpha a runtime parameter (not in the text)
  Lowered l = lower_rule("aten::add.Tensor", {{2, 3}, {3}}, {number(2.0)}, Type{DType::F32, {2, 3}});
  EXPECT_TRUE(has(l.text, "stablehlo.add")) << l.text;
  EXPECT_TRUE(has(l.text, "stablehlo.multiply")) << l.text;
  EXPECT_TRUE(has(l.text, "stablehlo.broadcast_in_dim")) << l.text;
  ASSERT_EQ(l.scalars, std::vector<float>{2.0f});
  ASSERT_EQ(l.reads.size(), 1u);  // only "is alpha 1?" shaped the text
  EXPECT_EQ(l.reads[0].arg, 2);
  EXPECT_EQ(l.reads[0].test, 0);
  auto r = run(l, {{0, 1, 2, 3, 4, 5}, {1, 2, 3}}, {{2, 3}, {3}}, {2, 3});
  EXPECT_EQ(r, (std::vector<float>{2, 5, 8, 5, 8, 11}));
}

TEST(Rules, AddWithAlphaOneHasNoMultiply) {
  Lowered l = lower_rule("aten::add.Tensor", {{4}, {4}}, {number(1.0)}, Type{DType::F32, {4}});
  EXPECT_FALSE(has(l.text, "stablehlo.multiply")) << l.text;
  EXPECT_TRUE(l.scalars.empty());
  ASSERT_EQ(l.reads.size(), 1u);
  EXPECT_EQ(l.reads[0].test, 1);
  EXPECT_EQ(run(l, {{1, 2, 3, 4}, {10, 20, 30, 40}}, {{4}, {4}}, {4}), (std::vector<float>{11, 22, 33, 44}));
}

TEST(Rules, SoftmaxSubtractsTheMaximumFirst) {
  // _softmax(x, dim=-1, half_to_float=False) on rows that would overflow exp() unshifted
  Lowered l = lower_rule("aten::_softmax", {{2, 3}}, {integer(-1), flag(false)}, Type{DType::F32, {2, 3}});
  EXPECT_TRUE(has(l.text, "stablehlo.maximum")) << l.text;
  EXPECT_TRUE(has(l.text, "stablehlo.exponential")) << l.text;
  auto r = run(l, {{1000, 1000, 0, 0, 0, 0}}, {{2, 3}}, {2, 3});
  EXPECT_FLOAT_EQ(r[0], 0.5f);
  EXPECT_FLOAT_EQ(r[1], 0.5f);
  EXPECT_FLOAT_EQ(r[2], 0.0f);
  for (int i = 3; i < 6; ++i) EXPECT_NEAR(r[i], 1.0f / 3, 1e-6);
}

TEST(Rules, SumOverADimListReducesWithAdd) {
  // sum.dim_IntList(x[2, 3], dim=[1], keepdim=False, dtype=None)
  Lowered l = lower_rule("aten::sum.dim_IntList", {{2, 3}}, {ints({1}), flag(false), none()}, Type{DType::F32, {2}});
  EXPECT_TRUE(has(l.text, "stablehlo.reduce")) << l.text;
  EXPECT_EQ(run(l, {{1, 2, 3, 4, 5, 6}}, {{2, 3}}, {2}), (std::vector<float>{6, 15}));
  // a dim out of range is PyTorch's IndexError, raised while building
  EXPECT_THROW(lower_rule("aten::sum.dim_IntList", {{2, 3}}, {ints({2}), flag(false), none()}, Type{DType::F32, {2}}),
               lower::IndexError);
}

TEST(Rules, SubtractingBoolTensorsIsCpusError) {
  static bool registered = (lower::register_all(), true);
  (void)registered;
  hlo::Builder b;
  TestEnv env(b);
  std::vector<lower::Arg> args{tensor(b.param(Type{DType::Pred, {2}})), tensor(b.param(Type{DType::Pred, {2}})),
                               number(1.0)};
  lower::Ctx ctx(b, env, std::move(args), {Type{DType::Pred, {2}}});
  try {
    (*lower::find_rule("aten::sub.Tensor"))(ctx);
    FAIL() << "no error";
  } catch (const lower::UserError& e) {
    EXPECT_TRUE(has(e.what(), "Subtraction, the `-` operator, with a bool tensor is not supported")) << e.what();
  }
}

TEST(Rules, EveryFamilyRegistersItsTable) {
  static bool registered = (lower::register_all(), true);
  (void)registered;
  for (const char* name : {"aten::add.Tensor", "aten::native_layer_norm", "aten::cat", "aten::index.Tensor",
                           "aten::mm", "aten::sum.dim_IntList", "aten::max_pool3d_with_indices",
                           "aten::special_log_ndtr", "aten::_fft_c2c", "aten::upsample_bilinear2d"})
    EXPECT_NE(lower::find_rule(name), nullptr) << name;
  EXPECT_EQ(lower::find_rule("aten::no_such_op"), nullptr);
}

// Golden-text tests of the StableHLO builder.
#include <gtest/gtest.h>

#include <memory>

#include "hlo/builder.h"

using namespace tt::hlo;

TEST(Builder, AddModuleText) {
  Builder b;
  Value x = b.param(Type{DType::F32, {2, 3}});
  Value y = b.param(Type{DType::F32, {2, 3}});
  Value z = b.add(x, y);
  std::string text = b.module({z});
  EXPECT_NE(text.find("func.func public @main(%v0: tensor<2x3xf32>, %v1: tensor<2x3xf32>) -> (tensor<2x3xf32>)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("%v2 = \"stablehlo.add\"(%v0, %v1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("return %v2 : tensor<2x3xf32>"), std::string::npos) << text;
}

TEST(Builder, ConstantsAreExactBitPatterns) {
  Builder b;
  Value c = b.constant(1.0, DType::F32, {2});
  Value h = b.constant(1.0, DType::BF16);
  Value i = b.constant_int(-7, DType::S64);
  std::string text = b.module({c, h, i});
  EXPECT_NE(text.find("dense<0x3F800000> : tensor<2xf32>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<0x3F80> : tensor<bf16>"), std::string::npos) << text;
  EXPECT_NE(text.find("dense<-7> : tensor<i64>"), std::string::npos) << text;
}

TEST(Builder, ShapeInference) {
  Builder b;
  Value x = b.param(Type{DType::F32, {4, 5, 6}});
  EXPECT_EQ(b.transpose(x, {2, 0, 1}).shape(), (Shape{6, 4, 5}));
  EXPECT_EQ(b.reduce(x, b.zeros(DType::F32, {}), {1}, op::add).shape(), (Shape{4, 6}));
  EXPECT_EQ(b.slice(x, {0, 1, 0}, {4, 5, 6}, {2, 2, 3}).shape(), (Shape{2, 2, 2}));
  Value w = b.param(Type{DType::F32, {4, 6, 7}});
  DotDims d{{0}, {0}, {2}, {1}};
  EXPECT_EQ(b.dot_general(x, w, d, DType::F32).shape(), (Shape{4, 5, 7}));
  EXPECT_EQ(b.broadcast_to(b.param(Type{DType::F32, {5, 1}}), {3, 5, 6}).shape(), (Shape{3, 5, 6}));
  Value idx = b.param(Type{DType::S64, {2, 3}});
  EXPECT_EQ(b.take(x, idx, 1).shape(), (Shape{4, 2, 3, 6}));
}

// The typed op constants print as the StableHLO ops they name (`and_` is stablehlo.and),
// in elementwise ops and in region bodies; a scatter without a body keeps the update.
TEST(Builder, OpConstantsPrintAsStableHLOOps) {
  Builder b;
  Value p = b.param(Type{DType::Pred, {3}});
  Value q = b.param(Type{DType::Pred, {3}});
  Value x = b.param(Type{DType::F32, {3}});
  Value idx = b.param(Type{DType::S64, {2, 1}});
  Value upd = b.param(Type{DType::F32, {2}});
  Value a = b.binary(op::and_, p, q);
  Value n = b.unary(op::not_, a);
  Value r = b.reduce(n, b.constant_int(0, DType::Pred), {0}, op::or_);
  Value e = b.unary(op::exponential, x);
  Value s = b.scatter(x, idx, upd, {0}, std::nullopt);
  std::string text = b.module({r, e, s});
  EXPECT_NE(text.find("\"stablehlo.and\"(%v0, %v1) : (tensor<3xi1>, tensor<3xi1>) -> tensor<3xi1>"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\"stablehlo.not\"("), std::string::npos) << text;
  EXPECT_NE(text.find("\"stablehlo.or\"(%v"), std::string::npos) << text;  // the reduce body
  EXPECT_NE(text.find("\"stablehlo.exponential\"(%v2)"), std::string::npos) << text;
  EXPECT_EQ(text.find("stablehlo.and_"), std::string::npos) << text;
  EXPECT_EQ(op::xor_.name, std::string("xor"));
  EXPECT_TRUE(op::abs == op::Unary{"abs"});
  EXPECT_TRUE(op::add != op::multiply);
  // replace: the scatter's body only returns the update (no combining op)
  auto at = text.find("\"stablehlo.scatter\"");
  ASSERT_NE(at, std::string::npos) << text;
  std::string region = text.substr(at, text.find('}', at) - at);
  EXPECT_NE(region.find("\"stablehlo.return\""), std::string::npos) << region;
  EXPECT_EQ(region.find(" = \"stablehlo."), std::string::npos) << region;
}

TEST(Builder, MismatchedOperandsAreBuildErrors) {
  Builder b;
  Value x = b.param(Type{DType::F32, {2}});
  Value y = b.param(Type{DType::F32, {3}});
  EXPECT_THROW(b.add(x, y), BuildError);
  EXPECT_THROW(b.reshape(x, {3}), BuildError);
}

// Dry mode hands out the same values (ids and types) as building the text, so
// a replayed graph can take a recorded body and continue with text from there.
TEST(Builder, DryModeNumbersValuesLikeTextMode) {
  auto build = [](Builder& b) {
    Value x = b.param(Type{DType::F32, {4, 3}});
    Value m = b.reduce(x, b.constant(0.0, DType::F32), {1}, op::add);
    auto [v, i] = b.reduce_arg(x, 1, true);
    Value s = b.sort_dim(x, 0, false, nullptr);
    Value c = b.constant_array(std::vector<int64_t>{1, 2, 3}, DType::S64);
    return std::vector<Value>{m, v, i, s, c};
  };
  Builder text, dry;
  dry.set_dry(true);
  auto a = build(text), d = build(dry);
  ASSERT_EQ(a.size(), d.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].id, d[k].id);
    EXPECT_EQ(a[k].type, d[k].type);
  }
  EXPECT_TRUE(dry.body_text().empty());
  dry.materialize(text.body_text());
  Value t1 = text.add(a[0], a[1]), t2 = dry.add(d[0], d[1]);
  EXPECT_EQ(t1.id, t2.id);
  EXPECT_EQ(text.module({t1}), dry.module({t2}));
}

// Custom kernels: private functions are printed after @main once per symbol,
// called with func.call, recorded in dry mode too and dropped by a rollback.
TEST(Builder, PrivateFunctionsAndCalls) {
  auto fn = std::make_shared<const std::string>(
      "  func.func private @k_main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
      "    return %a : tensor<2xf32>\n  }");
  Builder b;
  Value x = b.param(Type{DType::F32, {2}});
  b.add_function("k_main", fn);
  Value y = b.call("k_main", {x}, {x.type})[0];
  b.add_function("k_main", fn);
  auto two = b.call("k_main", {y}, {x.type, x.type});  // multi-result calls are rebound like any op
  ASSERT_EQ(two.size(), 2u);
  std::string text = b.module({two[1]});
  EXPECT_NE(text.find("%v1 = \"func.call\"(%v0) {callee = @k_main} : (tensor<2xf32>) -> tensor<2xf32>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("%v2:2 = \"func.call\"(%v1) {callee = @k_main}"), std::string::npos) << text;
  EXPECT_EQ(text.find("func.func private @k_main"), text.rfind("func.func private @k_main")) << text;
  EXPECT_GT(text.find("func.func private @k_main"), text.find("return %v")) << text;  // after @main

  Builder dry;
  dry.set_dry(true);
  Value dx = dry.param(Type{DType::F32, {2}});
  auto m = dry.mark();
  dry.add_function("k_main", fn);
  Value dy = dry.call("k_main", {dx}, {dx.type})[0];
  EXPECT_EQ(dy.id, y.id);
  dry.materialize(text.substr(0, 0));
  EXPECT_NE(dry.module({}).find("@k_main"), std::string::npos);  // kept when the text takes over
  dry.rollback(m);
  EXPECT_EQ(dry.module({}).find("@k_main"), std::string::npos);
}

// A rollback restarts value numbering at the mark: a dry replay whose failed
// op was rolled back numbers the next ops as the recording (without it) did.
TEST(Builder, RollbackRestartsValueNumbers) {
  Builder rec;
  Value a = rec.param(Type{DType::F32, {2}});
  Value r1 = rec.add(rec.mul(a, a), a);
  Builder replay;
  replay.set_dry(true);
  Value b = replay.param(Type{DType::F32, {2}});
  auto m = replay.mark();
  replay.unary(op::exponential, replay.unary(op::tanh, b));  // an op that failed after emitting values
  replay.rollback(m);
  Value r2 = replay.add(replay.mul(b, b), b);
  EXPECT_EQ(r1.id, r2.id);
  replay.materialize(rec.body_text());
  EXPECT_EQ(rec.module({r1}), replay.module({r2}));
}

// Bounded dynamism: set_dimension_size marks a value dynamic, every op on it carries the
// mark, a size read through a bounded-typed copy (a static type would fold to the bound).
TEST(Builder, DynamicDimsPropagateAndSizesAreReadAtRunTime) {
  Builder b;
  Value x = b.param(Type{DType::F32, {4, 8}});
  Value n = b.param(Type{DType::S32, {}});
  EXPECT_FALSE(x.type.dynamic);
  Value d = b.set_dimension_size(x, n, 1);
  EXPECT_TRUE(d.type.dynamic);
  EXPECT_EQ(d.type, x.type);  // the flag is not part of the type
  Value e = b.unary(op::exponential, d);
  Value s = b.reduce(e, b.zeros(DType::F32, {}), {1}, op::add);
  EXPECT_TRUE(e.type.dynamic && s.type.dynamic);
  EXPECT_FALSE(b.add(x, x).type.dynamic);
  Value cnt = b.count(e, {1}, DType::F32);
  std::string text = b.module({b.div(s, b.broadcast_in_dim(cnt, s.shape(), {}))});
  EXPECT_NE(text.find("\"stablehlo.set_dimension_size\"(%v0, %v1) {dimension = 1 : i64}"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor<4x?xf32, #stablehlo.bounds<?, 8>>"), std::string::npos) << text;
  EXPECT_NE(text.find("\"stablehlo.get_dimension_size\""), std::string::npos) << text;
  // a static value's size is a constant
  Builder c;
  Value y = c.param(Type{DType::F32, {4, 8}});
  std::string t2 = c.module({c.count(y, {0, 1}, DType::S64)});
  EXPECT_EQ(t2.find("get_dimension_size"), std::string::npos) << t2;
  EXPECT_NE(t2.find("dense<32> : tensor<i64>"), std::string::npos) << t2;
}

TEST(Builder, ScatterNdKeepsTheUpdatesShape) {
  Builder b;
  Value flat = b.param(Type{DType::F32, {16}});
  Value upd = b.param(Type{DType::F32, {2, 3}});
  Value idx = b.param(Type{DType::S64, {2, 3, 1}});
  Value r = b.scatter_nd(flat, idx, upd);
  EXPECT_EQ(r.shape(), (Shape{16}));
  std::string text = b.module({r});
  EXPECT_NE(text.find("index_vector_dim = 2"), std::string::npos) << text;
  EXPECT_THROW(b.scatter_nd(upd, idx, upd), BuildError);
}

// A dynamic value made static again: each dim retyped bounded-dynamic and set to its full size
// (XLA drops the run-time size only for a dim its type says is dynamic).
TEST(Builder, StaticShapeDropsRunTimeSizes) {
  Builder b;
  Value x = b.param(Type{DType::F32, {4, 8}});
  Value n = b.param(Type{DType::S32, {}});
  EXPECT_EQ(b.static_shape(x).id, x.id);  // a static value as it is
  Value s = b.static_shape(b.set_dimension_size(x, n, 1));
  EXPECT_FALSE(s.type.dynamic);
  EXPECT_EQ(s.shape(), (Shape{4, 8}));
  std::string text = b.module({s});
  EXPECT_NE(text.find("-> tensor<?x8xf32, #stablehlo.bounds<4, ?>>"), std::string::npos) << text;
  EXPECT_NE(text.find("-> tensor<4x?xf32, #stablehlo.bounds<?, 8>>"), std::string::npos) << text;
}

TEST(Builder, RowsOfAFlatArray) {
  Builder b;
  Value flat = b.param(Type{DType::F32, {24}});
  Value starts = b.param(Type{DType::S64, {2, 3}});
  Value rows = b.take_rows(flat, starts, 4);
  EXPECT_EQ(rows.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(b.scatter_rows(flat, starts, rows).shape(), (Shape{24}));
  EXPECT_THROW(b.take_rows(flat, starts, 25), BuildError);
  EXPECT_THROW(b.scatter_rows(flat, starts, flat), BuildError);
}

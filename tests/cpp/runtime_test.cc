// Compile-and-run tests against the PJRT plugin named by TORCH_TPU_PJRT_PLUGIN
// (the CPU plugin in CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/engine.h"
#include "hlo/builder.h"
#include "runtime/runtime.h"

using namespace tt;

namespace {
rt::Client& client() {
  const char* p = std::getenv("TORCH_TPU_PJRT_PLUGIN");
  if (!p || !*p) throw std::runtime_error("TORCH_TPU_PJRT_PLUGIN is not set");
  return rt::Client::init(p, "cpu", 2);
}

std::vector<float> run(const std::string& text, const std::vector<std::vector<float>>& inputs,
                       const std::vector<std::vector<int64_t>>& dims, size_t out_n, int device = 0) {
  auto& c = client();
  auto exe = c.compile(text);
  std::vector<rt::BufferPtr> bufs;
  std::vector<PJRT_Buffer*> args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bufs.push_back(c.from_host(inputs[i].data(), PJRT_T_F32, dims[i], device));
    args.push_back(bufs.back()->get());
  }
  auto outs = exe->execute(device, args);
  std::vector<float> r(out_n);
  outs[0]->to_host(r.data(), out_n * sizeof(float));
  return r;
}
}  // namespace

TEST(Runtime, ClientReportsPlatformAndDevices) {
  auto& c = client();
  EXPECT_EQ(c.platform_name(), "cpu");
  EXPECT_EQ(c.num_devices(), 2);
  EXPECT_GE(c.api_minor(), kTtMinPjrtMinor);
}

TEST(Runtime, CompileAndRunBuilderModule) {
  hlo::Builder b;
  auto x = b.param(hlo::Type{hlo::DType::F32, {2, 2}});
  auto y = b.param(hlo::Type{hlo::DType::F32, {2, 2}});
  auto z = b.dot_general(x, y, {{}, {}, {1}, {0}}, hlo::DType::F32);
  auto s = b.reduce(z, b.zeros(hlo::DType::F32, {}), {1}, hlo::op::add);
  auto r = run(b.module({s}), {{1, 2, 3, 4}, {1, 0, 0, 1}}, {{2, 2}, {2, 2}}, 2, 1);
  EXPECT_FLOAT_EQ(r[0], 3);
  EXPECT_FLOAT_EQ(r[1], 7);
}

TEST(Runtime, GatherScatterArgmaxRun) {
  hlo::Builder b;
  auto x = b.param(hlo::Type{hlo::DType::F32, {4}});
  auto idx = b.constant_int(2, hlo::DType::S64, {3});
  auto g = b.take(x, idx, 0);                                   // [x2, x2, x2]
  auto sc = b.scatter(b.zeros(hlo::DType::F32, {4}), b.constant_int(1, hlo::DType::S64, {3, 1}), g, {0}, hlo::op::add);
  auto [mv, mi] = b.reduce_arg(x, 0, true);
  auto out = b.add(sc, b.broadcast_to(b.convert(b.reshape(mi, {1}), hlo::DType::F32), {4}));
  auto r = run(b.module({out}), {{5, 9, 7, 1}}, {{4}}, 4);
  EXPECT_FLOAT_EQ(r[0], 1);   // argmax = 1
  EXPECT_FLOAT_EQ(r[1], 22);  // 3 * 7 + 1
  EXPECT_FLOAT_EQ(r[3], 1);
}

TEST(Runtime, BadProgramIsAnErrorNotACrash) {
  auto& c = client();
  EXPECT_THROW(c.compile("this is not mlir"), rt::Error);
}

TEST(Engine, StridedLoadsAndStores) {
  client();
  using namespace tt::engine;
  auto& e = Engine::get();
  auto st = std::make_shared<Storage>(12 * 4, 0);
  std::vector<float> init(12);
  for (int i = 0; i < 12; ++i) init[i] = static_cast<float>(i);
  View whole{st, 0, {3, 4}, {4, 1}, hlo::DType::F32};
  e.write(whole, init.data());
  // transpose view [4, 3] strides [1, 4]; read it
  View t{st, 0, {4, 3}, {1, 4}, hlo::DType::F32};
  std::vector<float> out(12);
  e.read(t, out.data());
  EXPECT_FLOAT_EQ(out[1], 4);  // t[0][1] = x[1][0]
  EXPECT_FLOAT_EQ(out[3], 1);  // t[1][0] = x[0][1]
  // column slice x[:, 1:3] (padded-strided load), then store 0 into it
  View col{st, 1, {3, 2}, {4, 1}, hlo::DType::F32};
  std::vector<float> c(6);
  e.read(col, c.data());
  EXPECT_FLOAT_EQ(c[0], 1);
  EXPECT_FLOAT_EQ(c[2], 5);
  EXPECT_FLOAT_EQ(c[5], 10);
  auto& g = e.graph(0);
  g.store(col, g.b.zeros(hlo::DType::F32, {3, 2}));
  e.op_done(0);
  e.read(whole, out.data());
  EXPECT_FLOAT_EQ(out[0], 0);
  EXPECT_FLOAT_EQ(out[1], 0);
  EXPECT_FLOAT_EQ(out[3], 3);
  EXPECT_FLOAT_EQ(out[6], 0);
  EXPECT_FLOAT_EQ(out[7], 7);
  // every-other element (step slice)
  View step{st, 0, {6}, {2}, hlo::DType::F32};
  std::vector<float> s(6);
  e.read(step, s.data());
  EXPECT_FLOAT_EQ(s[1], 0);   // x[2] was zeroed
  EXPECT_FLOAT_EQ(s[2], 4);
  EXPECT_FLOAT_EQ(s[5], 10 * 0 + 0);  // x[10] zeroed
}

// Bounded dynamism in the engine: a dynamic storage holds its bucket, views read through
// run-time geometry, and one program serves two sizes of the bucket.
TEST(Engine, DynamicStorageServesItsBucket) {
  client();
  using namespace tt::engine;
  auto& e = Engine::get();
  e.set_mode(Mode::Strict);
  int64_t compiled = 0;
  for (int64_t n : {5, 7}) {  // both in bucket 8
    auto st = std::make_shared<Storage>(3 * n * 4, 0);
    st->dtype = hlo::DType::F32;
    st->typed = true;
    e.make_dynamic(st, {3, n}, {n, 1}, {0, 8});
    EXPECT_EQ(st->elements(), 24);
    std::vector<float> host(3 * n);
    for (int64_t i = 0; i < 3 * n; ++i) host[i] = static_cast<float>(i);
    e.write(View{st, 0, {3, n}, {n, 1}, hlo::DType::F32}, host.data());
    View v = e.dynamic_view(View{st, 0, {3, n}, {n, 1}, hlo::DType::F32});
    EXPECT_TRUE(v.runtime);
    EXPECT_EQ(v.bound, (Shape{0, 8}));
    // out[i] = sum_j x[i, j] over the real n columns, into a 3-element storage
    auto out = std::make_shared<Storage>(3 * 4, 0);
    auto& g = e.graph(0);
    int64_t before = e.metrics.compiles.load();
    Value x = g.load(v);
    g.store(View{out, 0, {3}, {1}, hlo::DType::F32}, g.b.reduce(x, g.b.zeros(hlo::DType::F32, {}), {1}, hlo::op::add));
    e.op_done(0);
    std::vector<float> r(3);
    e.read(View{out, 0, {3}, {1}, hlo::DType::F32}, r.data());
    for (int64_t i = 0; i < 3; ++i) {
      float want = 0;
      for (int64_t j = 0; j < n; ++j) want += static_cast<float>(i * n + j);
      EXPECT_FLOAT_EQ(r[i], want) << "n=" << n << " row " << i;
    }
    if (n == 7) EXPECT_EQ(e.metrics.compiles.load(), before) << "the second size of the bucket compiled";
    compiled += e.metrics.compiles.load() - before;
  }
  EXPECT_LE(compiled, 1);
}

// A dynamic storage of a whole row-major tensor holds it padded at its bounds: host writes and
// reads go through that layout, and every view (a permutation, a merge, a column, another
// element type) reads and writes the elements PyTorch's layout names.
TEST(Engine, PaddedStorageViewsReadAndWriteTheirElements) {
  client();
  using namespace tt::engine;
  auto& e = Engine::get();
  e.set_mode(Mode::Strict);
  const int64_t B = 2, n = 5, D = 3;  // [B, n, D], n dynamic in bucket 8
  auto st = std::make_shared<Storage>(B * n * D * 4, 0);
  st->dtype = hlo::DType::F32;
  st->typed = true;
  e.make_dynamic(st, {B, n, D}, {n * D, D, 1}, {0, 8, 0});
  EXPECT_TRUE(st->padded);
  EXPECT_EQ(st->elements(), B * 8 * D);
  std::vector<float> host(B * n * D);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  e.write(View{st, 0, {B, n, D}, {n * D, D, 1}, hlo::DType::F32}, host.data());
  auto read = [&](const View& v) {
    std::vector<float> r(static_cast<size_t>(hlo::numel(v.sizes)));
    e.read(e.dynamic_view(v), r.data());
    return r;
  };
  EXPECT_EQ(read(View{st, 0, {B, n, D}, {n * D, D, 1}, hlo::DType::F32}), host);
  // the base with its last two dims swapped: [B, D, n]
  std::vector<float> t = read(View{st, 0, {B, D, n}, {n * D, 1, D}, hlo::DType::F32});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(t[(b * D + d) * n + i], host[(b * n + i) * D + d]);
  // [B*n, D]: rows from both batch entries
  EXPECT_EQ(read(View{st, 0, {B * n, D}, {D, 1}, hlo::DType::F32}), host);
  // one column written: x[:, :, 2] = 100 + k
  std::vector<float> col(B * n);
  for (size_t k = 0; k < col.size(); ++k) col[k] = 100.0f + static_cast<float>(k);
  e.write(e.dynamic_view(View{st, 2, {B, n}, {n * D, D}, hlo::DType::F32}), col.data());
  std::vector<float> want = host;
  for (int64_t k = 0; k < B * n; ++k) want[k * D + 2] = col[k];
  EXPECT_EQ(read(View{st, 0, {B, n, D}, {n * D, D, 1}, hlo::DType::F32}), want);
  // the same bytes as int32
  std::vector<int32_t> bits(B * n * D);
  e.read(e.dynamic_view(View{st, 0, {B, n, D}, {n * D, D, 1}, hlo::DType::S32}), bits.data());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::memcmp(&bits[i], &want[i], 4), 0) << i;
  // back to a static storage: the same values in PyTorch's layout
  e.make_static(st);
  EXPECT_FALSE(st->padded);
  EXPECT_EQ(read(View{st, 0, {B, n, D}, {n * D, D, 1}, hlo::DType::F32}), want);
}

// An op that reads a slice and writes it back (x[3] += 1) reads one offset parameter for both,
// so the compiler updates the slice inside the donated buffer; which offsets of an op's views are
// equal is part of its trace key (the program text depends on it).
TEST(Engine, SliceReadAndWrittenBackSharesItsOffsetParameter) {
  client();
  using namespace tt::engine;
  auto& e = Engine::get();
  e.set_mode(Mode::Strict);
  auto st = std::make_shared<Storage>(8 * 16 * 4, 0);
  std::vector<float> init(8 * 16);
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i);
  View whole{st, 0, {8, 16}, {16, 1}, hlo::DType::F32};
  e.write(whole, init.data());
  auto row = [&](int64_t r) { return View{st, r * 16, {16}, {1}, hlo::DType::F32}; };
  // out[to] = in[from] + 1, as one op of a standalone graph; returns its program and key
  auto add_one = [&](int64_t from, int64_t to) {
    Graph g(0);
    Op op;
    op.name = "test::add_one";
    op.keyed = true;
    op.views = {row(from), row(to)};
    e.apply(g, op, [&] {
      g.store(row(to), g.b.add(g.load(row(from)), g.b.constant(1.0, hlo::DType::F32, {16})));
      return lower::Reads{};
    });
    std::string key = g.keys.at(0);
    Program p = e.build(g);
    e.run(p);
    return std::make_pair(std::move(p), key);
  };
  auto [same, same_key] = add_one(3, 3);
  auto scalars = [](const Program& p) {
    return std::count_if(p.params.begin(), p.params.end(),
                         [](const Binding& b) { return b.kind == Binding::Kind::Scalar; });
  };
  EXPECT_EQ(scalars(same), 1) << *same.text;
  EXPECT_EQ(same.donations.size(), 1u);
  auto [other, other_key] = add_one(3, 5);
  EXPECT_EQ(scalars(other), 2) << *other.text;
  EXPECT_NE(same_key, other_key);
  EXPECT_EQ(add_one(6, 6).second, same_key);  // another offset, the same text
  std::vector<float> out(8 * 16);
  e.read(whole, out.data());
  std::vector<float> want = init;
  for (int i = 0; i < 16; ++i) {
    want[3 * 16 + i] += 1;
    want[5 * 16 + i] = want[3 * 16 + i] + 1;
    want[6 * 16 + i] += 1;
  }
  EXPECT_EQ(out, want);
}

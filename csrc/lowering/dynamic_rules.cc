// The rules that run on bucketed values (bounded dynamism): each was checked on OpInfo samples
// with all / the leading / the first dim of its inputs dynamic, built at a larger bound, values
// and gradients against PyTorch on CPU (tests/ops/dynamic_sweep.py --grad --emit-rules prints
// the list; TORCH_TPU_BUCKET_ALL_RULES=1 tries every rule). Left out, because they fail there:
// scatter / index_put / masked_scatter (padded indices), convolution, adaptive pooling,
// reflection / replication pads, upsampling, roll, batch_norm's inference form, LU / Cholesky /
// FFT; and, because they
// fail in tests/python/test_ops.py and test_reliability.py though the sweep passed them:
// pooling (ceil_mode / padding), bucketize and histogram (padded boundaries). Added by hand
// (their OpInfo samples never made a dim dynamic; checked in tests/python/test_bucketing.py,
// test_reductions_the_sweep_missed): all, any.dim, argmax, argmin, bitwise_or, cumsum_; and
// index.Tensor (advanced indexing: its gather keeps the broadcast index dims whole; the sweep
// passes __getitem__ and _unsafe_masked_index with it; test_advanced_indexing_at_a_bucket).
#include <string>
#include <unordered_set>

namespace tt::lower {

const std::unordered_set<std::string>& bucketed_rules() {
  static const std::unordered_set<std::string> rules = {
      "aten::_batch_norm_with_update", "aten::_cdist_forward", "aten::_log_softmax", "aten::_log_softmax_backward_data",
      "aten::_logcumsumexp", "aten::_prelu_kernel", "aten::_softmax", "aten::_softmax_backward_data",
      "aten::abs", "aten::acos", "aten::acosh", "aten::add.Scalar",
      "aten::add.Tensor", "aten::add_.Scalar", "aten::add_.Tensor", "aten::addbmm",
      "aten::addcdiv", "aten::addcmul", "aten::addmm", "aten::addmv",
      "aten::all", "aten::all.dim", "aten::amax", "aten::aminmax", "aten::angle",
      "aten::any", "aten::any.dim", "aten::argmax", "aten::argmin", "aten::bitwise_or.Tensor", "aten::cumsum_", "aten::arange.start_out", "aten::asin", "aten::asinh",
      "aten::atan", "aten::atan2", "aten::atanh",
      "aten::baddbmm", "aten::binary_cross_entropy",
      "aten::binary_cross_entropy_backward", "aten::bitwise_and.Tensor", "aten::bitwise_and_.Tensor", "aten::bitwise_not",
      "aten::bitwise_or_.Tensor", "aten::bmm", "aten::cat",
      "aten::ceil", "aten::channel_shuffle", "aten::clamp", "aten::clamp.Tensor",
      "aten::clamp_", "aten::clamp_max.Tensor", "aten::clamp_min", "aten::clamp_min.Tensor",
      "aten::clamp_min_", "aten::clamp_min_.Tensor", "aten::constant_pad_nd", "aten::copysign.Tensor",
      "aten::cos", "aten::cosh", "aten::cummax", "aten::cummin",
      "aten::cumprod", "aten::cumsum", "aten::digamma", "aten::digamma_",
      "aten::div.Scalar", "aten::div.Tensor", "aten::div.Tensor_mode", "aten::div_.Scalar",
      "aten::div_.Tensor", "aten::dot", "aten::elu", "aten::embedding_dense_backward",
      "aten::eq.Scalar", "aten::eq.Tensor", "aten::erf", "aten::erfc",
      "aten::erfinv", "aten::exp", "aten::exp2", "aten::expm1",
      "aten::fill.Scalar", "aten::fill_.Scalar", "aten::flip", "aten::floor",
      "aten::floor_divide", "aten::floor_divide.Scalar", "aten::fmax", "aten::fmin",
      "aten::fmod.Tensor", "aten::frac", "aten::frexp.Tensor", "aten::gather",
      "aten::ge.Scalar", "aten::ge.Tensor", "aten::gelu", "aten::gelu_backward",
      "aten::gt.Scalar", "aten::gt.Tensor", "aten::hardshrink", "aten::hardsigmoid",
      "aten::hardswish", "aten::hardtanh", "aten::heaviside",
      "aten::huber_loss", "aten::huber_loss_backward", "aten::hypot", "aten::i0",
      "aten::index_fill_.int_Tensor", "aten::index.Tensor", "aten::index_select", "aten::isin.Tensor_Tensor", "aten::isinf",
      "aten::isnan", "aten::isneginf", "aten::isposinf", "aten::kthvalue",
      "aten::le.Scalar", "aten::le.Tensor", "aten::leaky_relu", "aten::lerp.Scalar",
      "aten::lgamma", "aten::linalg_cross", "aten::linalg_vector_norm", "aten::log",
      "aten::log10", "aten::log1p", "aten::log2", "aten::log_sigmoid_backward",
      "aten::log_sigmoid_forward", "aten::logaddexp", "aten::logaddexp2", "aten::logical_and",
      "aten::logical_and_", "aten::logical_not", "aten::logical_not_", "aten::logical_or",
      "aten::logical_or_", "aten::logical_xor", "aten::logit", "aten::logsumexp",
      "aten::lt.Scalar", "aten::lt.Tensor", "aten::lu_unpack", "aten::masked_fill.Scalar",
      "aten::masked_fill.Tensor", "aten::masked_fill_.Scalar", "aten::max", "aten::max.dim",
      "aten::maximum", "aten::mean", "aten::mean.dim",
      "aten::min", "aten::min.dim", "aten::minimum", "aten::mish",
      "aten::mm", "aten::mode", "aten::mse_loss", "aten::mse_loss_backward",
      "aten::mul.Scalar", "aten::mul.Tensor", "aten::mul_.Tensor", "aten::mv",
      "aten::mvlgamma", "aten::nan_to_num", "aten::nanmedian.dim", "aten::narrow_copy",
      "aten::native_batch_norm_backward", "aten::native_dropout_backward", "aten::native_layer_norm", "aten::native_layer_norm_backward",
      "aten::ne.Scalar", "aten::ne.Tensor", "aten::neg", "aten::neg_",
      "aten::nextafter", "aten::nll_loss_backward", "aten::nll_loss_forward", "aten::norm.Scalar",
      "aten::norm.ScalarOpt_dim", "aten::pow.Scalar", "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor",
      "aten::pow_.Scalar", "aten::prod", "aten::prod.dim_int", "aten::reciprocal",
      "aten::relu", "aten::remainder.Scalar", "aten::remainder.Tensor", "aten::renorm",
      "aten::repeat", "aten::round", "aten::round.decimals", "aten::rsqrt",
      "aten::rsub.Scalar", "aten::rsub.Tensor", "aten::sgn", "aten::sigmoid",
      "aten::sigmoid_backward", "aten::sign", "aten::signbit", "aten::silu",
      "aten::sin", "aten::sinc", "aten::sinh", "aten::smooth_l1_loss",
      "aten::smooth_l1_loss_backward", "aten::softplus", "aten::softshrink", "aten::softshrink_backward",
      "aten::sort.stable", "aten::special_entr", "aten::special_erfcx", "aten::special_i0e",
      "aten::special_i1", "aten::special_i1e", "aten::special_log_ndtr", "aten::special_modified_bessel_i0",
      "aten::special_modified_bessel_i1", "aten::special_ndtri", "aten::special_spherical_bessel_j0", "aten::special_xlog1py",
      "aten::sqrt", "aten::sqrt_", "aten::std.correction", "aten::std_mean.correction",
      "aten::sub.Scalar", "aten::sub.Tensor", "aten::sub_.Tensor", "aten::sum",
      "aten::sum.dim_IntList", "aten::tan", "aten::tanh", "aten::tanh_backward",
      "aten::threshold", "aten::threshold_backward", "aten::topk", "aten::trace",
      "aten::tril", "aten::triu", "aten::trunc", "aten::var.correction",
      "aten::var_mean.correction", "aten::vdot", "aten::where.self", "aten::where.self_out",
      "aten::xlogy.Tensor", "aten::zero_",
  };
  return rules;
}

}  // namespace tt::lower

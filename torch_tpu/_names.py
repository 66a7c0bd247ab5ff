"""PyTorch's names of dtypes as its C++ error messages spell them ("Float", "Long")."""
import torch

_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.bfloat16: "BFloat16", torch.float16: "Half",
          torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
          torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
          torch.complex32: "ComplexHalf"}


def dtype_name(dtype):
    return _NAMES.get(dtype, str(dtype))

"""The one jagged-layout helper the Python kernels share (_fbgemm, _torchrec, _flash_attention)."""
import torch


def segments(offsets, count):
    """Positions 0..count-1 of a jagged layout given its complete offsets (segments + 1 entries):
    (position, its segment, whether a segment covers it). Empty segments are skipped; a position
    past offsets[-1] gets the last segment and covered False."""
    position = torch.arange(count, device=offsets.device, dtype=offsets.dtype)
    segment = torch.searchsorted(offsets[1:], position, right=True)
    return position, segment.clamp(max=max(offsets.numel() - 2, 0)), position < offsets[-1:]

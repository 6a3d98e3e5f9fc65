"""Convolutions on the CPU's fast path, the frame convolutions and the sub-pixel upsampler of VRT and RVRT.

The reference networks hold their per-frame convolutions as ``nn.Conv3d`` with a (1, k, k) kernel (so the
released checkpoints store 5-D weights); here they run as one 2-D convolution over all frames at once.

On the CPU, where no gradient is recorded, convolutions run on channels-last activations with a cached
channels-last copy of their weight, and a following activation or residual sum is fused into oneDNN's
convolution (``torch.ops.mkldnn._convolution_pointwise``, what inductor's CPU backend calls): the fused results
are the same bits as the separate ops in float32 (benchmarks/RESULTS.md, "conv-speed"). Training, float64,
other dtypes of the fused steps, autocast and other devices keep the plain ops.
"""

from __future__ import annotations

import functools
import math
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The most one piece of work cut up for the CPU's heap allocates at a time (VRT's upsampling head, RVRT's guided
# attention's samples, each without autograd): glibc maps every block above its mmap threshold, which tops out at 32
# MiB, afresh and faults it in page by page on every call; at half of that a freed piece's memory is taken again by
# the next (benchmarks/RESULTS.md, "Issue 29 on the Intel Xeon again" and "Issue 29 on the Intel Xeon, session 14").
CPU_HEAP_PIECE_BYTES = 16 * 2**20


@functools.cache
def nchw_trains_faster() -> bool:
    """True on CPUs whose widest vector unit is AVX2 (``torch.backends.cpu.get_cpu_capability()``): there oneDNN's
    channels-last convolution backward, the weight gradient above all, runs 1.2-3x slower than on NCHW, more than
    channels-last saves in the forward (AMD EPYC, AVX2: VRT's 64 -> 64 head convolution at 256 x 256, forward and
    backward, 156 ms NCHW against 212 ms channels-last; benchmarks/RESULTS.md, "Training layout on AVX2"). On
    AVX-512 CPUs channels-last is the faster layout both ways (Intel Xeon, "BasicVSR++ and RVRT against their
    references")."""
    return torch.backends.cpu.get_cpu_capability() == 'AVX2'


def conv_layout(x: Tensor) -> Tensor:
    """``x`` (N, C, H, W) in the memory layout its convolutions run fastest on: channels-last on the CPU (oneDNN
    reorders NCHW inputs on every call; its convolutions run 1.1-2x faster on channels-last, benchmarks/RESULTS.md
    "BasicVSR++ and RVRT against their references"), except where gradients are recorded on a CPU on which NCHW
    trains faster (:func:`nchw_trains_faster`); as it is elsewhere and for float64 (no oneDNN kernel).
    Convolutions keep the layout of their input, so only concatenations need it set again."""
    if x.device.type != 'cpu' or x.dtype == torch.float64:
        return x
    if torch.is_grad_enabled() and nchw_trains_faster():
        return x.contiguous()
    return x.contiguous(memory_format=torch.channels_last)


def in_graph() -> bool:
    """True while a tracer, compiler or exporter records a graph (``torch.jit.trace``, ``torch.compile``,
    ``torch.export``, the ONNX export): eager-only shortcuts (frame loops, kept buffers, in-place steps) stand
    aside so the graph keeps the plain ops."""
    return (torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
            or torch.onnx.is_in_onnx_export())


def eager_no_grad() -> bool:
    """True where no gradient is recorded and no graph is being recorded (:func:`in_graph`): ``out=`` writes,
    in-place steps and cached tensors are then safe."""
    return not (torch.is_grad_enabled() or in_graph())


def cat_layout(tensors: list[Tensor], dim: int = 1) -> Tensor:
    """``conv_layout(torch.cat(tensors, dim))`` in one pass where no gradient is recorded: on the CPU the pieces are
    copied straight into a channels-last tensor (``cat`` of mixed layouts, then the reorder, copies twice). Autograd
    does not record ``cat(..., out=)``, so with gradients the two steps stay."""
    first = tensors[0]
    if not eager_no_grad() or first.device.type != 'cpu' or first.dtype == torch.float64 or first.dim() != 4:
        return conv_layout(torch.cat(tensors, dim))
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    out = torch.empty(shape, dtype=first.dtype, device=first.device, memory_format=torch.channels_last)
    return torch.cat(tensors, dim, out=out)


def fast_weight(conv: nn.Conv2d | nn.Conv3d, x: Tensor) -> Tensor | None:
    """The channels-last 4-D copy of ``conv``'s weight (a Conv3d's (C_out, C_in, 1, k, k) squeezed) that ``x`` runs
    on, or None where the plain op must run: gradients recorded or a tracer looking (:func:`eager_no_grad`), not the
    CPU, float64, an input of another dtype or not channels-last, a padding mode other than zeros.

    oneDNN otherwise reorders the weight on every call (about 2% of BasicVSR++'s CPU forward). The copy, kept in
    the module, is refreshed when the weight changes (its version counter, storage or dtype), so optimizer steps,
    the EMA update and ``load_state_dict`` are seen; the parameter stays contiguous (state dicts, safetensors). A
    write through ``weight.data`` bypasses the version counter: code that edits ``.data`` after an inference call
    must drop the copy (``conv.__dict__.pop('_weight_cl', None)``)."""
    w = conv.weight
    if (not eager_no_grad() or x.device.type != 'cpu' or x.dtype != w.dtype or w.dtype == torch.float64
            or conv.padding_mode != 'zeros' or isinstance(conv.padding, str)
            or not x.is_contiguous(memory_format=torch.channels_last)):
        return None
    key = (w._version, w.data_ptr(), w.dtype)
    cached = conv.__dict__.get('_weight_cl')
    if cached is None or cached[0] != key:
        w4 = w.detach().squeeze(2) if w.dim() == 5 else w.detach()
        cached = (key, w4.contiguous(memory_format=torch.channels_last))
        conv.__dict__['_weight_cl'] = cached
    return cached[1]


def _fusable(conv: nn.Module, x: Tensor, weight: Tensor | None) -> bool:
    """Where oneDNN's fused convolution gives the separate ops' bits: float32 outside autocast (in bf16 the fused
    activation would see the unrounded sum), with oneDNN on; and where no forward hook waits for the convolution
    module's call (feature taps, tests), which the fused call would skip."""
    return (weight is not None and x.dtype == torch.float32 and not torch.is_autocast_enabled('cpu')
            and torch.backends.mkldnn.enabled and not (conv._forward_hooks or conv._forward_pre_hooks
                                                       or nn.modules.module._global_forward_hooks
                                                       or nn.modules.module._global_forward_pre_hooks))


def _geometry(conv: nn.Conv2d | nn.Conv3d) -> tuple[list[int], list[int], list[int]]:
    """Padding, stride and dilation of the 2-D convolution a Conv2d (or a Conv3d with a temporal kernel of 1) runs."""
    return tuple(list(v[-2:]) for v in (conv.padding, conv.stride, conv.dilation))  # type: ignore[return-value]


def _unfused(conv: nn.Conv2d | nn.Conv3d, x: Tensor) -> Tensor:
    """The convolution alone, where the fused call is not taken: the module's own call for a Conv2d (its hooks see
    it), :func:`frame_conv` for a Conv3d."""
    return conv(x) if isinstance(conv, nn.Conv2d) else frame_conv(x, conv)


def conv_act(conv: nn.Conv2d | nn.Conv3d, x: Tensor, negative_slope: float = 0.0) -> Tensor:
    """``leaky_relu(conv(x), negative_slope)`` (``relu`` for a slope of 0), the activation written in place on the
    convolution's output; on the CPU's fast path (:func:`fast_weight`) in float32, one fused oneDNN call.

    Args:
        conv: a :class:`Conv2d`, :class:`FrameConv` or Conv3d with a temporal kernel of 1.
        x: (N, C_in, H, W); a Conv3d's frames batched into N.

    Returns:
        (N, C_out, H', W').
    """
    weight = fast_weight(conv, x)
    if _fusable(conv, x, weight):
        attr, scalars = ('relu', []) if negative_slope == 0 else ('leaky_relu', [negative_slope])
        padding, stride, dilation = _geometry(conv)
        return torch.ops.mkldnn._convolution_pointwise(x, weight, conv.bias, padding, stride, dilation, conv.groups,
                                                       attr, scalars, '')
    y = _unfused(conv, x)
    return F.relu(y, inplace=True) if negative_slope == 0 else F.leaky_relu(y, negative_slope, inplace=True)


def conv_add_(conv: nn.Conv2d | nn.Conv3d, x: Tensor, residual: Tensor) -> Tensor:
    """``residual + conv(x)``; where no gradient is recorded, written into ``residual`` (which must be the caller's
    own: it is overwritten), on the CPU's fast path in float32 as one fused oneDNN call (the sum as a post-op).
    With gradients, a new tensor in ``residual``'s layout.

    Args:
        conv: as :func:`conv_act`.
        x: (N, C_in, H, W).
        residual: (N, C_out, H', W').

    Returns:
        (N, C_out, H', W'): ``residual`` itself where no gradient is recorded (see :func:`add_into`).
    """
    weight = fast_weight(conv, x)
    if (_fusable(conv, x, weight) and residual.dtype == torch.float32
            and residual.is_contiguous(memory_format=torch.channels_last)):
        padding, stride, dilation = _geometry(conv)
        return torch.ops.mkldnn._convolution_pointwise_.binary(residual, x, weight, conv.bias, padding, stride,
                                                               dilation, conv.groups, 'add', None, None, [], None)
    return add_into(residual, _unfused(conv, x))


def add_into(a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` (in ``a``'s layout), written into ``a`` (the caller's own) where no gradient is recorded and the sum
    keeps ``a``'s dtype and shape; the same bits either way."""
    if eager_no_grad() and torch.promote_types(a.dtype, b.dtype) == a.dtype and a.shape == b.shape:
        return a.add_(b)
    return a + b


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters and state-dict names) on the CPU's fast path where no gradient is recorded:
    channels-last inputs run on a cached channels-last copy of the weight (:func:`fast_weight`). Training uses the
    parameter directly, so gradients are untouched."""

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, C_in, H, W) -> (N, C_out, H', W')."""
        weight = fast_weight(self, x)
        return super().forward(x) if weight is None else self._conv_forward(x, weight, self.bias)


class FrameConv(nn.Conv3d):
    """A Conv3d with kernel (1, 3, 3) (reference parameter shape) run as a 2-D convolution on all frames.

    Input and output are frame-batched: (B * D, C, H, W).
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=(1, 3, 3), padding=(0, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B * D, C_in, H, W) -> (B * D, C_out, H, W)."""
        return frame_conv(x, self)


def frame_conv(x: Tensor, conv: nn.Conv3d) -> Tensor:
    """Apply a Conv3d whose temporal kernel size is 1 to every frame, as one 2-D convolution.

    Args:
        x: (B * T, C_in, H, W) frame-batched input.
        conv: Conv3d with kernel (1, kh, kw) (the reference's parameter layout).

    Returns:
        (B * T, C_out, H', W').
    """
    weight = fast_weight(conv, x)
    if weight is None:
        weight = conv.weight.squeeze(2)
    return F.conv2d(x, weight, conv.bias, stride=conv.stride[1:], padding=conv.padding[1:],
                    dilation=conv.dilation[1:], groups=conv.groups)


# Upsample modules holding a shuffle buffer, so that a call that records gradients (a training step) releases them all,
# the EMA copy's and other networks' included.
_HOLDERS: weakref.WeakSet[Upsample] = weakref.WeakSet()


def release_upsample_buffers() -> None:
    """Drop every :class:`Upsample`'s shuffle buffer (the memory goes back at once; the next call allocates anew)."""
    for module in list(_HOLDERS):
        module.__dict__.pop('_shuffle_buffer', None)
    _HOLDERS.clear()


class Upsample(nn.Module):
    """Sub-pixel upsampler on frame-batched features, ``scale`` in {2^n, 3}.

    Convolutions are registered under the indices of the reference's ``nn.Sequential`` (0, 5, 10, ... with
    the final 64 -> 64 convolution last), so checkpoints load unchanged.

    Where no gradient is recorded, on the CPU's fast path (float32, channels-last), each pixel shuffle writes into a
    buffer the module keeps between calls instead of a new tensor: the shuffled activation is the head's largest
    (64 channels at the output resolution, 16 MiB a frame of VRT's tiny benchmark clip), and glibc maps a block
    above its mmap threshold afresh on every call, so each call faulted in new pages (24k for the tiny clip's six
    frames at once; benchmarks/RESULTS.md, "VRT speed by profiling, session 6"). The buffer only feeds the next
    convolution of the same call (the output is a new tensor), so callers see the same values and bits.
    **Memory:** the buffer holds the largest shuffled activation since its last release, ``frames x num_feat x sH x
    sW`` floats: one group of frames of VRT's head (at most :data:`models.network_vrt.CPU_HEAD_CHUNK_BYTES`, or one
    frame where a frame is larger), one frame of RVRT's. It stays resident between calls, and is released by
    ``train()``, by any call that records gradients (of any Upsample: a training step frees the EMA copy's buffer
    too) and by :func:`release_upsample_buffers`; a larger activation replaces it. One module must not be called
    from several threads at once.

    Args:
        scale: upscaling factor.
        num_feat: channels in and out.
    """

    def __init__(self, scale: int, num_feat: int) -> None:
        super().__init__()
        if scale & (scale - 1) == 0:
            steps = [2] * int(math.log2(scale))
        elif scale == 3:
            steps = [3]
        else:
            raise ValueError(f'Upsample scale {scale} is not supported; use a power of 2 or 3')
        self.factors = tuple(steps)
        for i, f in enumerate(steps):
            self.add_module(str(5 * i), FrameConv(num_feat, f * f * num_feat))
        self.add_module(str(5 * len(steps)), FrameConv(num_feat, num_feat))

    def train(self, mode: bool = True) -> Upsample:
        """Also drops the shuffle buffer (inference-only memory) when switched to training."""
        if mode:
            self.__dict__.pop('_shuffle_buffer', None)
        return super().train(mode)

    def _shuffled(self, x: Tensor, f: int) -> Tensor:
        """``pixel_shuffle(x, f)`` of a channels-last ``x`` (N, C f^2, H, W), written into the kept buffer: a
        channels-last (N, C, fH, fW) view of it, the same values."""
        n, c4, h, w = x.shape
        c = c4 // (f * f)
        need = x.numel()
        buf = self.__dict__.get('_shuffle_buffer')
        if buf is None or buf.numel() < need or buf.dtype != x.dtype or buf.device != x.device:
            self.__dict__.pop('_shuffle_buffer', None)  # the old one goes before the new one is allocated
            buf = self.__dict__['_shuffle_buffer'] = torch.empty(need, dtype=x.dtype, device=x.device)
            _HOLDERS.add(self)
        out = buf[:need].view(n, h * f, w * f, c)  # NHWC storage of the shuffled (N, C, fH, fW)
        # out[n, h f + i, w f + j, c] = x[n, c f^2 + i f + j, h, w]
        out.view(n, h, f, w, f, c).copy_(x.permute(0, 2, 3, 1).view(n, h, w, c, f, f).permute(0, 1, 4, 2, 5, 3))
        return out.permute(0, 3, 1, 2)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B * D, C, H, W) -> (B * D, C, sH, sW)."""
        if torch.is_grad_enabled() and not in_graph():
            release_upsample_buffers()  # training: inference-only memory goes back (eager Python, not traced)
        for i, f in enumerate(self.factors):
            conv = self.get_submodule(str(5 * i))
            if eager_no_grad():  # the activation fused into the convolution, before the shuffle (the same values)
                x = conv_act(conv, x, 0.1)
                keep = (x.device.type == 'cpu' and x.dtype == torch.float32
                        and x.is_contiguous(memory_format=torch.channels_last))
                x = self._shuffled(x, f) if keep else F.pixel_shuffle(x, f)
            else:  # in place: the shuffled activation is the head's largest (64 channels at the output resolution),
                # and neither pixel_shuffle's backward nor leaky_relu's (from its output, slope > 0) needs it kept
                x = F.leaky_relu_(F.pixel_shuffle(conv(x), f), 0.1)
        return self.get_submodule(str(5 * len(self.factors)))(x)

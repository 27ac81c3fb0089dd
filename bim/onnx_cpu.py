"""A 2D network run by ONNX Runtime on the CPU, for inference on CPUs without native bf16.

On such CPUs (AVX2 without AVX512-BF16 or AMX) the U-Net runs in fp32, where ONNX Runtime's convolutions are about
1.5-1.9x faster than torch's (``tools/benchmark_inference.py --cpu_backend``). :class:`OnnxRuntimeNetwork` exports the
network once with MONAI's :func:`~monai.networks.utils.convert_to_onnx` (batch, height and width dynamic) and
exports it again when its weights change. ``onnx`` and ``onnxruntime`` are optional: :func:`onnxruntime_available`
says whether both import.
"""

from __future__ import annotations

import importlib.util
import itertools
import warnings

import torch

# the traced graph holds for inputs whose height and width are multiples of this (the U-Net's 4 down-samplings: no
# decoder block pads, so the trace records no padding)
ONNX_SIZE_MULTIPLE = 16


def onnxruntime_available() -> bool:
    """Whether ``onnx`` (to export) and ``onnxruntime`` (to run) are installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))


def weights_version(network: torch.nn.Module) -> tuple:
    """A key that changes whenever a parameter or buffer of ``network`` is replaced or updated in place (an optimiser
    step, ``load_state_dict``): each tensor's storage address and version counter."""
    return tuple((t.data_ptr(), t._version) for t in itertools.chain(network.parameters(), network.buffers()))


class OnnxRuntimeNetwork:
    """``network`` (a module mapping [N, C, H, W] to [N, C_out, H, W], H and W multiples of
    :data:`ONNX_SIZE_MULTIPLE`) in eval mode, run by ONNX Runtime's CPU provider in fp32 with torch's number of
    threads. ``__call__`` takes and gives fp32 CPU tensors. The export (about 2 s for the paper's U-Net) happens at
    the first call and again after the weights change (:func:`weights_version`)."""

    def __init__(self, network: torch.nn.Module, in_channels: int) -> None:
        if not onnxruntime_available():
            raise RuntimeError("cpu_backend 'onnxruntime' needs the packages onnx and onnxruntime "
                               "(pip install onnx onnxruntime), or set cpu_backend to torch")
        self.network, self.in_channels = network, int(in_channels)
        self.session, self.version = None, None

    def _export(self):
        import onnxruntime
        from monai.networks.utils import convert_to_onnx

        was_training = self.network.training
        sample = torch.zeros(1, self.in_channels, 4 * ONNX_SIZE_MULTIPLE, 4 * ONNX_SIZE_MULTIPLE)
        axes = {0: "batch", 2: "height", 3: "width"}
        try:
            with warnings.catch_warnings():
                # the decoder's test whether a block must pad becomes a constant of the trace: no pad, which holds
                # for every size that is a multiple of ONNX_SIZE_MULTIPLE (the only sizes __call__ takes)
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                model = convert_to_onnx(self.network.eval(), [sample], input_names=["image"], output_names=["logits"],
                                        dynamic_axes={"image": axes, "logits": axes}, use_trace=True, dynamo=False)
        finally:
            self.network.train(was_training)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
        return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.shape[-1] % ONNX_SIZE_MULTIPLE or x.shape[-2] % ONNX_SIZE_MULTIPLE:
            raise ValueError(f"OnnxRuntimeNetwork takes CPU slices of sizes that are multiples of {ONNX_SIZE_MULTIPLE}, "
                             f"got {tuple(x.shape)} on {x.device}")
        version = weights_version(self.network)
        if self.session is None or version != self.version:
            self.session, self.version = self._export(), version
        image = x.detach().float().contiguous().numpy()
        return torch.from_numpy(self.session.run(None, {"image": image})[0])

"""NUGGET on OpenVINO / ONNX Runtime (`--precision int8`, `--backend`): the encoder's pass over a batch,
exported once through inference_backends (the same engines, cache under `$DOCEMBED_HOME/inference/` and
messages as sbert), returns layer l's states (what the scorer reads) beside the last layer's (what the
nuggets are taken from). Selection, W_V and MaxSim stay in PyTorch, unchanged (`NuggetModel.from_states`).
A model with feedback changes layer l's states by its own selection, so no single pass holds them: such a
model runs in PyTorch only.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from docembed.models import inference_backends
from docembed.models.base import NotSupportedError

STATES_VERSION = 1  # bump when the exported graph changes, so cached exports are rebuilt
CALIBRATION_BATCH = 8


class EncoderStates(torch.nn.Module):
    """input ids, attention mask -> [layer l's states | the last layer's states] (batch, tokens, 2d)."""

    def __init__(self, network):
        super().__init__()
        self.network = network

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        bottom, mask = self.network.bottom_states(input_ids, attention_mask)
        top = self.network.upper_states(bottom, mask)
        return inference_backends.HiddenStates(torch.cat([bottom, top.to(bottom.dtype)], dim=-1))


def check_exportable(network) -> None:
    if network.config.feedback:
        raise NotSupportedError(
            "--backend/--precision: this nugget model has feedback (its selection changes layer "
            f"{network.config.scorer_layer}'s states), so it runs in PyTorch only"
        )


def weights_fingerprint(network) -> str:
    """The exported pass's identity: the encoder's weights and the layer the scorer reads."""
    tag = f"nugget-states-{STATES_VERSION}:{network.config.scorer_layer}"
    return inference_backends.module_fingerprint(network.backbone, tag)


class StatesRunner:
    """The exported pass of one NuggetModel: `states(input_ids, attention)` -> (layer l's, the last's)."""

    def __init__(self, network, calibration: Iterator[tuple], backend: str, precision: str):
        check_exportable(network)
        self.dim = network.backbone.hidden_size
        batches = (_features(ids, mask) for ids, mask in calibration)
        self.run = inference_backends.build_runner(
            EncoderStates(network).eval(),
            backend,
            precision,
            weights_fingerprint(network),
            batches if precision == "int8" else [next(batches)],
        )

    def states(self, input_ids: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = torch.from_numpy(np.ascontiguousarray(self.run(_features(input_ids, attention))))
        return both[..., : self.dim], both[..., self.dim :]


def _features(input_ids: torch.Tensor, attention: torch.Tensor) -> dict[str, np.ndarray]:
    return {"input_ids": input_ids.cpu().numpy(), "attention_mask": attention.cpu().numpy()}


def calibration_batches(encoder) -> Iterator[tuple]:
    """inference_backends' calibration text, cut and padded as the encoder cuts and pads a batch."""
    ids = encoder.tokenize(inference_backends.calibration_texts())
    for _, input_ids, attention in encoder.padded_batches(ids, CALIBRATION_BATCH):
        yield input_ids, attention

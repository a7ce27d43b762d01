"""The student on OpenVINO / ONNX Runtime (`--precision int8`, `--backend`): its Longformer's inference pass,
sliding-window attention included, exported once through inference_backends (the same engines, cache under
`$DOCEMBED_HOME/inference/` and messages as sbert and nugget). The graph is local_attention's
BlockedLongformer, which holds for every batch and length once a batch is padded to whole blocks; pooling and
normalisation stay in the family's code.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from docembed.models import inference_backends
from docembed.models.local_attention import BlockedLongformer, whole_blocks

STATES_VERSION = 1  # bump when the exported graph changes, so cached exports are rebuilt
CALIBRATION_DOCUMENTS = 8  # calibration paragraphs joined into this many long documents
CALIBRATION_BATCH = 2


class LongformerStates(torch.nn.Module):
    """input ids, attention mask (a length in whole blocks) -> the last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.blocked = BlockedLongformer(model)

    def forward(self, input_ids, attention_mask):
        return inference_backends.HiddenStates(self.blocked(input_ids, attention_mask))


class HiddenStatesRunner:
    """The exported pass of one student's Longformer: `hidden(input_ids, attention)` -> the last layer's
    states, for any batch (padded here to whole blocks and cut back)."""

    def __init__(self, model, calibration: Iterator[tuple], backend: str, precision: str):
        self.multiple = whole_blocks(model)
        self.pad_id = int(model.config.pad_token_id)
        batches = (self._features(ids, mask) for ids, mask in calibration)
        self.run = inference_backends.build_runner(
            LongformerStates(model).eval(),
            backend,
            precision,
            inference_backends.module_fingerprint(model, f"student-states-{STATES_VERSION}"),
            batches if precision == "int8" else [next(batches)],
        )

    def hidden(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        states = self.run(self._features(input_ids, attention))
        return torch.from_numpy(np.ascontiguousarray(states[:, : input_ids.shape[1]]))

    def _features(self, input_ids: torch.Tensor, attention: torch.Tensor) -> dict[str, np.ndarray]:
        extra = -input_ids.shape[1] % self.multiple
        ids = torch.nn.functional.pad(input_ids.cpu(), (0, extra), value=self.pad_id)
        mask = torch.nn.functional.pad(attention.cpu(), (0, extra))
        return {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}


def calibration_batches(encoder) -> Iterator[tuple]:
    """inference_backends' calibration paragraphs joined into long documents (the lengths the student reads),
    tokenised and padded as the encoder pads a batch."""
    from docembed.tensors import pad_sequences

    paragraphs = inference_backends.calibration_texts()
    size = -(-len(paragraphs) // CALIBRATION_DOCUMENTS)
    documents = [" ".join(paragraphs[i : i + size]) for i in range(0, len(paragraphs), size)]
    ids = encoder.tokenize(documents)
    for start in range(0, len(ids), CALIBRATION_BATCH):
        yield pad_sequences(ids[start : start + CALIBRATION_BATCH], encoder.pad_id)

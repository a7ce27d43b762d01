"""Weight-space interpolation of a fine-tuned model with the model it started from (WiSE-FT, Wortsman et al.,
CVPR 2022): `weight * tuned + (1 - weight) * start`, tensor by tensor. Fine-tuning on one kind of text can
move a model away from what its starting point did well on other kinds; the interpolation keeps part of
both at no training cost, and its weight is chosen on validation tasks like any other setting. Tried on the
student for issue 35 (bench/results/student/interpolation.md: level on its test side, not shipped)."""

from __future__ import annotations

import torch

from docembed.errors import DocembedError, UsageError


def interpolate_weights(tuned, start, weight: float) -> None:
    """Set the weights of `tuned` (an Encoder, or a docembed.Model) to `weight * tuned + (1 - weight) *
    start` in place. Both must be of one family and hold tensors of the same names and shapes; tensors that
    are not floating point (position ids, ...) must be equal and are kept."""
    if not 0.0 <= weight <= 1.0:
        raise UsageError(f"the interpolation weight must be in [0, 1], not {weight}")
    tuned, start = getattr(tuned, "encoder", tuned), getattr(start, "encoder", start)
    if tuned.family != start.family:
        raise DocembedError(f"cannot interpolate a {tuned.family} model with a {start.family} model")
    mine, theirs = tuned.weights_module.state_dict(), start.weights_module.state_dict()
    if mine.keys() != theirs.keys():
        missing = sorted(mine.keys() ^ theirs.keys())[0]
        raise DocembedError(f"the two models hold different tensors (first: {missing!r})")
    done = set()  # tied tensors appear under two names: mix their storage once
    with torch.no_grad():
        for name, tensor in mine.items():
            other = theirs[name].to(tensor.device)
            if tensor.shape != other.shape:
                shapes = f"{tuple(tensor.shape)} in one model, {tuple(other.shape)} in the other"
                raise DocembedError(f"{name} is {shapes}")
            if tensor.data_ptr() in done:
                continue
            done.add(tensor.data_ptr())
            if torch.equal(tensor, other):
                # w * x + (1 - w) * x is not always x in floating point: a tensor neither model changed
                # (frozen embeddings) stays bit for bit the base's, so the zoo need not ship it
                continue
            if tensor.is_floating_point():
                mixed = weight * tensor.float() + (1.0 - weight) * other.float()
                tensor.copy_(mixed.to(tensor.dtype))
            else:  # not floating point, and not equal
                raise DocembedError(f"{name} differs between the two models and cannot be interpolated")

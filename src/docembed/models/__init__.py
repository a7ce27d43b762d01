"""The model zoo: one module per family behind the `Encoder` interface (see base.py, registry.py)."""

from docembed.models.base import Encoder, EncoderConfig
from docembed.models.registry import available_models, load_model

__all__ = ["Encoder", "EncoderConfig", "available_models", "load_model"]

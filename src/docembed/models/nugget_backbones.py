"""NUGGET's backbones: the encoder-decoder pairs models/nugget.py selects nuggets from, behind one small
interface (embed, run_layer, finish, decode), and their warm start."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from docembed.errors import DocembedError


def _hf_config(values: dict[str, Any]):
    from transformers import CONFIG_MAPPING

    values = {k: v for k, v in values.items() if k not in ("transformers_version",)}
    return CONFIG_MAPPING[values["model_type"]].from_dict(values)


def _padding_mask(hf_config, hidden: torch.Tensor, attention_mask: torch.Tensor):
    """The encoder self-attention padding mask in the form the configured attention implementation wants
    (bool for sdpa, additive float for eager), built by transformers itself."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=hf_config, inputs_embeds=hidden, attention_mask=attention_mask)


class BertBackbone(nn.Module):
    """BERT2BERT: a BertModel encoder and a BertLMHeadModel decoder with cross-attention."""

    labels_drop_first = True  # targets are [CLS] x [SEP]; [CLS] is the decoder's start token

    def __init__(self, encoder, decoder, tokenizer):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.start_id = tokenizer.cls_token_id
        self.end_id = tokenizer.sep_token_id
        self.pad_id = tokenizer.pad_token_id

    @classmethod
    def from_configs(cls, encoder_config: dict, decoder_config: dict, tokenizer) -> BertBackbone:
        from transformers import BertLMHeadModel, BertModel

        return cls(
            BertModel(_hf_config(encoder_config), add_pooling_layer=False),
            BertLMHeadModel(_hf_config(decoder_config)),
            tokenizer,
        )

    @classmethod
    def from_pretrained(cls, path: str, decoder_layers: int | None, tokenizer) -> BertBackbone:
        from transformers import BertLMHeadModel, BertModel

        encoder = BertModel.from_pretrained(path, add_pooling_layer=False)
        extra = {"num_hidden_layers": decoder_layers} if decoder_layers else {}
        decoder = BertLMHeadModel.from_pretrained(path, is_decoder=True, add_cross_attention=True, **extra)
        return cls(encoder, decoder, tokenizer)

    def configs(self) -> tuple[dict, dict]:
        return self.encoder.config.to_dict(), self.decoder.config.to_dict()

    @property
    def hidden_size(self) -> int:
        return self.encoder.config.hidden_size

    @property
    def max_positions(self) -> int:
        return self.encoder.config.max_position_embeddings

    @property
    def vocab_size(self) -> int:
        return self.decoder.config.vocab_size

    @property
    def encoder_stack(self) -> nn.Module:
        return self.encoder

    @property
    def embeddings(self) -> nn.Module:
        return self.encoder.embeddings

    @property
    def layers(self) -> nn.ModuleList:
        return self.encoder.encoder.layer

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder.embeddings(input_ids=input_ids)

    def encoder_mask(self, hidden: torch.Tensor, attention_mask: torch.Tensor):
        return _padding_mask(self.encoder.config, hidden, attention_mask)

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = layer(hidden, mask)
        return out[0] if isinstance(out, tuple) else out

    def finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def decode(self, input_ids, nuggets, cross_mask, past=None, use_cache=False):
        out = self.decoder(
            input_ids=input_ids,
            encoder_hidden_states=nuggets,
            encoder_attention_mask=cross_mask,
            past_key_values=past,
            use_cache=use_cache,
        )
        return out.logits, out.past_key_values


class BartBackbone(nn.Module):
    """BART / mBART through transformers' *ForConditionalGeneration model."""

    labels_drop_first = False  # targets are <s> x </s>; the decoder starts from decoder_start_token_id

    def __init__(self, model, tokenizer):
        super().__init__()
        self.model = model
        config = model.config
        self.start_id = config.decoder_start_token_id
        self.end_id = config.eos_token_id
        self.pad_id = config.pad_token_id

    @classmethod
    def from_configs(cls, encoder_config: dict, decoder_config: dict, tokenizer) -> BartBackbone:
        from transformers import AutoModelForSeq2SeqLM

        return cls(AutoModelForSeq2SeqLM.from_config(_hf_config(encoder_config)), tokenizer)

    @classmethod
    def from_pretrained(cls, path: str, decoder_layers: int | None, tokenizer) -> BartBackbone:
        from transformers import AutoModelForSeq2SeqLM

        return cls(AutoModelForSeq2SeqLM.from_pretrained(path), tokenizer)

    def configs(self) -> tuple[dict, dict]:
        return self.model.config.to_dict(), {}

    @property
    def _encoder(self):
        return self.model.get_encoder()

    @property
    def hidden_size(self) -> int:
        return self.model.config.d_model

    @property
    def max_positions(self) -> int:
        return self.model.config.max_position_embeddings

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def encoder_stack(self) -> nn.Module:
        return self._encoder

    @property
    def embeddings(self) -> nn.Module:
        encoder = self._encoder
        return nn.ModuleList([encoder.embed_tokens, encoder.embed_positions, encoder.layernorm_embedding])

    @property
    def layers(self) -> nn.ModuleList:
        return self._encoder.layers

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        encoder = self._encoder
        tokens = encoder.embed_tokens(input_ids)
        positions = encoder.embed_positions(tokens[:, :, -1]).to(tokens.device)  # shape-only argument
        hidden = encoder.layernorm_embedding(tokens + positions)
        return nn.functional.dropout(hidden, p=encoder.dropout, training=encoder.training)

    def encoder_mask(self, hidden: torch.Tensor, attention_mask: torch.Tensor):
        return _padding_mask(self.model.config, hidden, attention_mask)

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = layer(hidden, mask)
        return out[0] if isinstance(out, tuple) else out

    def finish(self, hidden: torch.Tensor) -> torch.Tensor:
        norm = getattr(self._encoder, "layer_norm", None)  # mBART is pre-LN: a final norm
        return norm(hidden) if norm is not None else hidden

    def decode(self, input_ids, nuggets, cross_mask, past=None, use_cache=False):
        decoder = self.model.get_decoder()
        out = decoder(
            input_ids=input_ids,
            encoder_hidden_states=nuggets,
            encoder_attention_mask=cross_mask,
            past_key_values=past,
            use_cache=use_cache,
        )
        logits = self.model.lm_head(out.last_hidden_state)
        bias = getattr(self.model, "final_logits_bias", None)
        return (logits + bias.to(logits.dtype) if bias is not None else logits), out.past_key_values


BACKBONES = {"bert": BertBackbone, "bart": BartBackbone}


def backbone_path(backbone: str) -> str:
    """Where the weights of `backbone` live: "minilm" is the offline all-MiniLM-L6-v2 BERT checkpoint."""
    if backbone == "minilm":
        from docembed.models.offline import minilm_path

        return str(minilm_path())
    return backbone


def load_tokenizer(source):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as error:
        raise DocembedError(f"cannot load a tokenizer from {source}: {error}") from None

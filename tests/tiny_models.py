"""Tiny models built from configs for tests: a 2-layer 32-d BERT with MiniLM's tokenizer, and a docembed sbert
model over it (mean pooling)."""

from pathlib import Path

import torch


def save_tiny_bert(directory: Path, max_positions: int) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertModel

    from docembed.models.offline import minilm_path

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(directory)
    return directory


def save_tiny_sbert(bert_dir: Path, directory: Path, max_seq_length: int) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from docembed.models.sbert import ST_SUBDIR, SBertConfig, SBertEncoder

    word = Transformer(str(bert_dir), max_seq_length=max_seq_length)
    SentenceTransformer(modules=[word, Pooling(32)]).save(str(directory / ST_SUBDIR))
    SBertEncoder(SBertConfig(model_name_or_path=str(directory / ST_SUBDIR))).save(directory)
    return directory

"""Tiny models built from configs for tests: a 2-layer 32-d BERT with MiniLM's tokenizer, a docembed sbert
model over it (mean pooling), and a tiny NUGGET (BERT2BERT). The saved ones are built once per session by the
fixtures in conftest.py; NUGGET is built in memory, fresh per test, because most of its tests train or
change it."""

from pathlib import Path

import torch

# The tiny BERT's position table, so also the sbert model's window: short enough that the student tests
# read documents past it, long enough for a few words.
TINY_POSITIONS = 32


def save_tiny_bert(directory: Path, max_positions: int = TINY_POSITIONS) -> Path:
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


def save_tiny_sbert(
    bert_dir: Path, directory: Path, max_seq_length: int = TINY_POSITIONS, output: str = "mean"
) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from docembed.models.sbert import ST_SUBDIR, SBertConfig, SBertEncoder

    word = Transformer(str(bert_dir), max_seq_length=max_seq_length)
    SentenceTransformer(modules=[word, Pooling(32)]).save(str(directory / ST_SUBDIR))
    SBertEncoder(SBertConfig(model_name_or_path=str(directory / ST_SUBDIR), output=output)).save(directory)
    return directory


def nugget_bert_configs(layers: int = 4, decoder_layers: int = 2, hidden: int = 32):
    """(encoder, decoder) BertConfig dicts for a tiny BERT2BERT."""
    from transformers import BertConfig

    common = dict(
        vocab_size=30522,
        hidden_size=hidden,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    encoder = BertConfig(num_hidden_layers=layers, **common)
    decoder = BertConfig(
        num_hidden_layers=decoder_layers, is_decoder=True, add_cross_attention=True, **common
    )
    return encoder.to_dict(), decoder.to_dict()


def tiny_nugget(tokenizer, seed: int = 0, **options):
    """A randomly initialised NUGGET: 4 encoder layers (scorer after layer 2), 2 decoder layers, r = 0.25."""
    from docembed.models.nugget import NuggetConfig, NuggetEncoder

    torch.manual_seed(seed)
    encoder_config, decoder_config = nugget_bert_configs()
    values = dict(backbone="config", kind="bert", ratio=0.25, scorer_layer=2, max_length=64)
    values.update(options)
    config = NuggetConfig(encoder_config=encoder_config, decoder_config=decoder_config, **values)
    return NuggetEncoder(config, tokenizer=tokenizer)

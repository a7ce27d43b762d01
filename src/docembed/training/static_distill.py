"""Distilling a `static` model from a sentence transformer (model2vec's recipe, our own code; credit:
Tulkens & van Dongen, MinishLab 2024): every vocabulary token through the model, PCA to `dim`, then a
weight per token from its frequency in a corpus. Minutes on one CPU thread, no training loop."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from docembed.models.static import StaticConfig, StaticEncoder
from docembed.runtime import log, progress_bar, raise_if_interrupted

TOKEN_POOLINGS = ("mean", "token")
WEIGHTINGS = ("none", "zipf", "sif")


def token_outputs(transformer, tokenizer, batch_size: int = 512) -> dict[str, np.ndarray]:
    """(vocab, hidden) outputs of `[CLS] token [SEP]` for every vocabulary id: the mean over the three
    positions ("mean") and the token's own position ("token")."""
    vocab = len(tokenizer)
    hidden = transformer.config.hidden_size
    out = {pooling: np.zeros((vocab, hidden), dtype=np.float32) for pooling in TOKEN_POOLINGS}
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    transformer.eval()
    with torch.inference_mode(), progress_bar("distil [token outputs]", total=vocab) as bar:
        for start in range(0, vocab, batch_size):
            raise_if_interrupted()
            ids = torch.arange(start, min(start + batch_size, vocab))
            batch = torch.stack([torch.full_like(ids, cls_id), ids, torch.full_like(ids, sep_id)], dim=1)
            states = transformer(input_ids=batch, attention_mask=torch.ones_like(batch)).last_hidden_state
            out["mean"][start : start + len(ids)] = states.mean(dim=1).numpy()
            out["token"][start : start + len(ids)] = states[:, 1].numpy()
            bar.advance(len(ids))
    return out


def token_frequencies(tokenizer, texts: Iterable[str], batch: int = 1024) -> np.ndarray:
    """How often each vocabulary id occurs in `texts` (WordPiece, no special tokens)."""
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    chunk: list[str] = []
    for text in [*texts, None]:
        if text is not None:
            chunk.append(text)
        if chunk and (text is None or len(chunk) == batch):
            ids = tokenizer(chunk, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
            counts += np.bincount(
                np.fromiter((i for row in ids for i in row), dtype=np.int64), minlength=len(counts)
            )
            chunk = []
    return counts


def token_weights(counts: np.ndarray, weighting: str, sif_a: float = 1e-3) -> np.ndarray:
    """One weight per token: "sif" a / (a + p(token)) with p from `counts` (unseen tokens weigh 1);
    "zipf" log(1 + rank by frequency); "none" ones."""
    if weighting == "none":
        return np.ones(len(counts), dtype=np.float32)
    if weighting == "sif":
        p = counts / max(counts.sum(), 1)
        return (sif_a / (sif_a + p)).astype(np.float32)
    if weighting == "zipf":
        rank = np.empty(len(counts), dtype=np.float64)
        rank[np.argsort(-counts, kind="stable")] = np.arange(1, len(counts) + 1)
        return np.log1p(rank).astype(np.float32)
    raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, not {weighting!r}")


def pca(vectors: np.ndarray, dim: int, seed: int = 0) -> np.ndarray:
    from sklearn.decomposition import PCA

    dim = min(dim, vectors.shape[1])
    return PCA(n_components=dim, random_state=seed).fit_transform(vectors).astype(np.float32)


def build_static(
    outputs: dict[str, np.ndarray], counts: np.ndarray, config: StaticConfig, tokenizer=None, seed: int = 0
) -> StaticEncoder:
    """A StaticEncoder from precomputed token outputs and corpus counts, as `config` says."""
    if config.token_pooling not in outputs:
        raise ValueError(f"token_pooling must be one of {', '.join(outputs)}, not {config.token_pooling!r}")
    table = pca(outputs[config.token_pooling], config.dim, seed)
    config.dim = table.shape[1]
    table *= token_weights(counts, config.weighting, config.sif_a)[:, None]
    return StaticEncoder(config, tokenizer=tokenizer).set_table(table)


def distill_static(config: StaticConfig, corpus: Iterable[str], seed: int = 0) -> StaticEncoder:
    """The whole recipe: the base transformer's token outputs, frequencies from `corpus`, the table."""
    from transformers import AutoModel

    from docembed.models.offline import minilm_path

    encoder = StaticEncoder.from_base(config)
    transformer = AutoModel.from_pretrained(str(minilm_path()))
    dim = min(config.dim, transformer.config.hidden_size)  # PCA keeps at most the base's width
    log(f"distilling {len(encoder.tokenizer)} tokens of {config.base} to {dim} dimensions")
    outputs = token_outputs(transformer, encoder.tokenizer)
    counts = token_frequencies(encoder.tokenizer, corpus) if config.weighting != "none" else None
    if counts is None:
        counts = np.zeros(len(encoder.tokenizer), dtype=np.int64)
    return build_static(outputs, counts, config, tokenizer=encoder.tokenizer, seed=seed)

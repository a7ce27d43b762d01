"""Fusion of a lexical scorer (tfidf, tfidf-bigrams, bm25) and any docembed model: `bm25+sbert`,
`tfidf-dir+student`; or of two models with embeddings: `student-passages+nugget-passages`.

A fusion scores query/candidate pairs, it has no embeddings (a scorer, as bm25 is). For one query and its
candidates, each part's scores are normalised over the candidates (per query) and combined convexly:

    fused = (1 - weight) * norm(lexical) + weight * norm(model)

In a fusion of two models the first one takes the lexical part's place (`lexical` in the config and on the
object: the first part), scored by its own vectors, and `search` refuses it (its hybrid search fuses a vector
index with a full-text one). Its second part may be a corpus-fitted model (`FITTED_FUSION_PARTS`: Paragraph
Vectors, `retriever+pv`), fitted as tf-idf is on the documents the fusion is fitted on; otherwise nothing is
fitted.

`normalization` is "zscore" ((s - mean) / std; all equal -> 0), "minmax" ((s - min) / (max - min); all
equal -> 0) or "rrf" (reciprocal rank fusion: 1 / (rrf_k + rank), rank 1 = best, ties in input order).
Weight 0 ranks as the lexical part alone, weight 1 as the model alone. The aggregation follows the kind of
query: with a model whose vectors are passages, a long query (`scoring.LONG_QUERY_PASSAGES` passages or more:
the half of a long document) may have its own weight, `long_query_weight`. A single pair (`docembed
similarity`) has no candidates to normalise over: it uses the score statistics measured when the weight
was chosen (`pair_stats`, z-score or min-max), so it needs a fitted fusion folder.

A fusion folder (never a pickle) is a `config.json` naming the two parts, built-ins by name and folders by
path (a relative path is inside the fusion folder: the fitted lexical part is saved there, as `lexical/`),
with the weight, the normalisation, how the weight was chosen and each part's score statistics.
`fit_fusion` fits the lexical part on a corpus and chooses the weight on validation queries (MRR over a
grid, `WEIGHT_GRID`), one per kind of query when they hold both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from docembed.errors import CorruptModelError, UsageError
from docembed.models.base import Encoder, EncoderConfig, NotSupportedError, read_config, save_encoder
from docembed.models.families import register
from docembed.models.registry import FITTED_FUSION_PARTS
from docembed.types import Vectors, texts_hash

NORMALIZATIONS = ("zscore", "minmax", "rrf")
LEXICAL_FAMILIES = ("tfidf", "bm25")
DEFAULT_WEIGHT = 0.5
# `LEXICAL+MODEL` of two built-ins: the weight chosen once on the val splits of all six long-document
# retrieval tasks together (bench/bench_long_retrieval.py: man pages, Debian documentation, joined 20
# Newsgroups posts; z-score, which beat RRF there), so one default holds across kinds of text; any other
# pair gets DEFAULT_WEIGHT. `docembed fit fusion --validation` chooses one on the user's own queries. With a
# model whose vectors are passages, the weight is the one for the shorter queries, chosen with the weight for
# long ones (VALIDATED_LONG_QUERY_WEIGHTS; bench rows "(zscore, by query kind)").
VALIDATED_WEIGHTS: dict[tuple[str, str], float] = {
    ("tfidf-bigrams", "student-passages"): 0.7,  # the recommended long-document search
    ("tfidf-bigrams", "retriever"): 0.6,  # the recommended one at about 62 % of the student's encoding time
    ("tfidf-bigrams", "sbert-windows"): 0.7,  # level with the first on val (+0.18 ± 0.40), untuned MiniLM
    ("tfidf", "student-passages"): 0.65,
    ("bm25", "student-passages"): 0.7,
    ("tfidf", "retriever"): 0.7,
    ("bm25", "retriever"): 0.65,
    ("tfidf", "sbert-windows"): 0.7,
    ("bm25", "sbert-windows"): 0.6,
    ("tfidf", "sbert"): 0.5,  # sbert reads a long document as sbert-chunks does
    ("tfidf", "sbert-chunks"): 0.5,
    ("bm25", "sbert"): 0.55,
    ("bm25", "sbert-chunks"): 0.55,
    ("tfidf", "student"): 0.55,
    ("bm25", "student"): 0.6,
    ("tfidf", "nugget"): 0.45,
    ("bm25", "nugget"): 0.5,
    ("tfidf", "nugget-passages"): 0.55,
    ("bm25", "nugget-passages"): 0.55,
    # two models, no lexical part: the best configuration without one on the same val splits (NUGGET's
    # token matches add what the student's passages miss on documentation passages), one weight for both
    # kinds of query
    ("student-passages", "nugget-passages"): 0.35,
    ("retriever", "nugget-passages"): 0.25,
    # Paragraph Vectors fitted on the candidates, a vector learned from each document's own words: with the
    # retriever, the best configuration without a lexical part on the same val splits (2026-11-29); with
    # the student's passages level with it there (-0.19 +- 0.57) but far behind tf-idf on prose halves
    # (evaluate halves: -7.4), kept for measuring, not recommended
    ("retriever", "pv"): 0.35,
    ("student-passages", "pv"): 0.4,
}
VALIDATED_LONG_QUERY_WEIGHTS: dict[tuple[str, str], float] = {
    ("retriever", "pv"): 0.0,  # a long query: the retriever's windows read whole, alone
    ("student-passages", "pv"): 0.1,
    ("tfidf-bigrams", "student-passages"): 0.65,
    ("tfidf-bigrams", "retriever"): 1.0,
    ("tfidf-bigrams", "sbert-windows"): 0.7,
    ("tfidf", "student-passages"): 0.95,
    ("bm25", "student-passages"): 1.0,
    ("tfidf", "retriever"): 0.85,
    ("bm25", "retriever"): 1.0,
    ("tfidf", "sbert-windows"): 0.1,  # val gave a long query almost wholly to tf-idf
    ("bm25", "sbert-windows"): 0.5,
}
VALIDATED_ON = "the val splits of docembed's six long-document retrieval tasks (bench_long_retrieval)"
WEIGHT_GRID = tuple(round(0.05 * i, 2) for i in range(21))
LEXICAL_FOLDER = "lexical"
MODEL_FOLDER = "model"  # a corpus-fitted second part, saved inside the fusion folder

# how the model part's texts become vectors: (model, texts) -> vectors (callers above pass the encode loop
# or the evaluation's embedding cache; the default is the model's own encode)
Embed = Callable[[Encoder, list[str]], Vectors]


@dataclass
class FusionConfig(EncoderConfig):
    lexical: str = "bm25"  # the first part, built-in name or folder (a fitted one: inside the fusion folder)
    model: str = "sbert"  # any docembed model: built-in name or folder
    weight: float = DEFAULT_WEIGHT  # of the model's normalised score; the lexical part gets 1 - weight
    long_query_weight: float | None = None  # `weight` for a long query (a passage model's); None: `weight`
    normalization: str = "zscore"
    rrf_k: int = 60
    pair_stats: dict | None = None  # {"lexical"|"model": {"mean", "std", "min", "max"}}: single pairs
    chosen_on: str | None = None  # how the weight was chosen (None: the default, not chosen)

    def __post_init__(self):
        if self.normalization not in NORMALIZATIONS:
            raise UsageError(
                f"fusion normalisation is one of {', '.join(NORMALIZATIONS)}, not {self.normalization!r}"
            )
        for name in ("weight", "long_query_weight"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= float(value) <= 1.0:
                raise UsageError(f"the fusion's {name.replace('_', ' ')} is between 0 and 1, not {value}")


#: relative differences below this are float32 rounding, not a ranking (normalize_rows)
SCORE_ROUNDING = 1e-6


def normalize_rows(scores: np.ndarray, method: str, rrf_k: int = 60) -> np.ndarray:
    """Each row (one query's candidates) normalised: z-score, min-max, or reciprocal-rank scores."""
    scores = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    # a spread within float32 rounding of the scores' size is no spread: identical candidates score a few
    # 1e-8 apart through a matrix product, and dividing by that would order them by the rounding
    rounding = SCORE_ROUNDING * np.abs(scores).max(axis=1, keepdims=True, initial=0.0)
    if method == "zscore":
        centred = scores - scores.mean(axis=1, keepdims=True)
        std = scores.std(axis=1, keepdims=True)
        return np.divide(centred, std, out=np.zeros_like(centred), where=std > rounding)
    if method == "minmax":
        low = scores.min(axis=1, keepdims=True)
        span = scores.max(axis=1, keepdims=True) - low
        return np.divide(scores - low, span, out=np.zeros_like(scores), where=span > rounding)
    if method == "rrf":
        ranks = np.empty_like(scores)
        for row, values in enumerate(scores):
            ranks[row, np.argsort(-values, kind="stable")] = np.arange(1, scores.shape[1] + 1)
        return 1.0 / (rrf_k + ranks)
    raise UsageError(f"fusion normalisation is one of {', '.join(NORMALIZATIONS)}, not {method!r}")


def fuse(lexical: np.ndarray, model: np.ndarray, weight, method: str, rrf_k: int = 60) -> np.ndarray:
    """(1 - weight) * norm(lexical) + weight * norm(model), row by row (one row per query; `weight`: one
    number, or one per row as a column)."""
    return (1.0 - weight) * normalize_rows(lexical, method, rrf_k) + weight * normalize_rows(
        model, method, rrf_k
    )


def no_pair_statistics(name: str) -> UsageError:
    """The refusal to score single pairs with a fusion that saved no statistics to normalise them by."""
    return UsageError(
        f"{name} fuses scores per query (normalised over its candidates): a single pair needs the score "
        "statistics saved when the weight is chosen (`docembed fit fusion ... --validation V -o DIR`, "
        "z-score or min-max); use `docembed rerank` for candidates"
    )


class UnfittedPart:
    """A fusion's corpus-fitted second part (FITTED_FUSION_PARTS) before the fusion is fitted: a name, and
    nothing to encode with yet. `fit(texts)` returns the fitted model."""

    scorer_only = False
    vectors_are_passages = False
    requires_fit = True
    source = None

    def __init__(self, name: str):
        self.name = self.family = name

    def to(self, device: str) -> UnfittedPart:
        return self

    def encode(self, texts: Sequence[str], batch_size: int = 32):
        raise UsageError(
            f"{self.name} in a fusion is fitted on the documents first: fit the fusion (rerank and evaluate "
            "fit it on the candidates or the task's fitting texts, `docembed fit fusion` on a corpus)"
        )

    def fit(self, texts: Sequence[str]) -> Encoder:
        """Paragraph Vectors with train-pv's settings, trained on one thread: gensim's threads change the
        order of the updates, and so the vectors, from run to run; one thread gives the same model each time
        (and `fitted_on` keeps the embedding cache apart for each fit)."""
        from docembed.models.paragraph_vector import PVConfig, fit_pv

        texts = list(texts)
        model = fit_pv(texts, PVConfig(workers=1))
        model.name, model.fitted_on = self.name, texts_hash(texts)
        return model


@register
class FusionScorer(Encoder):
    """A lexical scorer (or a first model) and a docembed model, fused per query (module docstring)."""

    family = "fusion"
    config_class = FusionConfig
    capabilities = frozenset({"fit"})
    scorer_only = True  # score(query, candidates), no embeddings

    def __init__(self, config: FusionConfig, lexical: Encoder, model: Encoder, name: str | None = None):
        super().__init__(config, name or f"{lexical.name}+{model.name}")
        self.hybrid = lexical.family in LEXICAL_FAMILIES  # False: two models, no lexical part
        if not self.hybrid and getattr(lexical, "scorer_only", False):
            raise UsageError(
                f"the first part of a fusion is a lexical model ({' or '.join(LEXICAL_FAMILIES)}) or a "
                f"model with embeddings, not {lexical.name!r} ({lexical.family})"
            )
        if getattr(model, "scorer_only", False):
            raise UsageError(f"the second part of a fusion is a model with embeddings, not {model.name!r}")
        self.lexical, self.model = lexical, model
        if config.long_query_weight is not None and self._part_with_passages() is None:
            raise NotSupportedError(
                f"a long-query weight needs a part whose vectors are passages (sbert-windows, the student's "
                f"late chunks): a long query is one of many passages, and {self.name} has none"
            )

    @classmethod
    def from_parts(cls, lexical: str, model: str, device: str = "cpu", **config: Any) -> FusionScorer:
        """`bm25+sbert`: the two parts by name or folder, with the given weight, else the one validated for
        these two built-ins (VALIDATED_WEIGHTS), else the default. A built-in tf-idf part (`tfidf`,
        `tfidf-bigrams`) scores with the exact tf-idf rows, the rule the weights were chosen with (an LSA of
        a few candidates is not one)."""
        from docembed.models.registry import load_model

        validated = VALIDATED_WEIGHTS.get((lexical, model))
        if (
            "weight" not in config
            and validated is not None
            and config.get("normalization", "zscore") == "zscore"
        ):
            config.update(weight=validated, chosen_on=VALIDATED_ON)
            config.setdefault("long_query_weight", VALIDATED_LONG_QUERY_WEIGHTS.get((lexical, model)))
        lexical_part = load_model(lexical, device)  # or the first model
        if lexical_part.family == "tfidf" and lexical_part.requires_fit:  # a built-in, fitted on candidates
            lexical_part.config.svd_dim = 0
        model_part = UnfittedPart(model) if model in FITTED_FUSION_PARTS else load_model(model, device)
        return cls(FusionConfig(lexical=lexical, model=model, **config), lexical_part, model_part)

    # --- fitting --------------------------------------------------------------------------------------
    def unfitted_parts(self) -> list:
        """The parts `fit` has yet to fit, the first part first (a lexical part, a corpus-fitted pv)."""
        return [part for part in (self.lexical, self.model) if part.requires_fit]

    @property
    def requires_fit(self) -> bool:
        return bool(self.unfitted_parts())

    @property
    def fitted_on(self):
        return getattr(self.lexical, "fitted_on", None) or getattr(self.model, "fitted_on", None)

    def fit(self, texts: Sequence[str]) -> FusionScorer:
        """Fit the lexical part's corpus statistics on `texts`, and a corpus-fitted second part (pv) on them
        anew; a model part is otherwise used as it is."""
        texts = list(texts)
        if self.hybrid:
            self.lexical.fit(texts)
        if self.config.model in FITTED_FUSION_PARTS:
            self.model = UnfittedPart(self.config.model).fit(texts)
        return self

    # --- scoring --------------------------------------------------------------------------------------
    def part_scores(
        self, queries: Sequence[str], candidates: Sequence[str], embed: Embed | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The raw scores of each part, (len(queries), len(candidates)) each: lexical (the first), model."""
        return self._scores(queries, candidates, embed)[:2]

    def _scores(self, queries, candidates, embed: Embed | None = None):
        """(lexical, model, whether each query is a long one): part_scores and each query's kind."""
        queries, candidates = list(queries), list(candidates)
        embed = embed or (lambda model, texts: model.encode(texts))
        from docembed.scoring import passage_scoring, score_matrix

        query_vectors = {self.model: embed(self.model, queries)}
        scoring = passage_scoring(self.model)
        model = score_matrix(query_vectors[self.model], embed(self.model, candidates), *scoring)
        if self.hybrid:
            lexical = self.lexical_scores(queries, candidates)
        else:
            first = self.lexical
            query_vectors[first] = embed(first, queries)
            lexical = score_matrix(query_vectors[first], embed(first, candidates), *passage_scoring(first))
        lexical = np.asarray(lexical, dtype=np.float64)
        return lexical, np.asarray(model, dtype=np.float64), self._long_rows(query_vectors, len(queries))

    def _part_with_passages(self) -> Encoder | None:
        """The part whose vectors say whether a query is a long one: the model part when its vectors are
        passages, else a first model's, else None (every query then has the one weight)."""
        return next(
            (p for p in (self.model, self.lexical) if getattr(p, "vectors_are_passages", False)), None
        )

    def _long_rows(self, query_vectors: dict, count: int) -> np.ndarray:
        """Whether each query is a long one, by the vectors of `_part_with_passages` ({part: vectors})."""
        from docembed.scoring import long_query_rows

        part = self._part_with_passages()
        return np.zeros(count, dtype=bool) if part is None else long_query_rows(query_vectors[part])

    def weights_text(self) -> str:
        """The model part's weights as the logs say them: "0.55", or "0.55, 0.9 for long queries"."""
        c = self.config
        return f"{c.weight}" + (
            "" if c.long_query_weight is None else f", {c.long_query_weight} for long queries"
        )

    def query_weights(self, long: np.ndarray) -> np.ndarray:
        """The model's weight for each query (`long`: scoring.long_query_rows of the queries' vectors):
        `long_query_weight` for a long one when set, else `weight`."""
        c = self.config
        long_weight = c.weight if c.long_query_weight is None else c.long_query_weight
        return np.where(np.asarray(long, dtype=bool), long_weight, c.weight).astype(np.float64)

    def lexical_scores(self, queries: Sequence[str], candidates: Sequence[str], pairs: bool = False):
        """The lexical part's scores: every query against every candidate, or (`pairs`) queries[i] against
        candidates[i]. tfidf: the cosine of its own vectors (the LSA projection when it has one, else the
        exact sparse rows), so weight 0 ranks as the tfidf model does; bm25: Okapi BM25."""
        queries, candidates = list(queries), list(candidates)
        if self.lexical.family == "tfidf" and self.lexical.components is not None:
            q, c = self.lexical.encode(queries), self.lexical.encode(candidates)
            if pairs:
                return (q.astype(np.float64) * c).sum(axis=1)
            return q.astype(np.float64) @ c.T.astype(np.float64)
        if self.lexical.family == "tfidf":
            from docembed.models.baselines import sparse_cosines

            q, c = self.lexical.encode_sparse(queries), self.lexical.encode_sparse(candidates)
            return sparse_cosines(q, c, pairs)
        if pairs:
            return np.array([self.lexical.score(a, [b])[0] for a, b in zip(queries, candidates, strict=True)])
        return np.asarray(self.lexical.score_matrix(queries, candidates), dtype=np.float64)

    def score_matrix(
        self,
        queries: Sequence[str],
        candidates: Sequence[str],
        embed: Embed | None = None,
        weight: float | None = None,
    ) -> np.ndarray:
        """Fused scores of every query against every candidate (normalised over each query's candidates), with
        the weight of each query's kind (`weight`: one for every query)."""
        lexical, model, long = self._scores(queries, candidates, embed)
        c = self.config
        weights = self.query_weights(long)[:, None] if weight is None else weight
        return fuse(lexical, model, weights, c.normalization, c.rrf_k)

    def score(self, query: str, candidates: Sequence[str]) -> np.ndarray:
        """Fused scores of `candidates` for `query` (what bm25's score() is, for the evaluator)."""
        return self.score_matrix([query], candidates)[0].astype(np.float32)

    def pair_scores(
        self, left: Sequence[str], right: Sequence[str], embed: Embed | None = None
    ) -> np.ndarray:
        """left[i] against right[i], each part normalised with the statistics saved at fit time."""
        c = self.config
        if c.normalization == "rrf" or not c.pair_stats:
            raise no_pair_statistics(self.name)
        left, right = list(left), list(right)
        embed = embed or (lambda model, texts: model.encode(texts))
        from docembed.scoring import passage_scoring, score_pairs

        left_vectors = {self.model: embed(self.model, left)}
        if self.hybrid:
            lexical = self.lexical_scores(left, right, pairs=True)
        else:
            first = self.lexical
            left_vectors[first] = embed(first, left)
            lexical = score_pairs(left_vectors[first], embed(first, right), *passage_scoring(first))
            lexical = np.asarray(lexical, dtype=np.float64)
        pairs = score_pairs(left_vectors[self.model], embed(self.model, right), *passage_scoring(self.model))
        model = np.asarray(pairs, dtype=np.float64)
        weights = self.query_weights(self._long_rows(left_vectors, len(left)))
        parts = []
        for key, values in (("lexical", lexical), ("model", model)):
            stats = c.pair_stats[key]
            if c.normalization == "zscore":
                parts.append((values - stats["mean"]) / (stats["std"] or 1.0))
            else:
                parts.append((values - stats["min"]) / ((stats["max"] - stats["min"]) or 1.0))
        return ((1.0 - weights) * parts[0] + weights * parts[1]).astype(np.float32)

    def require_lexical(self, what: str) -> None:
        """Refuse `what` (hybrid search: a vector index fused with a full-text one) for two models."""
        if not self.hybrid:
            raise UsageError(
                f"{what} fuses a lexical index with a vector one; {self.name} fuses two models: search with "
                f"one of them and rerank its hits with `docembed rerank -m {self.name}`"
            )

    # --- what it is not -------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], batch_size: int = 32):
        raise UsageError(
            f"{self.name} is a fusion of scores, not an embedding: use it in similarity, rerank or evaluate "
            f"(encode with {self.model.name} itself)"
        )

    @property
    def dim(self) -> int:
        raise UsageError(f"{self.name} is a fusion of scores, not an embedding: it has no dimension")

    def to(self, device: str) -> FusionScorer:
        self.model.to(device)
        if not self.hybrid:
            self.lexical.to(device)
        return self

    # --- save / load ----------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """config.json naming both parts; a fitted lexical part is saved inside, as `lexical/`, and so is a
        corpus-fitted second part, as `model/` (a first model is named as the model part is)."""
        if unfitted := self.unfitted_parts():
            raise UsageError(f"{self.name}: fit the fusion ({unfitted[0].name}) before saving it")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        from docembed.models.registry import BUILTIN

        if self.hybrid:
            self.lexical.save(directory / LEXICAL_FOLDER)
            self.config.lexical = LEXICAL_FOLDER
        elif self.config.lexical not in BUILTIN:
            self.config.lexical = self.lexical.source or self.config.lexical
        if self.config.model in FITTED_FUSION_PARTS or self.config.model == MODEL_FOLDER:
            self.model.save(directory / MODEL_FOLDER)
            self.config.model = MODEL_FOLDER
        elif self.config.model not in BUILTIN:  # a folder: by its full path
            self.config.model = self.model.source or self.config.model
        self.write_config(directory)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> FusionScorer:
        from docembed.models.registry import load_model, written_as_path

        directory = Path(directory)
        config = FusionConfig.from_dict(read_config(directory)["config"])

        def part(spec: str, anywhere: bool) -> Encoder:
            path = Path(spec).expanduser()
            if written_as_path(spec) or (directory / spec).is_dir():
                if not (anywhere and path.is_absolute()):
                    path = _inside(directory, spec)
                if not path.is_dir():
                    raise CorruptModelError(f"{directory}: the fusion part {spec!r} is missing ({path})")
                return load_model(str(path), device)
            return load_model(spec, device)

        # a model part may be a folder anywhere, by its full path (as `fit fusion` records it); the fitted
        # lexical part is the fusion's own, saved inside it
        first = part(config.lexical, anywhere=True)
        if first.family in LEXICAL_FAMILIES and Path(config.lexical).expanduser().is_absolute():
            _inside(directory, config.lexical)  # refused unless it is inside after all
        return cls(config, first, part(config.model, anywhere=True))


def _inside(directory: Path, spec: str) -> Path:
    """A fusion part's folder named by a relative path, which is inside the fusion folder: one that leads out
    of it (`../other`, an absolute path for the lexical part, a link) would load another folder's model as
    this one's part, so it is refused in one line."""
    path = directory / Path(spec).expanduser()
    if not path.resolve().is_relative_to(directory.resolve()):
        raise CorruptModelError(
            f"{directory / 'config.json'}: the fusion part {spec!r} is not inside {directory}: refused"
        )
    return path


def reciprocal_rank(scores: np.ndarray, gold: int) -> float:
    """1 / rank of candidate `gold` (ties counted against it)."""
    return 1.0 / (1 + int((scores >= scores[gold]).sum()) - 1)


def choose_weight(
    lexical: Sequence[np.ndarray],
    model: Sequence[np.ndarray],
    golds: Sequence[int],
    method: str = "zscore",
    rrf_k: int = 60,
    grid: Sequence[float] = WEIGHT_GRID,
) -> tuple[float, dict[float, float]]:
    """The weight of the grid with the best MRR over the validation queries (each a row of part scores over
    its candidates, and the index of its right candidate); ties go to the weight nearest 0.5. Returns the
    weight and the MRR x100 of every weight."""
    table = {}
    for weight in grid:
        rr = [
            reciprocal_rank(fuse(lex, mod, weight, method, rrf_k)[0], gold)
            for lex, mod, gold in zip(lexical, model, golds, strict=True)
        ]
        table[float(weight)] = round(100.0 * float(np.mean(rr)), 4)
    best = max(table, key=lambda w: (table[w], -abs(w - 0.5)))
    return best, table


def _stats(rows: Sequence[np.ndarray]) -> dict[str, float]:
    values = np.concatenate([np.ravel(r) for r in rows])
    return {
        k: float(f(values)) for k, f in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max))
    }


def fit_fusion(
    fusion: FusionScorer,
    corpus: Sequence[str] | None,
    validation: Sequence[tuple[str, list[str], int]],
    output: str | Path | None = None,
    embed: Embed | None = None,
    description: str = "validation queries",
) -> dict[str, Any]:
    """Fit the lexical part on `corpus` (None: keep it as it is, fitted) and choose the weight on
    `validation` rows (query, candidates, index of the right candidate); when they hold both long queries
    (a passage model's, LONG_QUERY_PASSAGES passages or more) and shorter ones, one weight for each kind, on
    its own queries. Saves to `output` when given. Returns the choice: weight (and long_query_weight), MRR
    x100 per weight over all queries (and per kind of query: mrr_by_kind_and_weight)."""
    from docembed.runtime import log

    if corpus is not None:
        fusion.fit(list(corpus))
    elif unfitted := fusion.unfitted_parts():
        raise UsageError(f"{unfitted[0].name} is not fitted: give a corpus to fit it on")
    if not validation:
        raise UsageError("choosing the fusion weight needs validation queries with a right answer")
    lexical, model, golds, long = [], [], [], []
    for query, candidates, gold in validation:
        lex, mod, is_long = fusion._scores([query], candidates, embed)
        lexical.append(lex)
        model.append(mod)
        golds.append(gold)
        long.append(bool(is_long[0]))
    c = fusion.config
    weight, table = choose_weight(lexical, model, golds, c.normalization, c.rrf_k)
    choice: dict[str, Any] = {"weight": weight, "mrr_by_weight": table, "queries": len(golds)}
    c.long_query_weight = None
    if any(long) and not all(long):  # both kinds: a weight for each, on its own queries
        tables = {}
        for kind, name in ((False, "weight"), (True, "long_query_weight")):
            rows = [i for i, is_long in enumerate(long) if is_long == kind]
            choice[name], tables["long" if kind else "shorter"] = choose_weight(
                *([parts[i] for i in rows] for parts in (lexical, model, golds)), c.normalization, c.rrf_k
            )
        choice.update(long_queries=sum(long), mrr_by_kind_and_weight=tables)
        c.long_query_weight = choice["long_query_weight"]
    c.weight = choice["weight"]
    c.pair_stats = {"lexical": _stats(lexical), "model": _stats(model)}
    c.chosen_on = f"MRR on {len(golds)} {description}, grid {WEIGHT_GRID[0]}..{WEIGHT_GRID[-1]} step 0.05"
    if c.long_query_weight is None:
        log(
            f"fusion weight {weight} (model) chosen on {len(golds)} queries: MRR {table[weight]:.2f}, "
            f"lexical alone {table[0.0]:.2f}, model alone {table[1.0]:.2f}"
        )
    else:
        long_count = choice["long_queries"]
        log(
            f"fusion weights (model) chosen by kind of query: {c.weight} for the {len(golds) - long_count} "
            f"shorter ones, {c.long_query_weight} for the {long_count} long ones (six passages or more); "
            f"MRR {tables['shorter'][c.weight]:.2f} and {tables['long'][c.long_query_weight]:.2f}"
        )
    if output is not None:
        save_encoder(fusion, output)
    return choice

"""Baselines: TF-IDF vectors, Okapi BM25 scoring, and averaged GloVe word vectors.

`tfidf` and `bm25` learn corpus statistics (vocabulary, idf). They expose the optional fit hook that the
evaluator uses: `requires_fit` is true until `fit(texts)` has run (or a fitted model was loaded), and
`fitted_on` (a hash of the fit texts) joins the embedding-cache key. `fit_tfidf(texts, config, DIR)` (what
`docembed fit tfidf CORPUS -o DIR` runs) fits and saves one; `fit_bm25` likewise.

Output of `tfidf.encode()`: tf-idf rows (sublinear tf, l2-normalised) are sparse and as wide as the
vocabulary, so encode() returns dense float32 rows of a fixed-size TruncatedSVD projection (LSA,
`svd_dim`, default 256), re-normalised to unit length; with `svd_dim=0`, or when fitted on no more documents
(or terms) than `svd_dim`, it returns the dense l2-normalised tf-idf rows themselves (vocabulary-wide). The
evaluator scores tfidf with the exact sparse rows (`encode_sparse`), so the published "TF-IDF cosine" numbers
are what it measures.

`bm25` is a scorer, not an embedding: `score(query, candidates)` is Okapi BM25 (k1=1.2, b=0.75) with idf
and average length from the fitted corpus. encode() refuses with a clear message.

`glove-avg` averages the word vectors of a text's lower-cased tokens (unknown words skipped; a text with
no known word gets the zero vector). Vectors come from the offline GloVe 6B 50d package unless `vectors`
names a word2vec/GloVe text file (a `count dim` header line is recognised and skipped).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from docembed.errors import CorruptModelError, DocembedError, UsageError
from docembed.models.base import Encoder, EncoderConfig, read_config, refuse_non_finite, save_encoder
from docembed.models.families import register
from docembed.tensors import is_long, text_blocks
from docembed.text import ANALYZERS, TOKENIZERS, analyze, term_counts, token_blocks
from docembed.text import tokenize as tokenize_words
from docembed.types import l2_normalize, texts_hash

VOCAB_NAME = "vocab.json"
TOKENIZER = "simple-v1"  # docembed.text.TOKENIZERS: the baselines' word split


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    return tokenize_words(text, lowercase, TOKENIZER)


def _save_arrays(arrays: dict[str, np.ndarray], directory: Path) -> None:
    from safetensors.numpy import save_file

    from docembed.models.base import WEIGHTS_NAME

    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(directory / WEIGHTS_NAME))


def _load_arrays(directory: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    from docembed.models.base import WEIGHTS_NAME

    path = directory / WEIGHTS_NAME
    if not path.exists():
        raise CorruptModelError(f"{directory}: {WEIGHTS_NAME} is missing")
    try:
        arrays = load_file(str(path))
    except Exception as error:  # safetensors raises its own error types for truncated files
        raise CorruptModelError(f"{path} is corrupt or truncated: {error}") from None
    refuse_non_finite(arrays, path)  # NaN idf or vectors would encode NaN in silence
    return arrays


def _read_vocab(directory: Path) -> dict:
    path = directory / VOCAB_NAME
    if not path.exists():
        raise CorruptModelError(f"{directory}: {VOCAB_NAME} is missing")
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CorruptModelError(f"{path} is corrupt: {error}") from None
    if not isinstance(vocab, dict):  # what every reader of it expects: say so, not an AttributeError
        raise CorruptModelError(f"{path} is corrupt: a JSON {type(vocab).__name__}, not an object")
    return vocab


class FittedBaseline(Encoder):
    """Shared fit bookkeeping of the corpus-statistics baselines."""

    capabilities = frozenset({"fit"})

    def __init__(self, config, name=None):
        super().__init__(config, name)
        self.fitted_on: str | None = None

    @property
    def requires_fit(self) -> bool:
        return self.fitted_on is None

    def _check_fitted(self) -> None:
        if self.fitted_on is None:
            ngrams = getattr(self.config, "ngram_max", 1)
            option = f" --ngram-max {ngrams}" if ngrams > 1 else ""
            raise UsageError(
                f"{self.name} has not been fitted: run `docembed fit {self.family} CORPUS{option} -o DIR` "
                "and use DIR as the model (the evaluator fits it on each task's training text by itself)"
            )


# --- TF-IDF -----------------------------------------------------------------------------------------------
@dataclass
class TfidfConfig(EncoderConfig):
    sublinear_tf: bool = True
    lowercase: bool = True
    min_df: int = 1
    max_features: int | None = 200_000
    ngram_max: int = 1
    svd_dim: int = 256  # dense output of encode(): LSA projection size; 0 = the raw tf-idf rows
    seed: int = 0


@register
class TfidfEncoder(FittedBaseline):
    family = "tfidf"
    config_class = TfidfConfig
    capabilities = frozenset({"fit", "sparse"})

    def __init__(self, config: TfidfConfig, name: str | None = None):
        super().__init__(config, name)
        self.vectorizer = None
        self.components: np.ndarray | None = None  # (svd_dim, vocab) when svd_dim > 0

    def _new_vectorizer(self, vocabulary=None):
        from sklearn.feature_extraction.text import TfidfVectorizer

        c = self.config
        return TfidfVectorizer(
            sublinear_tf=c.sublinear_tf,
            lowercase=c.lowercase,
            min_df=1 if vocabulary is not None else c.min_df,
            max_features=None if vocabulary is not None else c.max_features,
            ngram_range=(1, c.ngram_max),
            token_pattern=TOKENIZERS[TOKENIZER],
            vocabulary=vocabulary,
            dtype=np.float32,
        )

    def fit(self, texts: Sequence[str]) -> TfidfEncoder:
        texts = list(texts)
        if not any(t.strip() for t in texts):
            raise DocembedError("tfidf cannot be fitted on empty texts")
        self.vectorizer = self._new_vectorizer()
        matrix = self.vectorizer.fit_transform(texts)
        self.components = None
        # an LSA is a reduction only of more documents and terms than its size: of fewer it dropped a real
        # dimension (of two documents it kept one, where every cosine is +-1), so the exact rows are kept
        if 0 < self.config.svd_dim < min(matrix.shape):
            from sklearn.decomposition import TruncatedSVD

            svd = TruncatedSVD(n_components=self.config.svd_dim, random_state=self.config.seed)
            svd.fit(matrix)
            self.components = svd.components_.astype(np.float32)
        self.fitted_on = texts_hash(texts)
        return self

    def encode_sparse(self, texts: Sequence[str]):
        """The exact l2-normalised tf-idf rows as a scipy CSR matrix (what the evaluator scores)."""
        self._check_fitted()
        texts = list(texts)
        if not any(is_long(text) for text in texts):
            return self.vectorizer.transform(texts).astype(np.float32)
        from scipy.sparse import vstack

        # each row is computed on its own (counts, tf, idf, norm), so rows made apart stack to the same matrix
        rows = [self._streamed_row(t) if is_long(t) else self.vectorizer.transform([t]) for t in texts]
        return vstack(rows, format="csr").astype(np.float32)

    def _streamed_row(self, text: str):
        """The tf-idf row of a long text, its terms counted block by block (n-grams across a cut included)
        into the count row scikit-learn's CountVectorizer makes, then weighted as its transform does."""
        from scipy.sparse import csr_matrix

        vectorizer = self.vectorizer
        preprocess, split = vectorizer.build_preprocessor(), vectorizer.build_tokenizer()
        low, high = vectorizer.ngram_range
        counts: Counter = Counter()
        carry: list[str] = []  # the last high - 1 tokens: n-grams that end in the next block start there
        for block in text_blocks(text):
            tokens = carry + split(preprocess(block))
            for n in range(low, high + 1):
                first = max(0, len(carry) - n + 1)  # n-grams ending in this block's tokens only
                grams = (" ".join(tokens[i : i + n]) for i in range(first, len(tokens) - n + 1))
                counts.update(grams if n > 1 else tokens[len(carry) :])
            carry = tokens[-(high - 1) :] if high > 1 else []
        vocabulary = vectorizer.vocabulary_
        found = sorted((vocabulary[term], count) for term, count in counts.items() if term in vocabulary)
        columns = np.asarray([c for c, _ in found], dtype=np.int64)
        values = np.asarray([v for _, v in found], dtype=vectorizer.dtype)
        row = csr_matrix(
            (values, columns, [0, len(found)]), shape=(1, len(vocabulary)), dtype=vectorizer.dtype
        )
        if vectorizer.binary:
            row.data.fill(1)
        return vectorizer._tfidf.transform(row, copy=False)  # TfidfVectorizer.transform's own second step

    @property
    def normalized(self) -> bool:
        return True

    @property
    def scores_exact_rows(self) -> bool:
        """No LSA projection: it scores its exact rows, sparse (a dense copy is as wide as the vocabulary)."""
        return self.components is None

    @property
    def dim(self) -> int:
        self._check_fitted()
        return len(self.components) if self.components is not None else len(self.vectorizer.vocabulary_)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        sparse = self.encode_sparse(texts)
        if self.components is None:
            return l2_normalize(np.asarray(sparse.todense(), dtype=np.float32))
        return l2_normalize(np.asarray(sparse @ self.components.T, dtype=np.float32))

    def save(self, directory: str | Path) -> None:
        self._check_fitted()
        directory = Path(directory)
        self.write_config(directory, fitted_on=self.fitted_on)
        vocab = {term: int(i) for term, i in self.vectorizer.vocabulary_.items()}
        payload = {"vocabulary": vocab}
        (directory / VOCAB_NAME).write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
        arrays = {"idf": self.vectorizer.idf_.astype(np.float32)}
        if self.components is not None:
            arrays["svd_components"] = self.components
        _save_arrays(arrays, directory)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> TfidfEncoder:
        directory = Path(directory)
        payload = read_config(directory)
        model = cls(TfidfConfig.from_dict(payload["config"]))
        vocab = _read_vocab(directory).get("vocabulary")
        arrays = _load_arrays(directory)
        if not isinstance(vocab, dict) or "idf" not in arrays or len(arrays["idf"]) != len(vocab):
            raise CorruptModelError(f"{directory}: vocabulary and idf do not match")
        model.vectorizer = model._new_vectorizer(vocabulary=vocab)
        model.vectorizer.idf_ = arrays["idf"].astype(np.float64)
        model.components = arrays.get("svd_components")
        model.fitted_on = payload.get("fitted_on") or "loaded"
        return model


def sparse_cosines(left, right, pairs: bool = False) -> np.ndarray:
    """Cosines of l2-normalised sparse rows (tf-idf's exact rows): every left row against every right row,
    or (`pairs`) left[i] against right[i]."""
    if pairs:
        return np.asarray(left.multiply(right).sum(axis=1), dtype=np.float64).ravel()
    return np.asarray((left @ right.T).todense(), dtype=np.float64)


# --- BM25 -------------------------------------------------------------------------------------------------
def bm25_idf(doc_freq, num_docs: int):
    """ln(1 + (N - df + 0.5) / (df + 0.5)), elementwise (never negative)."""
    df = np.asarray(doc_freq, dtype=np.float64)
    return np.log1p((num_docs - df + 0.5) / (df + 0.5))


def bm25_weight(tf, lengths, idf, avg_len: float, k1: float, b: float):
    """Okapi BM25's weight of a term in a document, elementwise: idf tf (k1 + 1) / (tf + k1 (1 - b + b
    length / avg_len)); what BM25Scorer sums per query and BM25Index (faiss_index.py) precomputes."""
    norm = k1 * (1.0 - b + b * np.asarray(lengths, dtype=np.float64) / max(avg_len, 1e-9))
    return idf * tf * (k1 + 1.0) / (tf + norm)


@dataclass
class BM25Config(EncoderConfig):
    k1: float = 1.2
    b: float = 0.75
    lowercase: bool = True
    analyzer: str = "plain"  # docembed.text.ANALYZERS: "english" stems and drops stopwords

    def __post_init__(self):
        if self.analyzer not in ANALYZERS:
            raise UsageError(f"the bm25 analyzer is one of {', '.join(ANALYZERS)}, not {self.analyzer!r}")
        if self.k1 < 0 or not 0.0 <= self.b <= 1.0:
            raise UsageError(f"bm25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")


@register
class BM25Scorer(FittedBaseline):
    """Okapi BM25 over a fitted corpus. idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)) (never negative).

    Written here rather than taken from bm25s: bm25s scores only the corpus it indexed (with that corpus'
    idf), while score() ranks any candidate texts with the fitted corpus' statistics. On the shared case
    (2,000 20NG documents as corpus and candidates, 200 queries) bm25s 0.3.16 "lucene" agrees to 3.6e-7
    relative (float32) once multiplied by (k1 + 1), which it leaves out."""

    family = "bm25"
    config_class = BM25Config
    scorer_only = True  # the evaluator asks for score(), never encode()

    def __init__(self, config: BM25Config, name: str | None = None):
        super().__init__(config, name)
        self.doc_freq: dict[str, int] = {}
        self.num_docs = 0
        self.avg_len = 0.0

    def fit(self, texts: Sequence[str]) -> BM25Scorer:
        texts = list(texts)
        doc_freq: dict[str, int] = {}
        total = 0
        for text in texts:
            counts = self.term_counts(text)
            total += sum(counts.values())
            for term in counts:
                doc_freq[term] = doc_freq.get(term, 0) + 1
        if not texts:
            raise DocembedError("bm25 cannot be fitted on an empty corpus")
        self.doc_freq, self.num_docs, self.avg_len = doc_freq, len(texts), total / len(texts)
        self.fitted_on = texts_hash(texts)
        return self

    def terms(self, text: str) -> list[str]:
        """The terms of `text` under this model's analyzer (what fit counts and queries look up)."""
        return analyze(text, self.config.analyzer, self.config.lowercase)

    def term_counts(self, text: str) -> Counter:
        """How often each term of `text` occurs (a long text analysed block by block: text.term_counts)."""
        return term_counts(text, self.config.analyzer, self.config.lowercase)

    def idf(self, term: str) -> float:
        return float(bm25_idf(self.doc_freq.get(term, 0), self.num_docs))

    def score(self, query: str, candidates: Sequence[str]) -> np.ndarray:
        """BM25 of each candidate document for `query` (its terms counted with multiplicity once each)."""
        return self.score_matrix([query], candidates)[0]

    def score_matrix(self, queries: Sequence[str], candidates: Sequence[str], embed=None) -> np.ndarray:
        """BM25 of every candidate for every query, (len(queries), len(candidates)) float32: the candidates
        are tokenized once into a sparse matrix of their terms' BM25 weights, and the queries' distinct terms
        (a sparse 0/1 matrix) multiply it, so the cost follows the terms shared, not queries x candidates.
        (`embed` is the scorers' shared signature: a fusion embeds its model part with it; BM25 has none.)"""
        from scipy.sparse import csr_matrix

        self._check_fitted()
        vocab: dict[str, int] = {}
        indptr, indices, counts, lengths = [0], [], [], []
        for text in candidates:
            tf = self.term_counts(text)
            for term, count in tf.items():
                indices.append(vocab.setdefault(term, len(vocab)))
                counts.append(count)
            indptr.append(len(indices))
            lengths.append(sum(tf.values()))
        width = max(len(vocab), 1)
        terms = sorted(vocab, key=vocab.get)
        idf = bm25_idf([self.doc_freq.get(t, 0) for t in terms], self.num_docs) if terms else np.zeros(0)
        rows = np.repeat(np.arange(len(candidates)), np.diff(indptr))
        indices = np.asarray(indices, dtype=np.int64)
        weights = bm25_weight(
            np.asarray(counts, dtype=np.float64),
            np.asarray(lengths, dtype=np.float64)[rows],
            idf[indices],
            self.avg_len,
            self.config.k1,
            self.config.b,
        )
        weights = csr_matrix((weights, indices, indptr), shape=(len(candidates), width))
        q_indptr, q_indices = [0], []
        for query in queries:
            q_indices += sorted({vocab[t] for t in self.terms(query) if t in vocab})
            q_indptr.append(len(q_indices))
        found = csr_matrix(
            (np.ones(len(q_indices)), np.asarray(q_indices, dtype=np.int64), q_indptr),
            shape=(len(queries), width),
        )
        return (found @ weights.T).toarray().astype(np.float32)

    def encode(self, texts: Sequence[str], batch_size: int = 32):
        raise UsageError(
            "bm25 is a scorer, not an embedding: it supports reranking tasks (paraphrase-identification) only"
        )

    @property
    def dim(self) -> int:
        raise UsageError("bm25 is a scorer, not an embedding: it has no dimension")

    def save(self, directory: str | Path) -> None:
        self._check_fitted()
        directory = Path(directory)
        self.write_config(directory, fitted_on=self.fitted_on)
        terms = sorted(self.doc_freq)
        payload = {"terms": terms, "num_docs": self.num_docs, "avg_len": self.avg_len}
        (directory / VOCAB_NAME).write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
        _save_arrays({"doc_freq": np.array([self.doc_freq[t] for t in terms], dtype=np.int64)}, directory)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> BM25Scorer:
        directory = Path(directory)
        payload = read_config(directory)
        model = cls(BM25Config.from_dict(payload["config"]))
        vocab = _read_vocab(directory)
        doc_freq = _load_arrays(directory).get("doc_freq")
        terms = vocab.get("terms")
        if not isinstance(terms, list) or doc_freq is None or len(doc_freq) != len(terms):
            raise CorruptModelError(f"{directory}: terms and document frequencies do not match")
        model.doc_freq = {t: int(df) for t, df in zip(terms, doc_freq, strict=True)}
        try:
            model.num_docs, model.avg_len = int(vocab["num_docs"]), float(vocab["avg_len"])
        except (KeyError, TypeError, ValueError, OverflowError):  # missing, or int() of NaN / infinity
            raise CorruptModelError(f"{directory / VOCAB_NAME}: num_docs or avg_len is no number") from None
        if not (math.isfinite(model.avg_len) and model.avg_len >= 0):  # JSON's NaN would score NaN
            raise CorruptModelError(f"{directory / VOCAB_NAME}: avg_len is {model.avg_len}, not a length")
        model.fitted_on = payload.get("fitted_on") or "loaded"
        return model


# --- fitting from Python: `docembed fit`, `encode --fit` ---------------------------------------------------
def fit_tfidf(
    texts: Iterable[str], config: TfidfConfig | None = None, output: str | Path | None = None
) -> TfidfEncoder:
    """Fit TF-IDF on `texts` with `config` (default: `docembed fit tfidf`'s); with `output`, save it there."""
    return _fit_and_save(TfidfEncoder(config or TfidfConfig(), name="tfidf"), texts, output)


def fit_bm25(
    texts: Iterable[str], config: BM25Config | None = None, output: str | Path | None = None
) -> BM25Scorer:
    """Fit BM25's corpus statistics on `texts` with `config` (default: `docembed fit bm25`'s); with `output`,
    save them there."""
    return _fit_and_save(BM25Scorer(config or BM25Config(), name="bm25"), texts, output)


def _fit_and_save(model: FittedBaseline, texts: Iterable[str], output: str | Path | None):
    from docembed.runtime import log

    texts = list(texts)
    model.fit(texts)
    if output is not None:
        save_encoder(model, output)
    log(f"fitted {model.family} on {len(texts)} documents")  # the caller says where it is saved
    return model


# --- averaged GloVe ---------------------------------------------------------------------------------------
@dataclass
class GloveConfig(EncoderConfig):
    vectors: str | None = None  # None: offline GloVe 6B 50d; else a word2vec/GloVe text file
    lowercase: bool = True


@register
class GloveAverageEncoder(Encoder):
    family = "glove-avg"
    config_class = GloveConfig

    def __init__(self, config: GloveConfig, name: str | None = None, _tables=None):
        super().__init__(config, name)
        from docembed.models.word_vectors import offline_glove, read_word_vectors

        if _tables is not None:
            words, self.matrix = _tables
        elif config.vectors:
            words, self.matrix = read_word_vectors(config.vectors)
        else:
            words, self.matrix = offline_glove()
        self.index = {w: i for i, w in enumerate(words)}

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            if is_long(text):
                out[row] = self._streamed_mean(text)
                continue
            ids = [self.index[t] for t in tokenize(text, self.config.lowercase) if t in self.index]
            if ids:
                out[row] = self.matrix[ids].mean(axis=0)
        return out

    def _streamed_mean(self, text: str) -> np.ndarray:
        """The mean above for a long text, read block by block: numpy sums the rows of an axis-0 mean one
        after another, so continuing that sum from block to block gives the same float32 vector."""
        total = np.zeros(self.dim, dtype=np.float32)
        count = 0
        for tokens in token_blocks(text, self.config.lowercase, TOKENIZER):
            ids = [self.index[t] for t in tokens if t in self.index]
            if ids:
                total = np.add.reduce(np.concatenate([total[None], self.matrix[ids]]), axis=0)
                count += len(ids)
        return total / count if count else total

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.write_config(directory)
        words = sorted(self.index, key=self.index.get)
        (directory / "vocab.txt").write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
        _save_arrays({"vectors": self.matrix.astype(np.float32)}, directory)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> GloveAverageEncoder:
        directory = Path(directory)
        payload = read_config(directory)
        vocab_path = directory / "vocab.txt"
        if not vocab_path.exists():
            raise CorruptModelError(f"{directory}: vocab.txt is missing")
        try:
            words = vocab_path.read_text(encoding="utf-8").split("\n")[:-1]
        except UnicodeDecodeError as error:
            raise CorruptModelError(f"{vocab_path} is corrupt: {error}") from None
        vectors = _load_arrays(directory).get("vectors")
        if vectors is None or len(vectors) != len(words):
            raise CorruptModelError(f"{directory}: vocab.txt and vectors do not match")
        return cls(GloveConfig.from_dict(payload["config"]), _tables=(words, vectors))

"""docembed fit: fit a corpus-statistics baseline (tfidf, bm25) and save it as a model directory."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("fit")(fit)


def fit(
    family: str = typer.Argument(..., help="What to fit: tfidf, bm25, or fusion (--lexical + --model)."),
    input: str = typer.Argument(
        ..., help="Corpus: .jsonl, .txt (one document per line) or .tsv (id<TAB>text)."
    ),
    lexical: str = typer.Option(
        "bm25",
        "--lexical",
        help="fusion: the first part, tfidf, tfidf-bigrams or bm25 (fitted on the corpus), or a model (two "
        "models: nothing is fitted).",
    ),
    model: str = typer.Option(
        "sbert",
        "--model",
        "-m",
        help="fusion: the model part (any --model value, or pv: fitted on the corpus).",
    ),
    validation: str = typer.Option(
        None,
        "--validation",
        help="fusion: rerank rows with 'answer' (index of the right candidate) to choose the weight on.",
    ),
    docs: str = typer.Option(None, "--docs", "-d", help="fusion: documents of id rows in --validation."),
    normalization: str = typer.Option(
        "zscore", "--normalization", help="fusion: per-query normalisation, zscore | minmax | rrf."
    ),
    weight: float = typer.Option(
        None, "--weight", min=0.0, max=1.0, help="fusion: this weight of the model part, not chosen."
    ),
    output: str = typer.Option(
        ..., "--output", "-o", help="Directory for the fitted model (usable as --model)."
    ),
    format: str = common.INPUT_FORMAT,
    text_field: str = common.TEXT_FIELD,
    svd_dim: int = typer.Option(
        None, "--svd-dim", min=0, help="tfidf: size of the dense LSA output of encode (0 = raw tf-idf rows)."
    ),
    ngram_max: int = typer.Option(
        None,
        "--ngram-max",
        min=1,
        max=3,
        help="tfidf: longest word n-gram counted (2: words and word pairs, the built-in tfidf-bigrams).",
    ),
    analyzer: str = typer.Option(
        None,
        "--analyzer",
        help="bm25: plain (words, lower-cased) | english (+ stopwords out, Snowball stems).",
    ),
    k1: float = typer.Option(None, "--k1", min=0.0, help="bm25: term-frequency saturation (default 1.2)."),
    b: float = typer.Option(None, "--b", min=0.0, max=1.0, help="bm25: length normalisation (default 0.75)."),
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Fit a corpus-statistics baseline (vocabulary, idf) on a corpus and save it as a model directory; or a
    fusion: its lexical part on the corpus, its weight chosen on --validation.

    Example: docembed fit tfidf corpus.jsonl -o models/tfidf
    (fusion: docembed fit fusion corpus.jsonl --lexical bm25 -m sbert --validation val.jsonl -o models/f)
    """
    from docembed.errors import UsageError
    from docembed.io.outputs import directory_output
    from docembed.models.base import MODEL_DIRECTORY
    from docembed.models.baselines import BM25Config, TfidfConfig, fit_bm25, fit_tfidf
    from docembed.runtime import log, settings

    if family not in ("tfidf", "bm25", "fusion"):
        raise UsageError(f"only tfidf, bm25 and fusion are fitted this way, not {family!r}")
    # the rule fitted here: the family, or a fusion's built-in lexical part (its options apply to it)
    fitted = FUSION_LEXICAL_FAMILY.get(lexical) if family == "fusion" else family
    where = " (a fusion's --lexical tfidf or tfidf-bigrams)" if family == "fusion" else ""
    for flag, value in (("--svd-dim", svd_dim), ("--ngram-max", ngram_max)):
        if value is not None and fitted != "tfidf":
            raise UsageError(f"{flag} applies to tfidf only{where}")
    bm25_options = {k: v for k, v in (("analyzer", analyzer), ("k1", k1), ("b", b)) if v is not None}
    if bm25_options and fitted != "bm25":
        where = " (a fusion's --lexical bm25)" if family == "fusion" else ""
        raise UsageError(f"--{' --'.join(bm25_options)} applies to bm25 only{where}")
    bm25_config = BM25Config(**bm25_options) if fitted == "bm25" else None  # a wrong value fails now
    tfidf_options = {k: v for k, v in (("svd_dim", svd_dim), ("ngram_max", ngram_max)) if v is not None}
    if family == "fusion":
        options = tfidf_options if fitted == "tfidf" else bm25_options
        return _fit_fusion(
            input, output, format, text_field, lexical, model, validation, docs, normalization, weight,
            overwrite, options,
        )  # fmt: skip
    # all or nothing, under the output's lock from the start: a second fit to the same output fails at once
    with directory_output(output, MODEL_DIRECTORY, overwrite, inputs=[input]) as staging:
        texts = [doc.text for doc in common.reader(input, format, "id", text_field, False)]
        if family == "tfidf":
            model = fit_tfidf(texts, TfidfConfig(seed=settings.seed, **tfidf_options))
        else:
            model = fit_bm25(texts, bm25_config)
        model.save(staging)
    log(f"saved the fitted {family} model -> {output}")


#: a fusion's built-in lexical parts, by the family whose options (--svd-dim, --k1, ...) apply to them
FUSION_LEXICAL_FAMILY = {"tfidf": "tfidf", "tfidf-bigrams": "tfidf", "bm25": "bm25"}


def _fit_fusion(
    input, output, format, text_field, lexical, model, validation, docs, normalization, weight, overwrite,
    lexical_options,
):  # fmt: skip
    """Fit the lexical part (with `lexical_options` set on its config) on the corpus, choose the weight on
    --validation (or take --weight), save."""
    from docembed.errors import UsageError
    from docembed.io.outputs import directory_output
    from docembed.io.readers import iter_jsonl_lines
    from docembed.models.base import MODEL_DIRECTORY
    from docembed.models.families import get_family
    from docembed.models.fusion import fit_fusion
    from docembed.runtime import log, resolve_device
    from docembed.similarity import validation_queries

    if (validation is None) == (weight is None):
        raise UsageError("fusion: give --validation FILE (the weight is chosen on it) or a fixed --weight")
    common.resolve(f"{lexical}+{model}")  # both parts found (a name that is nothing fails) before reading
    inputs = [p for p in (input, validation, docs) if p]
    with directory_output(output, MODEL_DIRECTORY, overwrite, inputs=inputs) as staging:
        texts = [doc.text for doc in common.reader(input, format, "id", text_field, False)]
        queries = None
        if validation is not None:  # read (and a bad row refused) before a model loads
            doc_texts = None
            if docs:
                doc_texts = {d.id: d.text for d in common.reader(docs, None, "id", text_field, False)}
            queries = validation_queries(iter_jsonl_lines(validation), validation, doc_texts)
        fusion = get_family("fusion").from_parts(
            lexical, model, resolve_device(), normalization=normalization
        )
        for key, value in lexical_options.items():
            setattr(fusion.lexical.config, key, value)
        if queries is None:
            fusion.fit(texts)
            fusion.config.weight = weight
            fusion.config.long_query_weight = None  # the weight given, for every query
        else:
            fit_fusion(fusion, texts, queries, description=f"queries of {validation}")
        fusion.save(staging)
    log(f"saved the fusion {lexical}+{model} (weight {fusion.weights_text()} of the model) -> {output}")

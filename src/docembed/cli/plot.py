"""docembed plot: a 2-D t-SNE map of embeddings, coloured by label (needs the `plot` extra: matplotlib)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("plot")(plot)


def plot(
    embeddings: str = typer.Argument(..., help="Embeddings file (.npy .npz .safetensors .parquet .jsonl)."),
    labels: str = typer.Option(
        ...,
        "--labels",
        "-l",
        help="JSONL with id and label fields (e.g. the data set itself), or a text file "
        "with one label per line in the embeddings' order.",
    ),
    output: str = typer.Option(..., "--output", "-o", help="Image file (.png, .svg, .pdf)."),
    label_field: str = typer.Option("label", "--label-field", help="JSON field holding the label."),
    id_field: str = typer.Option("id", "--id-field", help="JSON field holding the document id."),
    max_points: int = typer.Option(5000, "--max-points", min=10, help="Plot a random sample of this many."),
    perplexity: float = typer.Option(30.0, "--perplexity", min=1.0, help="t-SNE perplexity."),
    title: str = typer.Option(None, "--title", help="Figure title (default: the model name and file)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output."),
) -> None:
    """t-SNE map of EMBEDDINGS coloured by label. Multi-vector embeddings are mean-pooled first.

    Example: docembed plot docs.npy --labels docs.jsonl -o map.png
    """
    from docembed.errors import DocembedError
    from docembed.io.embeddings import check_output_path, load_embeddings
    from docembed.runtime import log, settings

    check_output_path(output, overwrite)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DocembedError("plot needs matplotlib: pip install 'docembed[plot]'") from None
    _check_image_format(output)
    import numpy as np

    emb = load_embeddings(embeddings)
    vectors = _dense(emb.data)
    names = _labels(labels, emb.ids, label_field, id_field)
    rng = np.random.default_rng(settings.seed)
    keep = np.arange(len(vectors))
    if len(keep) > max_points:
        keep = np.sort(rng.choice(len(keep), size=max_points, replace=False))
    if len(keep) < 3:
        raise DocembedError(f"{embeddings} holds {len(keep)} embeddings; a map needs at least 3")
    log(f"t-SNE of {len(keep)} of {len(vectors)} embeddings (dim {vectors.shape[1]})")
    points = _tsne(vectors[keep], perplexity, settings.seed)
    kept_labels = [names[i] for i in keep]
    classes = sorted(set(kept_labels))
    index = {name: i for i, name in enumerate(classes)}
    colours = plt.get_cmap("tab20" if len(classes) <= 20 else "nipy_spectral")
    figure, axes = plt.subplots(figsize=(9, 7), dpi=90)
    codes = np.array([index[name] for name in kept_labels])
    for i, name in enumerate(classes):
        rows = codes == i
        colour = colours(i % 20) if len(classes) <= 20 else colours(i / max(len(classes) - 1, 1))
        axes.scatter(points[rows, 0], points[rows, 1], s=3, color=colour, label=name, linewidths=0, alpha=0.8)
    axes.set_xticks([])
    axes.set_yticks([])
    axes.set_title(title or f"{emb.metadata.get('model', '')} ({embeddings})", fontsize=10)
    if len(classes) <= 30:
        axes.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, markerscale=3, frameon=False)
    figure.tight_layout()
    figure.savefig(output)
    plt.close(figure)
    log(f"map of {len(keep)} points, {len(classes)} labels -> {output}")


def _check_image_format(output: str) -> None:
    """Before any work: an output matplotlib cannot write (map.exe, no suffix) is a usage error."""
    from pathlib import Path

    from matplotlib.backend_bases import FigureCanvasBase

    from docembed.errors import UsageError

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(output).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise UsageError(
            f"cannot tell the image format of {output!r}: use one of .{', .'.join(sorted(formats))}"
        )


def _dense(data):
    import numpy as np

    from docembed.types import MultiVectors

    if isinstance(data, MultiVectors):
        counts = np.maximum(data.counts, 1)[:, None]
        sums = np.zeros((len(data), data.dim), dtype=np.float64)
        owners = np.repeat(np.arange(len(data)), data.counts)
        np.add.at(sums, owners, data.vectors)
        return (sums / counts).astype(np.float32)
    return np.asarray(data, dtype=np.float32)


def _labels(path: str, ids: list[str], label_field: str, id_field: str) -> list[str]:
    """One label per embedding: by id from a JSONL file, by position from a text file."""
    from docembed.errors import DocembedError
    from docembed.io.readers import infer_format, iter_jsonl

    try:
        is_jsonl = infer_format(path) == "jsonl"
    except DocembedError:
        is_jsonl = False
    if is_jsonl:
        by_id = {}
        for record in iter_jsonl(path):
            if id_field not in record or label_field not in record:
                raise DocembedError(f"{path}: records need {id_field!r} and {label_field!r} fields")
            by_id[str(record[id_field])] = str(record[label_field])
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise DocembedError(
                f"{path} has no label for {len(missing)} embedding id(s), e.g. {missing[0]!r}"
            )
        return [by_id[i] for i in ids]
    from pathlib import Path

    if not Path(path).exists():
        raise DocembedError(f"labels file not found: {path}")
    # lines end at \n only (str.splitlines would also split a label at \v, \f, U+2028 ... and shift the rest)
    lines = [line.removesuffix("\r") for line in Path(path).read_text(encoding="utf-8").split("\n")]
    lines = lines[:-1] if lines and lines[-1] == "" else lines
    if len(lines) != len(ids):
        raise DocembedError(
            f"{path} has {len(lines)} labels for {len(ids)} embeddings (one per line, in order)"
        )
    return lines


def _tsne(vectors, perplexity: float, seed: int):
    """2-D t-SNE of the L2-normalised vectors (Euclidean there is a monotone function of cosine), after PCA to
    50 dimensions when there are more (the usual speed-up; PCA keeps most of those distances)."""
    import numpy as np
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    if vectors.shape[1] > 50 and len(vectors) > 50:
        vectors = PCA(n_components=50, random_state=seed).fit_transform(vectors)
    perplexity = min(perplexity, max((len(vectors) - 1) / 3, 1.0))
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed)
    return tsne.fit_transform(vectors)

"""docembed plot: a 2-D t-SNE map of embeddings, coloured by label (needs the `plot` extra: matplotlib)."""

from __future__ import annotations

from dataclasses import dataclass

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
    _check_image_format(output)
    # the inputs before matplotlib (a second of imports): a wrong file or field fails at once
    emb = load_embeddings(embeddings)
    names = _labels(labels, emb.ids, label_field, id_field)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DocembedError("plot needs matplotlib: pip install 'docembed[plot]'") from None
    import numpy as np

    vectors = _dense(emb.data)
    rng = np.random.default_rng(settings.seed)
    keep = np.arange(len(vectors))
    if len(keep) > max_points:
        keep = np.sort(rng.choice(len(keep), size=max_points, replace=False))
    if len(keep) < 3:
        raise DocembedError(f"{embeddings} holds {len(keep)} embeddings; a map needs at least 3")
    log(f"t-SNE of {len(keep)} of {len(vectors)} embeddings (dim {vectors.shape[1]})")
    points = _tsne(vectors[keep], perplexity, settings.seed)
    kept_labels = [names[i] for i in keep]
    figure, axes = plt.subplots(figsize=(9, 7), dpi=110)
    size, alpha = _marker(len(keep))
    for group in _groups(kept_labels):
        axes.scatter(
            points[group.rows, 0],
            points[group.rows, 1],
            s=size,
            color=group.colour,
            label=group.legend,
            linewidths=0,
            alpha=alpha,
            zorder=1 if group.other else 2,  # the grey "other" points lie under the named ones
        )
    axes.set_xticks([])
    axes.set_yticks([])
    axes.set_title(title or f"{emb.metadata.get('model', '')} ({embeddings})", fontsize=10)
    legend = axes.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    for handle in legend.legend_handles:  # legend dots of one readable size, opaque, whatever the points
        handle.set_sizes([30])
        handle.set_alpha(1.0)
    figure.tight_layout()
    figure.savefig(output)
    plt.close(figure)
    log(f"map of {len(keep)} points, {len(set(kept_labels))} labels -> {output}")


# Categorical colours: tab10 for up to 10 labels; tab20 for up to 20, its dark shades first so that the
# first 10 labels differ in hue (tab20 pairs each hue's dark and light shade). Beyond 20 labels the most
# frequent 18 keep a colour and the rest are drawn in grey as "other" (tab20's two greys are left out then).
MAX_COLOURED = 20
OTHER_GREY = "#b0b0b0"


@dataclass
class _Group:
    legend: str
    rows: object  # a boolean mask over the points
    colour: tuple
    other: bool = False


def _palette(count: int, with_other: bool) -> list:
    import matplotlib

    if count <= 10 and not with_other:
        return list(matplotlib.colormaps["tab10"].colors)
    tab20 = matplotlib.colormaps["tab20"].colors
    colours = [*tab20[0::2], *tab20[1::2]]
    if with_other:
        greys = {tab20[14], tab20[15]}
        colours = [c for c in colours if c not in greys]
    return colours


def _groups(labels: list[str]) -> list[_Group]:
    """One group per label (by count, then name), with a distinct colour and "name (count)" for the legend;
    beyond MAX_COLOURED labels, the least frequent share one grey "other" group."""
    from collections import Counter

    import numpy as np

    counts = Counter(labels)
    ordered = sorted(counts, key=lambda name: (-counts[name], name))
    with_other = len(ordered) > MAX_COLOURED
    palette = _palette(len(ordered), with_other)
    named = ordered[: len(palette)] if with_other else ordered
    values = np.array(labels, dtype=object)
    groups = [
        _Group(f"{name} ({counts[name]:,})", values == name, palette[i]) for i, name in enumerate(named)
    ]
    rest = ordered[len(named) :]
    if rest:
        rows = ~np.isin(values, named)
        legend = f"other: {len(rest):,} labels ({int(rows.sum()):,})"
        groups.append(_Group(legend, rows, OTHER_GREY, other=True))
    return groups


def _marker(points: int) -> tuple[float, float]:
    """(marker area in points^2, alpha): large opaque dots for a few points, smaller and translucent ones
    as they crowd, so that dense regions show their density instead of one blot."""
    import numpy as np

    size = float(np.clip(1500 / np.sqrt(max(points, 1)), 4, 60))
    alpha = float(np.clip(0.9 * np.sqrt(1000 / max(points, 1)), 0.35, 0.9))
    return size, alpha


IMAGE_FORMATS = (
    "avif",
    "eps",
    "gif",
    "jpeg",
    "jpg",
    "pdf",
    "pgf",
    "png",
    "ps",
    "raw",
    "rgba",
    "svg",
    "svgz",
    "tif",
    "tiff",
    "webp",
)


def _check_image_format(output: str) -> None:
    """Before any work: an output matplotlib cannot write (map.exe, no suffix) is a usage error."""
    from pathlib import Path

    from docembed.errors import UsageError

    formats = IMAGE_FORMATS  # matplotlib's (FigureCanvasBase.get_supported_filetypes), without importing it
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

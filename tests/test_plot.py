"""`docembed plot` (#47): categorical colours a person can tell apart, a legend with each label's name and
count, dots sized by how many there are, grey "other" beyond 20 labels."""

import numpy as np
import pytest

from cli_helpers import invoke

pytest.importorskip("matplotlib")


@pytest.fixture
def drawn(monkeypatch):
    """The figures `docembed plot` saves, kept for inspection."""
    import matplotlib.figure

    figures = []
    save = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return figures


def write_embeddings(tmp_path, labels: list[str]):
    from docembed.io.embeddings import save_embeddings
    from docembed.types import EmbeddingSet

    rng = np.random.default_rng(0)
    centres = {name: rng.normal(size=16) * 4 for name in sorted(set(labels))}
    vectors = np.stack([centres[name] + rng.normal(size=16) for name in labels]).astype(np.float32)
    ids = [f"d{i}" for i in range(len(labels))]
    path = tmp_path / "emb.npy"
    save_embeddings(EmbeddingSet(vectors, ids, {"model": "test"}), str(path))
    (tmp_path / "labels.txt").write_text("".join(f"{name}\n" for name in labels))
    return path, tmp_path / "labels.txt"


def plot(capfd, tmp_path, labels, drawn):
    embeddings, label_file = write_embeddings(tmp_path, labels)
    result = invoke(capfd, "plot", embeddings, "-l", label_file, "-o", tmp_path / "map.png")
    assert result.code == 0, result.err
    assert (tmp_path / "map.png").stat().st_size > 0
    (figure,) = drawn
    axes = figure.axes[0]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    colours = [tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in axes.collections]
    return axes, legend, colours


def test_two_labels_get_two_distinct_colours_and_a_legend_with_counts(capfd, tmp_path, drawn):
    axes, legend, colours = plot(capfd, tmp_path, ["spam"] * 30 + ["ham"] * 20, drawn)
    assert legend == ["spam (30)", "ham (20)"]  # by count
    assert len(set(colours)) == 2
    # not two shades of one hue (tab20's dark and light blue): tab10's blue and orange
    difference = np.abs(np.array(colours[0]) - np.array(colours[1])).sum()
    assert difference > 0.5, colours
    sizes = {float(c.get_sizes()[0]) for c in axes.collections}
    assert min(sizes) >= 20  # 50 points: large dots, not 2-pixel ones


def test_many_labels_keep_distinct_colours_and_the_rest_is_grey_other(capfd, tmp_path, drawn):
    labels = [f"label{i:02d}" for i in range(25) for _ in range(25 - i)]  # 25 labels, 25 .. 1 points
    _, legend, colours = plot(capfd, tmp_path, labels, drawn)
    assert legend[0] == "label00 (25)"
    assert legend[-1].startswith("other: 7 labels (")  # the least frequent 7, together
    assert legend[-1].endswith(f"({sum(range(1, 8))})")
    named = colours[:-1]
    assert len(named) == 18 and len(set(named)) == 18
    grey = colours[-1]
    assert grey[0] == grey[1] == grey[2] and grey not in named


def test_marker_size_and_alpha_follow_the_number_of_points():
    from docembed.cli.plot import _marker

    few, many = _marker(50), _marker(5000)
    assert few[0] > many[0] and few[1] > many[1]
    assert _marker(10**6)[0] >= 4 and _marker(10**6)[1] >= 0.35


def test_eleven_to_twenty_labels_differ_in_hue_first():
    from docembed.cli.plot import _groups

    groups = _groups([f"l{i:02d}" for i in range(12)])
    colours = [group.colour for group in groups]
    assert len(set(colours)) == 12
    # the first ten are tab20's dark shades: ten hues, not five dark/light pairs
    assert len({tuple(np.round(c, 3)) for c in colours[:10]}) == 10
    assert not any(group.other for group in groups)


def test_the_image_formats_checked_before_matplotlib_loads_are_its_own():
    from matplotlib.backend_bases import FigureCanvasBase

    from docembed.cli.plot import IMAGE_FORMATS

    assert sorted(IMAGE_FORMATS) == sorted(FigureCanvasBase.get_supported_filetypes())

"""Mistakes are caught before a model loads (#47): the model spec is resolved first (a name that is nothing,
a folder not trained yet, a hub id offline), each input's first record is read, and the options of the
root are taken after the command too. The model's load is replaced by a failure here, so a mistake that
is only found after loading shows as that failure."""

import json

import pytest

from cli_helpers import invoke
from docembed.cli import global_options_first
from docembed.errors import ModelNotFoundError
from docembed.models import registry
from docembed.models.registry import resolve_model


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails loudly: what these tests check must be found before it."""

    def refuse(self, device="cpu"):
        raise AssertionError(f"model {self.spec!r} loaded before the mistake was found")

    monkeypatch.setattr(registry.ResolvedModel, "load", refuse)


@pytest.fixture
def files(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        json.dumps({"id": "a", "text": "one"}) + "\n" + json.dumps({"id": "b", "text": "two"}) + "\n"
    )
    (tmp_path / "array.json").write_text(json.dumps([{"id": "a", "text": "one"}]) + "\n")
    (tmp_path / "broken.jsonl").write_text('{"id": "a", "text": "one}\n')
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"text1": "a", "text2": "b"}) + "\n")
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"source": "a", "candidates": ["b"]}) + "\n")
    (tmp_path / "repeated.jsonl").write_text(
        json.dumps({"source": "a", "candidates": ["b", "a", "b"]}) + "\n"
    )
    (tmp_path / "queries.jsonl").write_text(json.dumps({"query": "a", "candidates": ["one", "two"]}) + "\n")
    return tmp_path


# --- the resolver ------------------------------------------------------------------------------------------
def test_a_misspelt_name_gets_a_did_you_mean_and_the_built_ins():
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("sbrt")
    message = str(caught.value)
    assert "did you mean 'sbert'" in message and "Built-ins:" in message and "glove-avg" in message


def test_a_folder_not_trained_yet_is_not_taken_for_a_hub_id_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("models/student")
    message = str(caught.value)
    assert "no model folder models/student" in message and "built-in 'student'" in message


def test_a_hub_id_is_accepted_online_or_when_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert resolve_model("org/some-model").kind == "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError):
        resolve_model("org/some-model")
    (tmp_path / "models--org--some-model" / "snapshots" / "abc").mkdir(parents=True)
    assert resolve_model("org/some-model").kind == "hub"


@pytest.mark.parametrize(
    ("spec", "builtin"),
    [
        ("all-MiniLM-L6-v2", "sbert"),
        ("sentence-transformers/all-MiniLM-L6-v2", "sbert"),
        ("all-mpnet-base-v2", "sbert-mpnet"),
    ],
)
def test_sentence_transformers_names_are_the_built_ins_they_are(spec, builtin):
    resolved = resolve_model(spec)
    assert (resolved.kind, resolved.name) == ("builtin", builtin)


def test_a_fusion_resolves_both_parts_at_once():
    resolved = resolve_model("bm25+sbert")
    assert resolved.kind == "fusion" and [p.name for p in resolved.parts] == ["bm25", "sbert"]
    with pytest.raises(ModelNotFoundError, match="did you mean 'sbert'"):
        resolve_model("bm25+sbrt")


def test_a_folder_without_a_model_is_refused_by_the_resolver(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    with pytest.raises(Exception, match="notes"):
        resolve_model(str(tmp_path / "notes"))


# --- commands: the mistake, never the load -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["encode", "{d}/missing.jsonl", "-m", "sbert"], "input file not found"),
        (["encode", "{d}/docs.jsonl", "-m", "sbert", "--text-field", "body"], "text field 'body' missing"),
        (["encode", "{d}/array.json", "-m", "sbert"], "a JSON array"),
        (["encode", "{d}/broken.jsonl", "-m", "sbert"], "malformed JSON at column"),
        (["encode", "{d}/docs.jsonl", "-m", "sbrt"], "did you mean 'sbert'"),
        (["encode", "{d}/docs.jsonl", "-m", "sbert", "--long", "bogus"], "--long is one of"),
        (["encode", "{d}/docs.jsonl", "-m", "sbert", "--backend", "bogus"], "backend must be one of"),
        (["encode", "{d}/docs.jsonl", "-m", "sbert", "--precision", "int4"], "precision must be one of"),
        (["encode", "{d}/docs.jsonl", "-m", "student", "--max-length", "-5"], "--max-length must be >= 2"),
        (
            ["encode", "{d}/docs.jsonl", "-m", "sbert-windows", "--long-queries", "x"],
            "long_queries is one of",
        ),
        (["encode", "{d}/docs.jsonl", "-m", "sbert", "--reuse", "{d}/gone.npy"], "not found"),
        (["similarity", "--pairs", "{d}/pairs.jsonl", "--left-field", "left"], "field 'left' missing"),
        (["similarity", "a", "b", "-m", "{d}/models/student"], "no model folder"),
        (["rerank", "{d}/tasks.jsonl", "-m", "sbert"], "need --docs"),
        (["rerank", "{d}/tasks.jsonl", "--docs", "{d}/pairs.jsonl", "-m", "sbert"], "text field 'text'"),
        (["rerank", "{d}/tasks.jsonl", "-d", "{d}/docs.jsonl", "-m", "sbert", "--passages"], "are passages"),
        (
            ["rerank", "{d}/tasks.jsonl", "-d", "{d}/docs.jsonl", "-m", "tfidf+student", "--passages"],
            "passages",
        ),
        (["rerank", "{d}/queries.jsonl", "-m", "sbert", "--output-format", "trec"], "needs id rows"),
        (["rerank", "{d}/repeated.jsonl", "-d", "{d}/docs.jsonl", "-m", "sbert"], "ids given twice: b"),
        (["similarity", "a", "b", "-m", "bm25+sbert"], "a single pair needs"),
        (["similarity", "--pairs", "{d}/pairs.jsonl", "-m", "tfidf+retriever"], "a single pair needs"),
        (["inspect", "{d}/docs.jsonl", "-m", "{d}/models/nugget"], "no model folder"),
        (["export", "sbrt", "-o", "{d}/out"], "did you mean 'sbert'"),
        (["train-setenc", "{d}/missing.jsonl", "-o", "{d}/se"], "input file not found"),
        (["train-nugget", "{d}/missing.jsonl", "-o", "{d}/ng"], "input file not found"),
        (["train-distill", "{d}/missing.jsonl", "-o", "{d}/st"], "input file not found"),
        (["train-quickthoughts", "{d}/missing.jsonl", "-o", "{d}/qt"], "input file not found"),
        (["distill-static", "{d}/missing.jsonl", "-o", "{d}/static"], "input file not found"),
    ],
)
def test_a_mistake_is_reported_before_the_model_loads(capfd, no_loading, files, args, expected):
    result = invoke(capfd, *[a.format(d=files) for a in args])
    assert result.code != 0
    assert expected in result.err, result.err
    assert "loaded before" not in result.err and len(result.err.strip().splitlines()) == 1


def test_search_checks_its_query_file_and_model_before_loading(capfd, files, monkeypatch):
    assert (
        invoke(capfd, "-q", "encode", files / "docs.jsonl", "-m", "glove-avg", "-o", files / "e.npy").code
        == 0
    )
    assert invoke(capfd, "-q", "index", "build", files / "e.npy", "-o", files / "e.index").code == 0
    monkeypatch.setattr(registry.ResolvedModel, "load", lambda self, device="cpu": 1 / 0)
    missing = invoke(capfd, "search", files / "e.index", "--queries", files / "missing.txt")
    assert missing.code == 1 and "input file not found" in missing.err
    wrong = invoke(capfd, "search", files / "e.index", "--query", "x", "-m", files / "models" / "nugget")
    assert wrong.code == 1 and "no model folder" in wrong.err
    both = invoke(capfd, "search", files / "e.index", "--query", "x", "--queries", files / "docs.jsonl")
    assert both.code == 2 and "not both" in both.err  # else the file's rows were the only queries
    liked = invoke(capfd, "search", files / "e.index", "--id", "a", "--hybrid")
    assert liked.code == 2 and "--hybrid fuses a query text" in liked.err  # else plain cosines, silently
    lexical = files / "b.index"
    assert invoke(capfd, "-q", "index", "build", files / "docs.jsonl", "-t", "bm25", "-o", lexical).code == 0
    for spec, expected in (("glove-avg", "LEXICAL+MODEL"), ("tfidf+glove-avg", "lexical part is tfidf")):
        hybrid = invoke(
            capfd, "search", files / "e.index", "--lexical-index", lexical, "--query", "x", "-m", spec
        )
        assert hybrid.code == 2 and expected in hybrid.err, hybrid.err


def test_a_json_error_says_where_on_the_line(capfd, files):
    result = invoke(capfd, "encode", files / "broken.jsonl", "-m", "glove-avg")
    assert "broken.jsonl:1: malformed JSON at column 21" in result.err


# --- the root's options after the command ------------------------------------------------------------------
def test_global_options_are_moved_before_the_command():
    assert global_options_first(["encode", "x.jsonl", "-q", "-m", "sbert"]) == [
        "-q",
        "encode",
        "x.jsonl",
        "-m",
        "sbert",
    ]
    assert global_options_first(["encode", "x", "--device", "cpu", "--seed=3"]) == [
        "--device",
        "cpu",
        "--seed=3",
        "encode",
        "x",
    ]
    # `--` ends options
    assert global_options_first(["similarity", "--", "-q", "b"]) == ["similarity", "--", "-q", "b"]
    assert global_options_first(["-v", "index", "search", "i", "-q"]) == ["-v", "-q", "index", "search", "i"]


def test_a_commands_own_option_of_the_same_name_stays_its_own(monkeypatch):
    import docembed.cli

    monkeypatch.setattr(docembed.cli, "_command_options", lambda name: {"--seed"})
    assert global_options_first(["evaluate", "t", "--seed", "3", "-q"]) == [
        "-q",
        "evaluate",
        "t",
        "--seed",
        "3",
    ]


def test_quiet_after_the_command_silences_it(capfd, files):
    result = invoke(capfd, "encode", files / "docs.jsonl", "-m", "glove-avg", "-o", files / "q.npy", "-q")
    assert result.code == 0 and result.err == ""
    loud = invoke(capfd, "encode", files / "docs.jsonl", "-m", "glove-avg", "-o", files / "v.npy")
    assert "encoded 2 documents" in loud.err


# --- README lines that failed as written -------------------------------------------------------------------
def test_reuse_of_the_output_itself_needs_no_overwrite(capfd, files):
    out = files / "docs.npy"
    assert invoke(capfd, "-q", "encode", files / "docs.jsonl", "-m", "glove-avg", "-o", out).code == 0
    again = invoke(capfd, "encode", files / "docs.jsonl", "-m", "glove-avg", "--reuse", out, "-o", out)
    assert again.code == 0, again.err
    assert "encoded 0 new or changed of 2 documents" in again.err


def test_fit_says_what_it_does_without_a_temporary_path(capfd, files):
    result = invoke(capfd, "encode", files / "docs.jsonl", "-m", "tfidf", "--fit", "-o", files / "t.npy")
    assert result.code == 0, result.err
    assert "--fit: fitting tfidf on" in result.err and f"-> {files / 't.model'}" in result.err
    assert ".tmp" not in result.err


@pytest.mark.parametrize(
    "command", ["train-setenc", "train-quickthoughts", "train-nugget", "train-retriever", "train-distill"]
)
def test_a_trained_model_is_never_trained_over_without_resume(capfd, no_loading, files, command):
    """Every train-* command refuses an output that holds a model (its weights are someone's result) in
    one line, before anything loads; a bad --amp value is refused there too."""
    held = files / "held"
    assert invoke(capfd, "-q", "fit", "tfidf", files / "docs.jsonl", "-o", held).code == 0
    before = (held / "model.safetensors").read_bytes()
    result = invoke(capfd, command, files / "docs.jsonl", "-o", held)
    assert result.code == 1 and "already holds a model: pass --resume" in result.err, result.err
    assert (held / "model.safetensors").read_bytes() == before
    result = invoke(capfd, command, files / "docs.jsonl", "-o", files / "new", "--amp", "bf61")
    assert result.code == 2 and "--amp is one of" in result.err and not (files / "new").exists()

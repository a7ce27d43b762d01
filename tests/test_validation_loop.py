"""Validation inside the training loop: the hook's steps, the log lines, the best weights kept and saved
(or the last with save_last), resume keeping a better best, two torchrun ranks, the task-scoring hook, and
train-setenc / train-quickthoughts with --eval-every end to end."""

import gzip
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from docembed.cli import app
from docembed.errors import DocembedError, UsageError
from docembed.evaluation.base import EvalOptions
from docembed.evaluation.validation import Validation
from docembed.models.base import Encoder
from docembed.training.loop import TrainConfig, train
from toy_recipe import LinearRegression, ToyRecipe

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "music",
    "paper",
    "window",
    "garden",
    "silver",
    "forest",
    "candle",
    "orbit",
]


class ScriptedValidation:
    """A validate hook returning scripted scores, keeping a copy of the weights it saw at each call."""

    primary_metric = "score"

    def __init__(self, recipe, scores):
        self.recipe, self.scores = recipe, list(scores)
        self.seen = []  # (weights, training mode, grad enabled)

    def __call__(self, device):
        module = self.recipe.module
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        self.seen.append((weights, module.training, torch.is_grad_enabled()))
        return {"score": self.scores[len(self.seen) - 1], "other": 0.5}


def eval_lines(directory):
    lines = [json.loads(line) for line in (directory / "train_log.jsonl").read_text().splitlines()]
    return [line for line in lines if "eval" in line]


def saved_weights(directory):
    return {k: torch.tensor(v) for k, v in json.loads((directory / "weights.json").read_text()).items()}


def same(left, right):
    return all(torch.allclose(left[k], right[k], atol=1e-7) for k in left)


def test_validation_runs_every_n_steps_and_at_the_end_and_the_best_weights_are_saved(tmp_path):
    recipe = ToyRecipe(n_batches=5)
    hook = ScriptedValidation(recipe, [1.0, 3.0, 2.0])
    config = TrainConfig(output_dir=str(tmp_path), epochs=1, lr=0.05, eval_every=2)
    summary = train(recipe, config, validate=hook)
    lines = eval_lines(tmp_path)
    assert [line["step"] for line in lines] == [2, 4, 5]
    assert [line["eval"]["score"] for line in lines] == [1.0, 3.0, 2.0]
    assert [line["best"] for line in lines] == [True, True, False] and lines[0]["eval"]["other"] == 0.5
    # eval mode and no_grad during the hook, training mode again after it
    assert all(not training and not grad for _, training, grad in hook.seen)
    at_step_4 = hook.seen[1][0]
    assert not same(at_step_4, hook.seen[2][0])  # the weights did move after step 4
    best = load_file(str(tmp_path / "best" / "model.safetensors"))
    assert same(at_step_4, best)
    assert json.loads((tmp_path / "best" / "state.json").read_text())["step"] == 4
    # the recipe saved the best-validated weights, not the last
    assert same(at_step_4, saved_weights(tmp_path))
    assert summary["best"] == {"step": 4, "metric": "score", "score": 3.0} and summary["saved"] == "best"


def test_save_last_keeps_the_last_weights(tmp_path):
    recipe = ToyRecipe(n_batches=5)
    hook = ScriptedValidation(recipe, [1.0, 3.0, 2.0])
    config = TrainConfig(output_dir=str(tmp_path), epochs=1, lr=0.05, eval_every=2, save_last=True)
    summary = train(recipe, config, validate=hook)
    assert same(hook.seen[2][0], saved_weights(tmp_path)) and not same(
        hook.seen[1][0], saved_weights(tmp_path)
    )
    assert same(hook.seen[1][0], load_file(str(tmp_path / "best" / "model.safetensors")))
    assert summary["best"]["step"] == 4 and summary["saved"] == "last"


class DropoutRegression(LinearRegression):
    def forward(self, batch):
        x, y = batch
        x = torch.nn.functional.dropout(x, 0.3, self.training)
        return super().forward((x, y))


class DropoutRecipe(ToyRecipe):
    def __init__(self):
        super().__init__(n_batches=6)
        self.module = DropoutRegression()


def test_validation_leaves_the_training_run_unchanged(tmp_path):
    """A hook that draws random numbers changes neither the dropout masks nor the trained weights."""

    def noisy(device):
        return {"score": float(torch.rand(1))}

    plain, validated = tmp_path / "plain", tmp_path / "validated"
    train(DropoutRecipe(), TrainConfig(output_dir=str(plain), epochs=2, lr=0.05))
    config = TrainConfig(output_dir=str(validated), epochs=2, lr=0.05, eval_every=1, save_last=True)
    train(DropoutRecipe(), config, validate=noisy)
    assert len(eval_lines(validated)) == 12
    assert same(saved_weights(plain), saved_weights(validated))


def test_resume_keeps_a_better_best_and_a_fresh_run_forgets_it(tmp_path):
    def config(**changes):
        return TrainConfig(output_dir=str(tmp_path), epochs=1, lr=0.05, eval_every=2, **changes)

    first = ToyRecipe(n_batches=8)
    hook = ScriptedValidation(first, [5.0, 1.0])
    train(first, config(max_steps=4), validate=hook)
    best_at_2 = hook.seen[0][0]
    resumed = ToyRecipe(n_batches=8)
    summary = train(resumed, config(resume=True), validate=ScriptedValidation(resumed, [2.0, 3.0]))
    assert [line["step"] for line in eval_lines(tmp_path)] == [2, 4, 6, 8]
    assert summary["best"] == {"step": 2, "metric": "score", "score": 5.0}
    assert same(best_at_2, saved_weights(tmp_path))  # the first run's best, loaded back at the end

    # resuming the finished run trains nothing and does not validate the same weights again
    again = ScriptedValidation(ToyRecipe(n_batches=8), [])
    train(again.recipe, config(resume=True), validate=again)
    assert again.seen == [] and len(eval_lines(tmp_path)) == 4

    fresh = ToyRecipe(n_batches=8)
    summary = train(fresh, config(), validate=ScriptedValidation(fresh, [-1.0, -2.0, -3.0, -4.0]))
    assert summary["best"] == {"step": 2, "metric": "score", "score": -1.0}


def test_eval_every_without_a_hook_and_test_splits_are_refused(tmp_path):
    from docembed.cli.training_options import LoopOptions

    with pytest.raises(UsageError, match="--eval-task"):
        train(ToyRecipe(), TrainConfig(output_dir=str(tmp_path), eval_every=2))
    with pytest.raises(UsageError, match="--eval-task"):
        LoopOptions(eval_every=2)
    with pytest.raises(UsageError, match="stsb: a test split"):
        LoopOptions(eval_every=2, eval_tasks="stsb-dev,stsb")
    with pytest.raises(UsageError, match="unknown task"):
        LoopOptions(eval_every=2, eval_tasks="stsb-devv")
    assert LoopOptions().validation(None) is None


@pytest.mark.slow  # builds the long-document validation tasks from the data root: about a minute
def test_the_long_validation_tasks_score_with_their_mean():
    from docembed.cli.training_options import LoopOptions

    assert LoopOptions(eval_tasks="long-val").validation(None).primary_metric == "score"


# --- the task-scoring hook ----------------------------------------------------------------------------------
def build_data_root(root, pairs=24, seed=0):
    """senteval/stsb-dev: pairs whose score is their word overlap (a bag of words ranks them well)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(pairs):
        a = list(rng.choice(WORDS, size=4, replace=False))
        overlap = i % 5
        b = a[:overlap] + list(rng.choice([w for w in WORDS if w not in a], size=4 - overlap, replace=False))
        rows.append({"id": str(i), "s1": " ".join(a), "s2": " ".join(b), "score": float(overlap)})
    path = root / "senteval" / "stsb-dev.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return root


class _Config:
    def to_dict(self):
        return {}


class SwitchableEncoder(Encoder):
    """A bag of words, or (after `scramble`) seeded random vectors: its output changes between calls like a
    model's in training."""

    family = "switchable-test"

    def __init__(self):
        super().__init__(_Config(), name="switchable")
        self.scrambled = False
        self.devices = []

    def encode(self, texts, batch_size=32):
        if self.scrambled:
            return np.random.default_rng(7).normal(size=(len(texts), len(WORDS))).astype(np.float32)
        return np.array([[float(w in t.split()) for w in WORDS] for t in texts], dtype=np.float32)

    def to(self, device):
        self.devices.append(device)
        return self

    def save(self, directory):  # pragma: no cover - never saved
        raise NotImplementedError

    @classmethod
    def load(cls, directory, device="cpu"):  # pragma: no cover
        raise NotImplementedError


def test_validation_hook_scores_selection_tasks_afresh_each_call(tmp_path):
    root = build_data_root(tmp_path / "data")
    encoder = SwitchableEncoder()
    hook = Validation(encoder, "stsb-dev", EvalOptions(data_root=str(root), limit=20))
    first = hook("cpu")
    assert set(first) == {"score", "stsb-dev/spearman"} and first["score"] == first["stsb-dev/spearman"]
    assert first["score"] > 80 and encoder.devices == ["cpu"]
    encoder.scrambled = True
    assert hook("cpu")["score"] < first["score"] - 30  # not served from the embedding cache
    with pytest.raises(DocembedError, match="not found"):  # missing data fails when the hook is built
        Validation(encoder, "sick-dev", EvalOptions(data_root=str(root)))


def test_train_setenc_with_eval_every_writes_eval_lines_and_saves_the_best(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCEMBED_DATA", str(build_data_root(tmp_path / "data")))
    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text("".join(" ".join(rng.choice(WORDS, size=10)) + "\n" for _ in range(40)))
    out = tmp_path / "model"
    args = ["train-setenc", str(corpus), "-o", str(out), "--epochs", "3", "-b", "20", "--buckets", "256"]
    args += ["--dim", "16", "--word-dim", "16", "--heads", "2", "--hidden", "16"]
    args += ["--eval-every", "2", "--eval-task", "stsb-dev", "--eval-limit", "16"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = eval_lines(out)
    assert [line["step"] for line in lines] == [2, 4, 6]
    assert all(set(line["eval"]) == {"score", "stsb-dev/spearman"} for line in lines)
    best = json.loads((out / "best" / "state.json").read_text())
    assert best["score"] == pytest.approx(max(line["eval"]["score"] for line in lines), abs=1e-5)
    # the saved model holds the best weights (the objective's state names the set encoder `network.`)
    saved, kept = (
        load_file(str(out / "model.safetensors")),
        load_file(str(out / "best" / "model.safetensors")),
    )
    assert saved and all(torch.equal(tensor, kept[f"network.{key}"]) for key, tensor in saved.items())


DDP_SCRIPT = """
import json, os, sys
sys.path.insert(0, {tests!r})
from toy_recipe import ToyRecipe
from docembed.training.loop import TrainConfig, train

class Scripted:
    primary_metric = "score"
    scores = [1.0, 3.0, 2.0]
    def __call__(self, device):
        return {{"score": self.scores.pop(0)}}

out = sys.argv[1]
recipe = ToyRecipe(n_batches=10)
summary = train(recipe, TrainConfig(output_dir=out, epochs=1, lr=0.05, eval_every=2), validate=Scripted())
weights = {{k: v.tolist() for k, v in recipe.module.state_dict().items()}}
with open(os.path.join(out, "rank" + os.environ["RANK"] + ".json"), "w") as handle:
    json.dump({{"weights": weights, "saved": summary["saved"]}}, handle)
"""


def test_validation_under_two_torchrun_ranks(tmp_path):
    """Rank 0 validates while rank 1 waits; both ranks end with the best weights, which rank 0 saves."""
    from pathlib import Path

    from cli_helpers import torchrun

    script = tmp_path / "validated.py"
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parent)))
    out = tmp_path / "ddp"
    proc = torchrun(out, script=script, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # 10 global batches over 2 ranks: 5 steps, validated at 2, 4 and 5 (the scores run out otherwise)
    assert [line["step"] for line in eval_lines(out)] == [2, 4, 5]
    best = load_file(str(out / "best" / "model.safetensors"))
    for rank in (0, 1):
        state = json.loads((out / f"rank{rank}.json").read_text())
        assert state["saved"] == "best" and same(
            best, {k: torch.tensor(v) for k, v in state["weights"].items()}
        )
    assert same(best, saved_weights(out))


def test_train_quickthoughts_validates_the_network_it_trains_and_save_last(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCEMBED_DATA", str(build_data_root(tmp_path / "data")))
    rng = np.random.default_rng(0)
    corpus = tmp_path / "corpus.txt"  # one document per line, six sentences each
    corpus.write_text(
        "".join(
            " ".join(" ".join(rng.choice(WORDS, size=5)) + "." for _ in range(6)) + "\n" for _ in range(20)
        )
    )
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("3 4\napple 1 0 0 0\nriver 0 1 0 0\nstone 0 0 1 0\n")
    out = tmp_path / "qt"
    args = ["-q", "train-quickthoughts", str(corpus), "-o", str(out), "--vectors", str(vectors)]
    args += ["--hidden", "8", "--min-count", "1", "--batch-size", "16", "--epochs", "1"]
    args += ["--eval-every", "3", "--eval-task", "stsb-dev", "--save-last"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "train_summary.json").read_text())
    steps = summary["steps"]  # 120 sentences in batches of 16: 8 steps
    assert [line["step"] for line in eval_lines(out)] == [*range(3, steps, 3), steps]
    assert summary["saved"] == "last" and summary["best"]["metric"] == "score"
    best = json.loads((out / "best" / "state.json").read_text())
    assert best["step"] == summary["best"]["step"] and set(best["eval"]) == {"score", "stsb-dev/spearman"}

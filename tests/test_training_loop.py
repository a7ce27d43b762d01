"""The one shared training loop: optimisation, resume, accumulation, and DDP with two gloo processes."""

import json
from pathlib import Path

import pytest
import torch

from docembed.training.loop import TrainConfig, train
from toy_recipe import ToyRecipe

HERE = Path(__file__).parent


def weights(directory):
    return json.loads((Path(directory) / "weights.json").read_text())


class DroppedInputs(torch.nn.Module):
    """The toy regression with dropout on its inputs: each step draws from torch's random state."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.linear, self.dropout = linear, torch.nn.Dropout(0.5)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.linear(self.dropout(x)).squeeze(-1) - y) ** 2).mean()}


class DropoutRecipe(ToyRecipe):
    def __init__(self):
        super().__init__()
        self.module = DroppedInputs(self.module.linear)


def test_loss_goes_down_and_log_is_written(tmp_path):
    summary = train(ToyRecipe(), TrainConfig(output_dir=str(tmp_path), epochs=3, lr=0.05, log_every=2))
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert summary["steps"] == 36 and log[-1]["loss"] < log[0]["loss"] / 10
    assert {"mse", "rows/s", "step", "epoch"} <= set(log[0])
    assert (tmp_path / "checkpoint" / "model.safetensors").exists() and (tmp_path / "weights.json").exists()


@pytest.mark.parametrize("recipe", ["plain", "dropout"])  # dropout: the random state is restored too
def test_resume_continues_exactly(tmp_path, recipe):
    make = {"plain": ToyRecipe, "dropout": DropoutRecipe}[recipe]
    straight = tmp_path / "straight"
    train(make(), TrainConfig(output_dir=str(straight), epochs=2, lr=0.05))
    resumed = tmp_path / "resumed"
    train(make(), TrainConfig(output_dir=str(resumed), epochs=2, lr=0.05, max_steps=17))
    train(make(), TrainConfig(output_dir=str(resumed), epochs=2, lr=0.05, resume=True))
    state = json.loads((resumed / "checkpoint" / "state.json").read_text())
    assert state == {"step": 24, "epoch": 2, "batches_done_in_epoch": 0}
    for key, value in weights(straight).items():
        assert torch.allclose(torch.tensor(value), torch.tensor(weights(resumed)[key]), atol=1e-6)


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    summary = train(ToyRecipe(), TrainConfig(output_dir=str(tmp_path), epochs=1, grad_accum=3))
    assert summary["steps"] == 4


def test_non_finite_loss_stops_with_a_clear_error(tmp_path):
    recipe = ToyRecipe()
    with torch.no_grad():
        recipe.module.linear.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="loss is nan"):
        train(recipe, TrainConfig(output_dir=str(tmp_path), epochs=1))


def test_ddp_two_gloo_processes(tmp_path):
    """torchrun with 2 CPU ranks: each rank takes every other global batch, rank 0 alone writes."""
    from cli_helpers import torchrun

    out = tmp_path / "ddp"
    proc = torchrun(out, "2", script=HERE / "toy_recipe.py", timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "train_summary.json").read_text())
    # 12 global batches per epoch split over 2 ranks: 6 optimizer steps per epoch on each rank
    assert summary["world_size"] == 2 and summary["steps"] == 12
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
    # resume the 2-rank checkpoint with 1 process: it continues from the recorded position
    train(ToyRecipe(), TrainConfig(output_dir=str(out), epochs=3, lr=0.05, resume=True))
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 24


def test_torchrun_helper_kills_hung_ranks_on_timeout(tmp_path):
    """A rank that never ends (the gloo teardown hang this guards against) fails the test at the timeout
    instead of blocking it: the ranks run in sessions of their own and keep the output pipes open."""
    import time

    from cli_helpers import torchrun

    script = tmp_path / "hang.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)\n")
    started = time.perf_counter()
    with pytest.raises(AssertionError, match="timed out"):
        torchrun(script=script, timeout=20)
    assert time.perf_counter() - started < 60
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(script) in _cmdline(p)]
    assert leftovers == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_seed_reaches_torch_once_imported():
    from docembed.runtime import seed_everything

    seed_everything(7)
    first = torch.rand(3)
    seed_everything(7)
    assert torch.equal(first, torch.rand(3))


def test_ranks_take_equal_shares_and_drop_an_incomplete_last_group():
    from docembed.training.loop import DistEnv, _own_batches

    def share(rank, world, done, n=8):
        return [batch for _, batch in _own_batches(iter(range(n)), done, DistEnv(rank, world, rank))]

    assert share(0, 1, 3) == [3, 4, 5, 6, 7]
    # resumed after 1 of 8 global batches with 3 ranks: groups (1,2,3), (4,5,6); batch 7 is dropped
    assert [share(r, 3, 1) for r in range(3)] == [[1, 4], [2, 5], [3, 6]]
    positions = [end for end, _ in _own_batches(iter(range(8)), 1, DistEnv(0, 3, 0))]
    assert positions == [3, 6]  # the checkpoint records whole groups as done


def test_every_train_command_takes_the_same_loop_options(monkeypatch):
    # train-pv is the one exception: gensim's own trainer is the method (its loop options are gensim's).
    import typer.main
    from typer.testing import CliRunner

    from docembed.cli import app
    from docembed.cli.training_options import OPTION_NAMES

    monkeypatch.setenv("COLUMNS", "250")
    commands = typer.main.get_command(app).commands
    train_commands = sorted(name for name in commands if name.startswith("train-") and name != "train-pv")
    assert {"train-nugget", "train-distill", "train-quickthoughts", "train-setenc"} <= set(train_commands)
    for name in train_commands:
        options = {opt for param in commands[name].params for opt in param.opts}
        assert set(OPTION_NAMES) | {"--output", "-o", "--limit"} <= options, name
        help_text = CliRunner().invoke(app, [name, "--help"], terminal_width=250).output
        listed = [opt for opt in OPTION_NAMES if f" {opt} " in help_text]
        assert listed == OPTION_NAMES, (name, set(OPTION_NAMES) - set(listed))


def test_loop_options_reach_train_config(tmp_path):
    from docembed.cli.training_options import LoopOptions, loop_options

    seen = {}

    @loop_options(lr=0.5, amp="off")
    def command(corpus: str, loop: LoopOptions = None):
        seen["config"] = loop.train_config(tmp_path, seed=3, device="cpu")

    command(corpus="x", epochs=4, time_budget_s=9.0, eval_every=3, eval_tasks="stsb-dev", save_last=True)
    config = seen["config"]
    assert (config.lr, config.amp, config.epochs, config.time_budget_s) == (0.5, "off", 4, 9.0)
    assert (config.eval_every, config.save_last) == (3, True)
    assert (config.output_dir, config.seed, config.weight_decay) == (str(tmp_path), 3, 0.01)


def test_checkpoints_store_tied_weights_once_like_saved_models(tmp_path):
    from safetensors.torch import load_file
    from torch import nn

    from docembed.models.base import save_state_dict
    from docembed.training.loop import Checkpoint

    def tied_module():
        module = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
        module[1].weight = module[0].weight
        return module

    module = tied_module()
    Checkpoint(tmp_path).save(
        module, torch.optim.AdamW(module.parameters()), {"step": 1, "epoch": 0, "batches_done_in_epoch": 1}
    )
    save_state_dict(module, tmp_path)
    for path in (tmp_path / "checkpoint" / "model.safetensors", tmp_path / "model.safetensors"):
        assert list(load_file(str(path))) == ["0.weight"]
    fresh = tied_module()
    Checkpoint(tmp_path).load(fresh, torch.optim.AdamW(fresh.parameters()), "cpu")
    assert torch.equal(fresh[1].weight, module[0].weight) and fresh[1].weight is fresh[0].weight


def test_corpus_streams_again_on_every_pass_with_a_limit_per_source(tmp_path, monkeypatch):
    from docembed.datasets import Corpus

    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "b.jsonl").write_text('{"id": 1, "body": "four"}\n{"id": 2, "body": "five"}\n')
    monkeypatch.setenv("DOCEMBED_DATA", str(tmp_path))
    corpus = Corpus([str(tmp_path / "a.txt"), "b.jsonl"], text_field="body", limit=2)
    assert list(corpus) == ["one", "two", "four", "five"]  # b.jsonl: a path under the data root
    assert list(corpus) == list(corpus) and not isinstance(iter(corpus), list)


def test_pad_sequences_and_packed_sequences():
    import numpy as np

    from docembed.tensors import PackedSequences, pad_sequences

    ids, mask = pad_sequences([[5, 6, 7], [], np.array([8])], pad_id=-1)
    assert ids.tolist() == [[5, 6, 7], [-1, -1, -1], [8, -1, -1]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0]] and ids.dtype == torch.long
    assert pad_sequences([[], []], pad_id=0)[0].shape == (2, 1)
    packed = PackedSequences.from_chunks([[[1, 2], [3]], [[], [4, 5, 6]]])
    assert len(packed) == 4 and packed.lengths.tolist() == [2, 1, 0, 3]
    assert [packed[i].tolist() for i in range(4)] == [[1, 2], [3], [], [4, 5, 6]]


def test_resuming_into_another_model_is_refused(tmp_path):
    from docembed.errors import CorruptModelError
    from docembed.training.loop import Checkpoint

    small, other = torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2))
    Checkpoint(tmp_path).save(
        small, torch.optim.AdamW(small.parameters()), {"step": 1, "epoch": 0, "batches_done_in_epoch": 1}
    )
    with pytest.raises(CorruptModelError, match="does not match"):
        Checkpoint(tmp_path).load(other, torch.optim.AdamW(other.parameters()), "cpu")


def test_decay_steps_cool_down_to_zero_and_can_start_from_a_constant_run(tmp_path):
    from docembed.errors import UsageError
    from docembed.training.loop import _lr_at

    config = TrainConfig(output_dir=str(tmp_path), lr=1.0, warmup_steps=2, max_steps=10, decay_steps=4)
    rates = [_lr_at(step, config) for step in range(10)]
    assert rates == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25]
    # Warmup-stable-decay: stopping a constant run and resuming it with --decay-steps is the same run as
    # one trained with that schedule from the start (the schedule depends on the step alone).
    straight = tmp_path / "straight"
    train(ToyRecipe(), TrainConfig(output_dir=str(straight), epochs=2, lr=0.05, max_steps=20, decay_steps=6))
    resumed = tmp_path / "resumed"
    train(ToyRecipe(), TrainConfig(output_dir=str(resumed), epochs=2, lr=0.05, max_steps=14))
    train(
        ToyRecipe(),
        TrainConfig(output_dir=str(resumed), epochs=2, lr=0.05, max_steps=20, decay_steps=6, resume=True),
    )
    constant = tmp_path / "constant"
    train(ToyRecipe(), TrainConfig(output_dir=str(constant), epochs=2, lr=0.05, max_steps=20))
    for key, value in weights(straight).items():
        assert torch.allclose(torch.tensor(value), torch.tensor(weights(resumed)[key]), atol=1e-6)
    assert any(
        not torch.allclose(torch.tensor(value), torch.tensor(weights(constant)[key]))
        for key, value in weights(straight).items()
    )
    log = [json.loads(line) for line in (straight / "train_log.jsonl").read_text().splitlines()]
    logged = [entry["lr"] for entry in log if entry["step"] in (10, 20)]
    assert logged == [0.05, pytest.approx(0.05 / 6, rel=1e-3)]
    with pytest.raises(UsageError, match="--max-steps"):
        TrainConfig(output_dir=str(tmp_path), decay_steps=4)
    with pytest.raises(UsageError, match="at most --max-steps"):
        TrainConfig(output_dir=str(tmp_path), max_steps=3, decay_steps=4)

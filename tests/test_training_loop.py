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


def test_loss_goes_down_and_log_is_written(tmp_path):
    summary = train(ToyRecipe(), TrainConfig(output_dir=str(tmp_path), epochs=3, lr=0.05, log_every=2))
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert summary["steps"] == 36 and log[-1]["loss"] < log[0]["loss"] / 10
    assert {"mse", "rows/s", "step", "epoch"} <= set(log[0])
    assert (tmp_path / "checkpoint" / "model.safetensors").exists() and (tmp_path / "weights.json").exists()


def test_resume_continues_exactly(tmp_path):
    straight = tmp_path / "straight"
    train(ToyRecipe(), TrainConfig(output_dir=str(straight), epochs=2, lr=0.05))
    resumed = tmp_path / "resumed"
    train(ToyRecipe(), TrainConfig(output_dir=str(resumed), epochs=2, lr=0.05, max_steps=17))
    train(ToyRecipe(), TrainConfig(output_dir=str(resumed), epochs=2, lr=0.05, resume=True))
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

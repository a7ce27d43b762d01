"""The one training loop every recipe runs through: plain PyTorch, readable top to bottom.

The same code runs on one device and under `torchrun --nproc_per_node N`:
- DDP is set up from RANK / WORLD_SIZE / LOCAL_RANK (gloo on CPU, nccl on GPU).
- A recipe yields the *global* sequence of batches for an epoch, identical on every rank (it is seeded
  by seed + epoch); rank r trains on batches r, r + N, r + 2N, ... So each method's batching rules
  (QuickThoughts' runs of consecutive sentences, length buckets) hold under DDP unchanged, and "the batch"
  that a batch-dependent loss sees (Soft CCA's batch statistics, uniformity, in-batch negatives) is the
  per-rank batch; an optimizer step consumes N global batches. A last group of fewer than N batches is
  dropped (every rank takes the same number of steps), and a time budget stops all ranks together.
- The checkpoint records how many global batches of the current epoch are done, so a run can resume
  with a different number of ranks.
- Only rank 0 writes checkpoints, the log and the final model; logged losses are averaged over ranks.
- Validation (nanoGPT's eval_interval, sentence-transformers' load_best_model_at_end): given a `validate`
  hook, every `eval_every` steps and at the end rank 0 scores the module (eval mode, no_grad) while the
  other ranks wait; the best-scoring weights are kept in `<output_dir>/best/`, and the recipe saves them
  at the end unless `save_last`.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from docembed.errors import CorruptModelError, DocembedError
from docembed.io.outputs import PRIVATE_SUFFIXES, follow_umask, swap_in_folder
from docembed.models.base import CONFIG_NAME, is_model_dir, load_untied_state, untied_state
from docembed.runtime import log, progress_bar, raise_if_interrupted, resolve_device, torchrun_rank


@dataclass
class TrainConfig:
    output_dir: str
    epochs: int = 1
    max_steps: int | None = None  # optimizer steps; stops early when reached
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_steps: int = 0
    decay_steps: int = 0  # linear decay to 0 over the last decay_steps before max_steps (needs max_steps)
    grad_accum: int = 1
    max_grad_norm: float | None = 1.0
    amp: str = "auto"  # auto (bf16/fp16 on CUDA, off on CPU) | off | bf16 | fp16
    log_every: int = 10
    save_every: int = 500  # optimizer steps between checkpoints (and one at the end of each epoch)
    resume: bool = False
    seed: int = 0
    device: str = "auto"
    time_budget_s: float | None = None  # stop (and save) after this many seconds of training
    eval_every: int = 0  # optimizer steps between validations (0: only at the end); needs a validate hook
    save_last: bool = False  # save the last weights, not the best-validated ones

    def __post_init__(self):
        # Checked here, not only in the CLI, so a bad setting from any caller is one clear line, not an
        # optimizer traceback (AdamW rejects lr < 0) or a run that silently trains nothing (lr = 0).
        from docembed.errors import UsageError

        def bad(flag: str, value, rule: str) -> UsageError:
            return UsageError(f"{flag} {value} is not valid: {rule}")

        if not (math.isfinite(self.lr) and 0 < self.lr < 1e3):
            raise bad("--lr", self.lr, "give a finite learning rate above 0 (e.g. 5e-5)")
        if self.time_budget_s is not None and not (
            math.isfinite(self.time_budget_s) and self.time_budget_s > 0
        ):
            raise bad("--time-budget", self.time_budget_s, "give a number of seconds above 0")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise bad("--weight-decay", self.weight_decay, "give a finite value of 0 or more")
        if self.max_grad_norm is not None and not (
            math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0
        ):
            raise bad(
                "--max-grad-norm", self.max_grad_norm, "give a finite norm of 0 or more (0: no clipping)"
            )
        for flag, value, least in (
            ("--epochs", self.epochs, 1),
            ("--grad-accum", self.grad_accum, 1),
            ("--log-every", self.log_every, 1),
            ("--save-every", self.save_every, 1),
            ("--warmup-steps", self.warmup_steps, 0),
            ("--decay-steps", self.decay_steps, 0),
            ("--eval-every", self.eval_every, 0),
        ):
            if value < least:
                raise bad(flag, value, f"give an integer of {least} or more")
        if self.max_steps is not None and self.max_steps < 1:
            raise bad("--max-steps", self.max_steps, "give an integer of 1 or more")
        if self.decay_steps and self.max_steps is None:
            raise bad("--decay-steps", self.decay_steps, "it counts back from --max-steps: give that too")
        if self.decay_steps and self.decay_steps > self.max_steps:
            raise bad("--decay-steps", self.decay_steps, f"give at most --max-steps ({self.max_steps})")


class Recipe(ABC):
    """What one training method contributes to the shared loop."""

    #: the unit counted for throughput, e.g. "tokens", "sentences", "docs"
    unit: str = "items"

    def __init__(self):
        self.module: nn.Module  # forward(batch) -> {"loss": tensor, other scalar terms...}

    @abstractmethod
    def batches(self, epoch: int) -> Iterable[Any]:
        """The global, deterministic sequence of batches for `epoch` (same on every rank)."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write the trained Encoder (config.json + model.safetensors) to `directory`."""

    def batch_units(self, batch: Any) -> int:
        """How many `unit`s a batch holds (for throughput)."""
        return len(batch)

    def to_device(self, batch: Any, device: str) -> Any:
        if isinstance(batch, torch.Tensor):
            if device.startswith("cuda") and batch.device.type == "cpu":
                # A page-locked copy lets the host-to-device copy run asynchronously (non_blocking).
                batch = batch.pin_memory()
            return batch.to(device, non_blocking=True)
        if isinstance(batch, dict):
            return {k: self.to_device(v, device) for k, v in batch.items()}
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.to_device(v, device) for v in batch)
        return batch

    def num_batches(self, epoch: int) -> int | None:
        """Optional: the number of global batches per epoch, for the progress bar."""
        return None

    def model_settings(self) -> dict | None:
        """The config of the model trained (kept with each checkpoint: a --resume must train the same model),
        less its inference-only settings. Found on the recipe's encoder or student, or its own config; None
        where there is none."""
        for holder in (getattr(self, "encoder", None), getattr(self, "student", None), self):
            config = getattr(holder, "config", None)
            if callable(getattr(config, "to_dict", None)):
                values = json.loads(json.dumps(config.to_dict(), default=str))  # as state.json reads back
                for name in getattr(config, "INFERENCE_SETTINGS", ()):
                    values.pop(name, None)
                return values
        return None


class Validate(Protocol):
    """The validation hook `train(..., validate=)` calls: metrics of the module being trained, on the device
    it trains on. `primary_metric` (default "score") names the one that chooses the best weights; higher is
    better. The loop calls it on rank 0 only, with the module in eval mode and under no_grad
    (docembed.evaluation.validation.Validation scores evaluation tasks)."""

    primary_metric: str

    def __call__(self, device: str) -> dict[str, float]: ...


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        rank, world_size = torchrun_rank()
        return cls(rank, world_size, int(os.environ.get("LOCAL_RANK", 0)))


def _setup_distributed(device: str) -> tuple[DistEnv, str]:
    env = DistEnv.from_environ()
    if env.world_size > 1:
        import torch.distributed as dist

        backend = "nccl" if device.startswith("cuda") else "gloo"
        if device.startswith("cuda"):
            device = f"cuda:{env.local_rank}"
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
    return env, device


def is_main_process() -> bool:
    """False on every torchrun rank but 0 (which alone writes models, logs and summaries)."""
    return DistEnv.from_environ().is_main


@contextmanager
def main_process_first(device: str = "cpu") -> Iterator[DistEnv]:
    """Run a block on rank 0 first and on the other ranks after it: work whose result lands on disk
    (a teacher's vectors in the cache, a PV teacher) is then done once, and the other ranks find it there.
    Starts the process group early when the command runs under torchrun; one process just runs the block."""
    env, _ = _setup_distributed(device)
    if env.world_size == 1:
        yield env
        return
    import torch.distributed as dist

    if not env.is_main:
        dist.barrier()
    yield env
    if env.is_main:
        dist.barrier()


def _autocast(device: str, amp: str):
    if amp == "off" or not device.startswith("cuda"):
        return nullcontext(), None
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    if amp == "auto" and not torch.cuda.is_bf16_supported():
        dtype = torch.float16
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
    return torch.autocast("cuda", dtype=dtype), scaler


def _lr_at(step: int, config: TrainConfig) -> float:
    """Warm-up, constant, then (with decay_steps) a linear decay whose last step trains at lr / decay_steps.

    The schedule is a function of the step alone, so a constant-LR run resumed with a larger --max-steps
    and --decay-steps cools down from where it stopped (warmup-stable-decay, Hu et al. 2024, MiniCPM)."""
    lr = config.lr
    if config.warmup_steps and step < config.warmup_steps:
        lr = lr * (step + 1) / config.warmup_steps
    if config.decay_steps:
        left = config.max_steps - step  # steps still to take, this one included
        lr = min(lr, config.lr * left / config.decay_steps)
    return lr


def _reduce_mean(values: dict[str, float], env: DistEnv, device: str) -> dict[str, float]:
    if env.world_size == 1 or not values:
        return values
    import torch.distributed as dist

    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return {k: float(v) / env.world_size for k, v in zip(keys, tensor.tolist(), strict=True)}


def _restore_swapped_away(folder: Path) -> None:
    """A kill between the two renames of `swap_in_folder` leaves the previous folder as `.NAME.oldPID`
    and none at NAME: put it back."""
    if folder.exists():
        return
    for old in sorted(folder.parent.glob(f".{folder.name}.old*")):
        try:
            os.rename(old, folder)
            return
        except OSError:  # another rank put it back first
            continue


class Checkpoint:
    """`<output_dir>/checkpoint/`: module weights (safetensors), optimizer state, loop position. Written to
    `checkpoint.tmp/` and swapped in whole: a kill or a full disk at any moment leaves the last one."""

    def __init__(self, output_dir: Path, settings: dict | None = None):
        self.dir = output_dir / "checkpoint"
        self.settings = settings  # the model's config, kept in state.json

    def exists(self) -> bool:
        _restore_swapped_away(self.dir)
        return (self.dir / "state.json").exists()

    def check_settings(self) -> None:
        """A --resume with other model settings than the checkpoint's would continue another model's weights
        (or fail on sizes) and save a config claiming the new settings: refused, naming the first one."""
        from docembed.errors import UsageError

        try:
            recorded = json.loads((self.dir / "state.json").read_text()).get("settings")
        except (OSError, ValueError, AttributeError):
            return  # Checkpoint.load says what is wrong with it
        if not isinstance(recorded, dict) or self.settings is None:
            return  # a checkpoint written before settings were kept
        for key in sorted(self.settings):  # a recorded key this run leaves out is an inference-only one
            if recorded.get(key) != self.settings.get(key):
                raise UsageError(
                    f"--resume: {self.dir} was trained with {key}: {recorded.get(key)!r}, this run has "
                    f"{key}: {self.settings.get(key)!r}; give the checkpoint's settings or train afresh"
                )

    def save(self, module: nn.Module, optimizer, state: dict) -> None:
        from safetensors.torch import save_file

        tmp = self.dir.with_name("checkpoint.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(untied_state(module), str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        # the random state the next step draws its dropout from: a resumed run draws what an uninterrupted
        # one would have (rank 0's; the other ranks of a DDP run are seeded afresh)
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        torch.save({"cpu": torch.get_rng_state(), "cuda": cuda}, tmp / "rng.pt")
        record = state if self.settings is None else {**state, "settings": self.settings}
        (tmp / "state.json").write_text(json.dumps(record, indent=2))
        swap_in_folder(tmp, self.dir)

    def load(self, module: nn.Module, optimizer, device: str, restore_rng: bool = True) -> dict:
        """The loop position, after loading the weights and optimiser state into `module` and `optimizer`,
        and with `restore_rng` the random state saved with them (a checkpoint written before it was kept:
        the seed's). A checkpoint of another model (sizes differ) or a damaged one is a CorruptModelError
        naming it."""
        import pickle

        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            position = json.loads((self.dir / "state.json").read_text())
            if not isinstance(position, dict) or not all(isinstance(position.get(k), int) for k in POSITION):
                raise ValueError(f"state.json lacks {', '.join(POSITION)}")
            state = load_file(str(self.dir / "model.safetensors"), device=device)
            load_untied_state(module, state, f"{self.dir} does not match this run's model")
            optimizer.load_state_dict(
                torch.load(self.dir / "optimizer.pt", map_location=device, weights_only=True)
            )
            if restore_rng and (self.dir / "rng.pt").exists():
                rng = torch.load(self.dir / "rng.pt", weights_only=True)
                torch.set_rng_state(rng["cpu"])
                if (
                    rng["cuda"]
                    and torch.cuda.is_available()
                    and len(rng["cuda"]) == torch.cuda.device_count()
                ):
                    torch.cuda.set_rng_state_all(rng["cuda"])
        except (
            OSError,
            ValueError,
            KeyError,
            TypeError,
            RuntimeError,
            EOFError,
            pickle.UnpicklingError,
            SafetensorError,
            CorruptModelError,  # load_untied_state: the state of another model size
        ) as error:  # a truncated file, or the state of another model size (RuntimeError: size mismatch)
            raise CorruptModelError(
                f"cannot resume from {self.dir}: {_first_reason(error)}; "
                "train afresh without --resume, or into another --output"
            ) from None
        return position


# What state.json records of the loop's position.
POSITION = ("step", "epoch", "batches_done_in_epoch")


def _first_reason(error: Exception) -> str:
    """One line of what went wrong: torch lists every mismatched tensor; the first says enough."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    mismatch = [line for line in lines if line.startswith("size mismatch")]
    reason = (mismatch or lines or [type(error).__name__])[0]
    return reason[:300]


class BestWeights:
    """`<output_dir>/best/`: the module weights that validated best (safetensors) and `state.json`
    {"step", "metric", "score", "eval"}; a resumed run reads the record, so a better earlier best survives."""

    def __init__(self, output_dir: Path):
        self.dir = output_dir / "best"

    def record(self) -> dict | None:
        _restore_swapped_away(self.dir)
        path = self.dir / "state.json"
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise CorruptModelError(f"cannot read {path}: {_first_reason(error)}") from None
        if not isinstance(record, dict) or not {"step", "metric", "score"} <= record.keys():
            raise CorruptModelError(f"{path} is not a record of the best weights (step, metric, score)")
        return record

    def save(self, module: nn.Module, record: dict) -> None:
        from safetensors.torch import save_file

        tmp = self.dir.with_name("best.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(untied_state(module), str(tmp / "model.safetensors"))
        (tmp / "state.json").write_text(json.dumps(record, indent=2))
        swap_in_folder(tmp, self.dir)

    def load(self, module: nn.Module, device: str) -> None:
        from safetensors.torch import load_file

        state = load_file(str(self.dir / "model.safetensors"), device=device)
        load_untied_state(module, state, f"{self.dir} does not match this run's model")

    def clear(self) -> None:
        """Forget a best of an earlier run (a fresh run in the same folder must not compare with it)."""
        if self.dir.exists():
            for name in ("model.safetensors", "state.json"):
                (self.dir / name).unlink(missing_ok=True)
            self.dir.rmdir()


def _previous_last(output_dir: Path) -> dict:
    """The last logged losses of the run a resume continues (its train_summary.json), {} without one."""
    try:
        last = json.loads((output_dir / "train_summary.json").read_text()).get("last")
    except (OSError, ValueError, AttributeError):
        return {}
    return last if isinstance(last, dict) else {}


def train(recipe: Recipe, config: TrainConfig, validate: Validate | None = None) -> dict[str, Any]:
    """Run `recipe` to completion; returns a summary (steps, seconds, throughput, last losses, and with
    `validate` the best validation step and score).

    `validate` (see `Validate`) runs every `config.eval_every` optimizer steps and after the last one; the
    recipe then saves the best-validated weights, or the last with `config.save_last`."""
    if config.eval_every and validate is None:
        from docembed.errors import UsageError

        raise UsageError("--eval-every needs something to validate on: give --eval-task too")
    device = resolve_device(config.device)
    env, device = _setup_distributed(device)
    torch.manual_seed(config.seed + env.rank)
    output_dir = Path(config.output_dir)
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)

    module = recipe.module.to(device)
    model: nn.Module = module
    if env.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(device).index] if device.startswith("cuda") else None
        model = DistributedDataParallel(module, device_ids=ids, find_unused_parameters=True)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    autocast, scaler = _autocast(device, config.amp)

    checkpoint = Checkpoint(output_dir, recipe.model_settings())
    step, epoch, done_in_epoch = 0, 0, 0
    resumed = config.resume and checkpoint.exists()
    if resumed:
        checkpoint.check_settings()
        state = checkpoint.load(module, optimizer, device, restore_rng=env.world_size == 1)
        step, epoch, done_in_epoch = state["step"], state["epoch"], state["batches_done_in_epoch"]
        if epoch >= config.epochs or (config.max_steps is not None and step >= config.max_steps):
            # a finished run resumed (a script that always passes --resume): nothing trains, nothing is lost
            limits = f"--epochs {config.epochs}" + (
                f", --max-steps {config.max_steps}" if config.max_steps else ""
            )
            log(f"{checkpoint.dir} is at step {step}, epoch {epoch}: nothing left to train with {limits}")
        log(f"resumed from {checkpoint.dir}: step {step}, epoch {epoch}, batch {done_in_epoch}")
    elif config.resume:
        log(f"nothing to resume in {output_dir} (no checkpoint): training from step 0")

    log_path = output_dir / "train_log.jsonl"
    best_weights = BestWeights(output_dir)
    best = None  # the best validation record so far (rank 0)
    evaluated_at = -1  # the step last validated
    if env.is_main:
        # Lines logged after the checkpoint we start from describe steps that will be trained again.
        _truncate_log(log_path, after_step=step)
        if not resumed:
            best_weights.clear()
        elif validate is not None:
            # Kept even when recorded after the checkpoint: those weights were trained and scored.
            best = best_weights.record()
            evaluated_at = _last_validated_step(log_path)
            if best is not None:
                log(f"best so far: {best['metric']} {best['score']:.4g} at step {best['step']}")
    primary = getattr(validate, "primary_metric", "score")
    eval_seconds = 0.0

    def run_validation() -> float:
        """Validate at `step` on rank 0 (the others wait); keep the weights if best. Returns the seconds."""
        nonlocal best, evaluated_at
        began = time.perf_counter()
        if env.is_main:
            best, line = _validate(validate, module, device, step, primary, best, best_weights)
            _append_log(log_path, line)
        if env.world_size > 1:
            import torch.distributed as dist

            dist.barrier()
        evaluated_at = step
        return time.perf_counter() - began

    started = time.perf_counter()
    units_total = 0
    last: dict[str, float] = {}
    stop = bool(config.max_steps) and step >= config.max_steps  # resumed at --max-steps: no step more
    position = {"step": step, "epoch": epoch, "batches_done_in_epoch": done_in_epoch}
    module.train()
    try:
        with progress_bar(f"train {type(recipe).__name__}", total=config.max_steps) as bar:
            while epoch < config.epochs and not stop:
                window = {"units": 0, "t0": time.perf_counter(), "sums": {}, "n": 0}
                micro = 0
                for group_end, batch in _own_batches(recipe.batches(epoch), done_in_epoch, env):
                    raise_if_interrupted()
                    batch = recipe.to_device(batch, device)
                    # Skip the gradient all-reduce on accumulation micro-steps (no_sync), as DDP intends.
                    sync = (micro + 1) % config.grad_accum == 0
                    ctx = model.no_sync() if env.world_size > 1 and not sync else nullcontext()
                    with ctx, autocast:
                        terms = model(batch)
                        loss = terms["loss"] / config.grad_accum
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"loss is {loss.item()} at step {step}; lower the lr")
                    (scaler.scale(loss) if scaler else loss).backward()
                    micro += 1
                    units = recipe.batch_units(batch)
                    window["units"] += units
                    units_total += units
                    for k, v in terms.items():
                        window["sums"][k] = window["sums"].get(k, 0.0) + float(v.detach())
                    window["n"] += 1
                    if not sync:
                        continue
                    window["lr"] = _lr_at(step, config)
                    for group in optimizer.param_groups:
                        group["lr"] = window["lr"]
                    if scaler:
                        scaler.unscale_(optimizer)
                    if config.max_grad_norm:
                        nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                    if scaler:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    step += 1
                    bar.advance()
                    position = {"step": step, "epoch": epoch, "batches_done_in_epoch": group_end + 1}
                    if step % config.log_every == 0:
                        last = _log_window(window, env, device, position, recipe.unit, log_path, bar)
                    if validate is not None and config.eval_every and step % config.eval_every == 0:
                        spent = run_validation()
                        eval_seconds += spent
                        window["t0"] += spent  # throughput counts training time only
                    if env.is_main and step % config.save_every == 0:
                        checkpoint.save(module, optimizer, position)
                    out_of_time = bool(config.time_budget_s) and _any_rank(
                        time.perf_counter() - started > config.time_budget_s, env, device
                    )
                    if (config.max_steps and step >= config.max_steps) or out_of_time:
                        stop = True
                        break
                if window["n"]:
                    last = _log_window(window, env, device, position, recipe.unit, log_path, bar) or last
                if not stop:
                    epoch, done_in_epoch = epoch + 1, 0
                    position = {"step": step, "epoch": epoch, "batches_done_in_epoch": 0}
                if env.is_main:
                    checkpoint.save(module, optimizer, position)

    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM: keep what was trained. `position` (the last completed optimizer step) is
        # consistent: partly accumulated gradients are dropped, and a resumed run redoes those batches.
        if env.is_main and position["step"] > 0:
            checkpoint.save(module, optimizer, position)
            log(f"interrupted: checkpoint at step {position['step']} saved; continue with --resume")
        raise

    if validate is not None and _rank0_decides(evaluated_at != step, env, device):
        eval_seconds += run_validation()
    seconds = time.perf_counter() - started
    units_all = _reduce_mean({"u": float(units_total)}, env, device)["u"] * env.world_size
    summary = {
        "steps": step,
        "epochs_completed": epoch,
        "seconds": round(seconds, 2),
        f"{recipe.unit}_per_s": round(units_all / max(seconds - eval_seconds, 1e-9), 1),
        "world_size": env.world_size,
        "device": device,
        "last": last or (_previous_last(output_dir) if resumed else {}),  # a resume that trained nothing
        "config": asdict(config),
    }
    if validate is not None:
        summary["validation_seconds"] = round(eval_seconds, 2)
        summary["best"], summary["saved"] = _restore_best(
            module, config, env, device, step, best, best_weights
        )
    if env.is_main:
        module.eval()
        save_trained_model(recipe, output_dir)
        (output_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    if env.world_size > 1:
        import torch.distributed as dist

        dist.barrier()
        # Tear down in this order, with gloo's worker threads idle: the last reference to the process group
        # (the DDP reducer's, or the registry's) joins those threads while holding the GIL, and a worker
        # still freeing a finished collective's tensors waits for the GIL: a deadlock, seen under load on
        # the second rank. Dropping DDP first and sleeping (GIL released) lets the workers finish.
        del model
        gc.collect()
        time.sleep(0.2)
        dist.destroy_process_group()
    return summary


def save_trained_model(recipe: Recipe, output_dir: Path) -> None:
    """The recipe's model files all or nothing: saved into a staging folder inside the run, then moved in
    with the old config.json (what makes the folder a saved model) removed first and the new one put last.
    A subfolder of the previous save is replaced only when the run folder holds a saved model."""
    import shutil

    staging = output_dir / f".model.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # ours: named after this process
    staging.mkdir()
    try:
        recipe.save(staging)
        names = sorted((p.name for p in staging.iterdir()), key=lambda name: name == CONFIG_NAME)
        clashes = [n for n in names if (staging / n).is_dir() and (output_dir / n).exists()]
        if clashes and not is_model_dir(output_dir):
            from docembed.errors import DocembedError

            raise DocembedError(
                f"cannot save the model: {output_dir / clashes[0]} exists and is not part of a saved model"
            )
        (output_dir / CONFIG_NAME).unlink(missing_ok=True)
        for name in names:
            if (staging / name).is_dir():
                swap_in_folder(staging / name, output_dir / name)
            else:
                if name.endswith(PRIVATE_SUFFIXES):  # safetensors writes 0600: the umask decides
                    follow_umask(staging / name)
                os.replace(staging / name, output_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _own_batches(batches: Iterable[Any], done: int, env: DistEnv) -> Iterator[tuple[int, Any]]:
    """This rank's share of an epoch's global batches, from global index `done` on, as (index of the last
    batch of its group, batch). The batches after `done` form groups of `world_size`; rank r takes the r-th
    of each group. A trailing group of fewer than `world_size` batches is dropped on every rank: all ranks
    then take the same number of steps (a rank with one step more would wait forever in the gradient
    all-reduce). Groups start at `done`, so a run resumed with another number of ranks stays in step."""
    n = env.world_size
    mine = None
    for index, batch in enumerate(batches):
        if index < done:
            continue
        slot = (index - done) % n
        if slot == env.rank:
            mine = batch
        if slot == n - 1:
            yield index, mine
            mine = None


def _any_rank(flag: bool, env: DistEnv, device: str) -> bool:
    """True on every rank when `flag` is true on any: a decision to stop must be the same everywhere."""
    if env.world_size == 1:
        return flag
    import torch.distributed as dist

    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def _log_window(window, env, device, position, unit, log_path: Path, bar) -> dict[str, float]:
    n = max(window["n"], 1)
    means = {k: v / n for k, v in window["sums"].items()}
    elapsed = max(time.perf_counter() - window["t0"], 1e-9)
    means[f"{unit}/s"] = window["units"] * env.world_size / elapsed
    means = _reduce_mean(means, env, device)
    if env.is_main:
        bar.update(**{k: v for k, v in means.items()})
        with open(log_path, "a", encoding="utf-8") as handle:
            line = {**position, **{k: round(v, 6) for k, v in means.items()}}
            if "lr" in window:  # the rate of the last optimizer step taken
                line["lr"] = float(f"{window['lr']:.4g}")
            handle.write(json.dumps(line) + "\n")
    window.update(units=0, t0=time.perf_counter(), sums={}, n=0)
    return {k: v for k, v in means.items() if math.isfinite(v)}


def _validate(validate, module, device, step, primary, best, best_weights) -> tuple[dict, dict]:
    """Score the module at `step`; save its weights when they beat `best`. Returns (best, log line)."""
    module.eval()
    # The hook's random draws (if any) must not change the training run that follows.
    cuda = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=cuda), torch.no_grad():
        metrics = {k: float(v) for k, v in validate(device).items()}
    module.train()
    if primary not in metrics:
        raise KeyError(f"the validation hook returned no {primary!r} (it returned {sorted(metrics)})")
    if best is not None and sorted(best["eval"]) != sorted(metrics):
        log(f"the best so far was scored on {sorted(best['eval'])}: keeping a new best from here")
        best = None
    score = metrics[primary]
    improved = best is None or score > best["score"]
    if improved:
        best = {"step": step, "metric": primary, "score": score, "eval": metrics}
        best_weights.save(module, best)
    others = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k != primary)
    log(
        f"validation at step {step}: {primary} {score:.4g}"
        + (f"  ({others})" if others else "")
        + ("  new best" if improved else f"  (best {best['score']:.4g} at step {best['step']})")
    )
    return best, {"step": step, "eval": {k: round(v, 6) for k, v in metrics.items()}, "best": improved}


def _restore_best(module, config, env, device, step, best, best_weights) -> tuple[dict | None, str]:
    """Load the best-validated weights into the module for the recipe to save (on every rank), unless
    `save_last`. Returns (the best record, "best" or "last": which weights the recipe saves)."""
    saved = "last" if config.save_last else "best"
    load = False
    record = None
    if env.is_main and best is not None:
        record = {k: best[k] for k in ("step", "metric", "score")}
        found = f"{best['metric']} {best['score']:.4g} at step {best['step']}"
        if best["step"] == step:
            log(f"saving the weights of the last step, the best-validated ({found})")
        elif config.save_last:
            log(
                f"saving the last weights (step {step}); the best-validated ({found}) are in "
                f"{best_weights.dir}"
            )
        else:
            log(f"saving the best-validated weights ({found}, of {step} steps); --save-last keeps the last")
            best_weights.load(module, device)
            load = True
    if env.world_size > 1 and _rank0_decides(load, env, device):  # every rank returns the same model
        import torch.distributed as dist

        for tensor in module.state_dict().values():
            dist.broadcast(tensor, 0)
    return record, saved


def _rank0_decides(flag: bool, env: DistEnv, device: str) -> bool:
    """Rank 0's `flag` on every rank (a decision that leads into collectives must be the same everywhere)."""
    if env.world_size == 1:
        return flag
    import torch.distributed as dist

    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(tensor, 0)
    return bool(tensor.item())


def _append_log(log_path: Path, line: dict) -> None:
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def _read_log(log_path: Path) -> list[tuple[str, dict]]:
    """(line, record) for each line of train_log.jsonl. A last line cut short (the run was killed while
    writing it) is dropped with a warning; any other line that is not a JSON object is a DocembedError."""
    text = log_path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if isinstance(record, dict) and isinstance(record.get("step", 0), int):
            records.append((line, record))
        elif number == len(lines) and not line.endswith("\n"):
            log(f"warning: {log_path}: dropping its last line, cut short by an interrupted write")
        else:
            raise DocembedError(
                f"{log_path}:{number}: not a log line of docembed (a JSON object with an integer step); "
                "remove the line to resume"
            )
    return records


def _last_validated_step(log_path: Path) -> int:
    """The step of the last validation line in the log (-1: none): a resumed run that ends where it
    started does not validate the same weights twice."""
    if not log_path.exists():
        return -1
    records = (record for _, record in _read_log(log_path))
    return max((record.get("step", -1) for record in records if "eval" in record), default=-1)


def _truncate_log(log_path: Path, after_step: int) -> None:
    """Drop log lines of steps after `after_step`: a run that stopped before checkpointing them wrote them
    (and a last line cut short by a kill)."""
    if not log_path.exists():
        return
    lines = log_path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line, record in _read_log(log_path) if record.get("step", 0) <= after_step]
    if len(kept) != len(lines):
        tmp = log_path.with_name(log_path.name + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(log_path)

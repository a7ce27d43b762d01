"""The corpus-fitted families, fitted from Python: one fit function per family, and the table behind
`docembed encode --fit`.

A corpus-fitted family ships no weights: its model is fitted on the user's own corpus. Each family has one
fit function taking the corpus (re-iterable texts; PV also takes Documents, whose ids become its tags) and
its settings; it returns the fitted Encoder and, given `output`, saves it there:

    pv      docembed.models.paragraph_vector.fit_pv   gensim's own trainer
    tfidf   docembed.models.baselines.fit_tfidf
    bm25    docembed.models.baselines.fit_bm25
    setenc  fit_setenc (below)                       the shared training loop, so it lives in training/

The commands (`train-pv`, `fit tfidf|bm25`, `train-setenc`) parse options and call these. `FIT_FUNCTIONS`
maps each family name to a function fitting it with its command's default settings, which `encode --fit`
calls; `docembed.models.registry.FIT_COMMANDS` holds the command a user is told to run (messages only).

Nothing heavy is imported at import time: `train-setenc` declares its defaults from this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from docembed.models.setenc import SetEncoder, SetEncoderConfig
    from docembed.training.loop import TrainConfig

# train-setenc's loop settings. AdamW with weight decay 0.1 and 10 epochs: without decay, on 20 Newsgroups
# 28 epochs fitted the training posts' halves (train align 0.22, test 1.10) and retrieved worse than 5
# (MAP@100 20.5 vs 26.5); decay (which also shrinks the vectors of words never seen in training) made 10
# epochs better than 5 (34.2 vs 32.2 at t = 2). AMP off: the runs above were made in float32.
SETENC_LOOP: dict[str, Any] = {
    "epochs": 10,
    "lr": 2e-2,
    "weight_decay": 0.1,
    "warmup_steps": 50,
    "amp": "off",
}

# train-setenc's attention. SetEncoderConfig's default stays softmax: configs saved before the option
# existed were softmax models.
SETENC_ATTENTION = "kernel"


@dataclass
class SetEncoderTraining:
    """The set encoder's objective settings (the model's are SetEncoderConfig's, the loop's TrainConfig's).

    t = 2 was selected on a validation split of 20NG *train* (bench/sweep_setenc.py, 90/10, seed 0): MAP@100
    24.5, kNN 64.3 against 15.7, 59.9 at t = 3; against 12 wider, longer or larger-hash variants (three
    seeds for five of them) nothing was better by more than one standard error, so these remain the defaults
    (bench/results/setenc/sweep_validation.md)."""

    batch_size: int = 256  # documents per step (per rank)
    temperature: float = 2.0  # uniformity temperature t in log mean exp(-t ||u - v||^2)
    align_weight: float = 1.0
    uniform_weight: float = 1.0
    max_train_tokens: int | None = 1024  # tokens per document before the split (a random subset)


def setenc_loop(output_dir: str | Path = "", seed: int = 0, device: str = "auto", **changes) -> TrainConfig:
    """train-setenc's TrainConfig: the loop's defaults, SETENC_LOOP, then `changes`."""
    from docembed.training.loop import TrainConfig

    return TrainConfig(output_dir=str(output_dir), seed=seed, device=device, **{**SETENC_LOOP, **changes})


def fit_setenc(
    corpus: Iterable[str],
    config: SetEncoderConfig | None = None,
    output: str | Path | None = None,
    training: SetEncoderTraining | None = None,
    loop: TrainConfig | None = None,
    validation: Callable | None = None,
) -> SetEncoder:
    """Train a set encoder on `corpus` (texts, read once) and return it.

    `config`: the SetEncoderConfig (default: train-setenc's); `training`: the objective's settings; `loop`:
    the TrainConfig (default `setenc_loop()`; its seed seeds the run). The run writes to `output` (model,
    train_log.jsonl, checkpoint; `loop.output_dir` is replaced by it), or, without one, to a temporary
    directory removed afterwards. `validation(encoder)`, if given, returns the loop's validation hook for the
    encoder being trained. Under torchrun every rank returns its copy; rank 0 alone writes."""
    import tempfile
    from contextlib import nullcontext

    from docembed.errors import UsageError
    from docembed.models.setenc import SetEncoderConfig
    from docembed.runtime import log, seed_everything
    from docembed.training.loop import is_main_process, train
    from docembed.training.setenc_recipe import SetEncoderRecipe

    config = config or SetEncoderConfig(attention=SETENC_ATTENTION)
    training = training or SetEncoderTraining()
    loop = loop or setenc_loop()
    seed_everything(loop.seed)  # everything the run draws, whoever calls
    place = nullcontext(output) if output is not None else tempfile.TemporaryDirectory(prefix="setenc-")
    with place as directory:
        loop = dataclasses.replace(loop, output_dir=str(directory))
        try:
            recipe = SetEncoderRecipe(
                corpus,
                config,
                batch_size=training.batch_size,
                t=training.temperature,
                align_weight=training.align_weight,
                uniform_weight=training.uniform_weight,
                max_train_tokens=training.max_train_tokens,
                seed=loop.seed,
            )
        except ValueError as error:  # too few documents, a batch of one: the caller's settings
            raise UsageError(str(error)) from None
        hooks = {} if validation is None else {"validate": validation(recipe.encoder)}
        summary = train(recipe, loop, **hooks)
    if is_main_process():  # rank 0 alone reports under torchrun
        last = summary.get("last", {})
        align, uniform = last.get("align", float("nan")), last.get("uniform", float("nan"))
        log(
            f"trained {summary['steps']} steps in {summary['seconds']:.0f}s"
            f" ({summary.get('docs_per_s', 0)} docs/s); align {align:.3f}, uniform {uniform:.3f}"
        )
    return recipe.encoder


# --- the table: each family fitted with its command's defaults (encode --fit) -------------------------------
def _texts(corpus: Iterable) -> Iterable[str]:
    return (doc if isinstance(doc, str) else doc.text for doc in corpus)


def _fit_pv(corpus, output, seed: int, device: str):
    from docembed.models.paragraph_vector import PVConfig, fit_pv

    return fit_pv(corpus, PVConfig(seed=seed), output)


def _fit_setenc(corpus, output, seed: int, device: str):
    return fit_setenc(_texts(corpus), output=output, loop=setenc_loop(seed=seed, device=device))


def _fit_tfidf(corpus, output, seed: int, device: str):
    from docembed.models.baselines import TfidfConfig, fit_tfidf

    return fit_tfidf(_texts(corpus), TfidfConfig(seed=seed), output)


def _fit_tfidf_bigrams(corpus, output, seed: int, device: str):
    from docembed.models.baselines import TfidfConfig, fit_tfidf

    return fit_tfidf(_texts(corpus), TfidfConfig(ngram_max=2, seed=seed), output)


def _fit_bm25(corpus, output, seed: int, device: str):
    from docembed.models.baselines import fit_bm25

    return fit_bm25(_texts(corpus), None, output)


#: family -> fit(corpus, output, seed, device) with the family's default settings
FIT_FUNCTIONS: dict[str, Callable] = {
    "pv": _fit_pv,
    "setenc": _fit_setenc,
    "tfidf": _fit_tfidf,
    "tfidf-bigrams": _fit_tfidf_bigrams,
    "bm25": _fit_bm25,
}


def fit_family(
    name: str, corpus: Iterable, output: str | Path | None = None, seed: int = 0, device: str = "auto"
):
    """Fit corpus-fitted family `name` on `corpus` (re-iterable texts or Documents) with its default settings,
    saving it to `output` if given (all or nothing; an existing folder there is replaced only if it is a
    docembed model, see io/outputs.py); returns the fitted Encoder."""
    from docembed.errors import UsageError
    from docembed.io.outputs import directory_output
    from docembed.models.base import MODEL_DIRECTORY

    if name not in FIT_FUNCTIONS:
        raise UsageError(
            f"only the corpus-fitted families ({', '.join(FIT_FUNCTIONS)}) are fitted, not {name!r}"
        )
    if output is None:
        return FIT_FUNCTIONS[name](corpus, None, seed, device)
    from docembed.runtime import log

    with directory_output(output, MODEL_DIRECTORY, overwrite=True) as staging:
        model = FIT_FUNCTIONS[name](corpus, staging, seed, device)
    log(f"saved the fitted {name} model -> {output}")
    return model
